"""Benchmark: how many round-3 and round-4 input tokens artifact filtering saves, on generated debates.

Each debate is generated deterministically (seeded RNG): 3-5 agents with full round-1 positions, a synthesis with
4-8 consensus points and 2-6 tensions, a cross-examination with 5-15 challenges and 5-15 rebuttals, all in
realistic sentence lengths and all schema-valid. For each debate we count, with the real tokenizer
(``conclave.tokens.count_tokens``) and the JSON exactly as the engine shows it (labels, no header fields):

- round 3: every agent receives its own round-1 artifact and the synthesis (filtered with ``filtering.round3``);
- round 4: the judge receives every round-1 artifact, the synthesis and the cross-examination (``filtering.round4``).

Round-1 artifacts are never filtered; they are counted in the "whole" columns and left out of the "filtered
part" columns. The round-3 judge (which sees the unfiltered synthesis and the replies) and the prompt templates
are the same with and without filtering and are not counted. Every filtered artifact is schema-validated.

    python bench/filtering.py [--debates 60] [--seed 2026] [--model gpt-4o] [--per-debate]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from conclave_plugins.filters import TopNArtifactFilter

from conclave.artifact_filter import limits_for
from conclave.artifacts import check, validate
from conclave.config import Round3Filter, Round4Filter
from conclave.engine.labels import JudgeLabels
from conclave.engine.session import prompt_json
from conclave.tokens import count_tokens, tokenizer_backend

AGENT_POOL = ["security", "architect", "pragmatist", "performance", "skeptic", "testing", "devops"]

QUESTIONS = [
    "Should we move billing to event sourcing?",
    "Should the mobile app adopt a local-first sync model?",
    "Is it time to split the monolith's reporting module into its own service?",
    "Should we replace our hand-rolled feature flags with a managed service?",
    "Should search move from Postgres full-text to a dedicated engine?",
    "Do we standardise on gRPC for internal service calls?",
]

SUBJECTS = [
    "the billing service", "the event store", "our team of four", "the projection layer", "the migration plan",
    "this approach", "the current schema", "an outbox table", "the read model", "the API gateway",
    "the on-call rotation", "the nightly batch job", "the reporting queries", "a managed queue",
    "the audit trail", "the staging environment", "the existing ORM layer", "the proposed rollout",
]
VERBS = [
    "reduces", "increases", "complicates", "simplifies", "depends on", "protects", "exposes", "delays",
    "requires", "duplicates", "hides", "shortens", "bounds", "undermines", "improves", "changes",
]
OBJECTS = [
    "operational risk", "audit coverage", "query latency", "the release schedule", "data consistency",
    "incident response time", "storage costs", "schema evolution", "the blast radius of a bad deploy",
    "developer onboarding", "regulatory exposure", "throughput at peak", "the cost of rollbacks",
    "test coverage of edge cases", "the number of moving parts", "vendor lock-in",
]
QUALIFIERS = [
    "in the first quarter", "under peak load", "for enterprise customers", "without a dedicated platform team",
    "once replays exceed a million events", "when regulators ask for history", "during the migration window",
    "for every new aggregate", "if we keep the current staffing", "across three regions",
    "for the next two releases", "compared with the current design",
]
CONNECTORS = ["because", "although", "so", "while", "unless", "which means"]
SEVERE = ["a critical", "a major", "a serious", "a fatal", "a dangerous", "an incorrect", "a flawed", "a broken"]
SUBSTANTIVE = ["the data shows", "our research indicates", "the load test demonstrates", "the incident log confirms",
               "evidence from the pilot suggests", "the benchmark shows"]
PRIORITIES = ["auditability", "delivery risk", "operational cost", "team familiarity", "latency", "compliance",
              "reversibility", "developer experience", "data integrity", "time to market"]


class TextGen:
    """Plausible technical English from phrase pools: realistic words per sentence and tokens per word."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def clause(self) -> str:
        r = self.rng
        text = f"{r.choice(SUBJECTS)} {r.choice(VERBS)} {r.choice(OBJECTS)}"
        if r.random() < 0.6:
            text += f" {r.choice(QUALIFIERS)}"
        if r.random() < 0.25:
            text += f" by roughly {r.choice([10, 15, 20, 30, 40, 60])}%"
        return text

    def sentence(self, *, long: bool = False) -> str:
        text = self.clause()
        if long or self.rng.random() < 0.5:
            text += f", {self.rng.choice(CONNECTORS)} {self.clause()}"
        return text[0].upper() + text[1:] + "."

    def sentences(self, low: int, high: int) -> str:
        return " ".join(self.sentence() for _ in range(self.rng.randint(low, high)))

    def phrase(self, low: int, high: int) -> str:
        words = self.clause().split()[: self.rng.randint(low, high)]
        return " ".join(words)[0].upper() + " ".join(words)[1:]


HEADER_AT = "2026-03-02T09:14:09.214Z"


def generate_debate(seed: int) -> dict[str, Any]:
    """One debate's artifacts (round 1 per agent, synthesis, cross-examination), all schema-valid."""
    rng = random.Random(seed)
    gen = TextGen(rng)
    agents = rng.sample(AGENT_POOL, rng.randint(3, 5))

    def header(kind: str, number: int) -> dict[str, Any]:
        return {"artifact_type": kind, "schema_version": "1.0", "round_number": number, "created_at": HEADER_AT}

    round_1 = {
        name: {
            **header("independent", 1),
            "agent_id": name,
            "position": gen.sentences(1, 2),
            "key_points": [gen.sentence() for _ in range(rng.randint(3, 5))],
            "rationale": "\n\n".join(gen.sentences(3, 5) for _ in range(rng.randint(2, 3))),
            "confidence": round(rng.uniform(0.55, 0.95), 2),
            "prose_excerpt": gen.sentences(1, 2),
        }
        for name in agents
    }
    synthesis = {
        **header("synthesis", 2),
        "consensus_points": [
            {
                "point": gen.sentence(),
                "supporting_agents": rng.sample(agents, rng.randint(1, len(agents))),
                "confidence": round(rng.uniform(0.45, 0.97), 2),
            }
            for _ in range(rng.randint(4, 8))
        ],
        "tensions": [
            {
                "topic": gen.phrase(3, 7),
                "viewpoints": [
                    {"agent": a, "viewpoint": gen.sentence(long=rng.random() < 0.4)}
                    for a in rng.sample(agents, rng.randint(2, len(agents)))
                ],
            }
            for _ in range(rng.randint(2, 6))
        ],
        "priority_order": rng.sample(PRIORITIES, rng.randint(3, 6)),
    }

    def challenge() -> dict[str, Any]:
        challenger, target = rng.sample(agents, 2)
        text = gen.sentence(long=True)
        if rng.random() < 0.35:
            text = f"This is {rng.choice(SEVERE)} gap: {text[0].lower()}{text[1:]}"
        return {"challenger": challenger, "target_agent": target, "challenge": text,
                "evidence": [gen.phrase(6, 14) for _ in range(rng.randint(0, 3))]}

    def rebuttal() -> dict[str, Any]:
        text = gen.sentences(1, 3)
        if rng.random() < 0.4:
            text = f"{rng.choice(SUBSTANTIVE).capitalize()} otherwise: {text[0].lower()}{text[1:]}"
        return {"agent": rng.choice(agents), "rebuttal": text}

    cross_exam = {
        **header("cross_exam", 3),
        "challenges": [challenge() for _ in range(rng.randint(5, 15))],
        "rebuttals": [rebuttal() for _ in range(rng.randint(5, 15))],
        "unresolved": [gen.sentence() for _ in range(rng.randint(1, 4))],
    }
    for artifact in round_1.values():
        check("independent", artifact)
    check("synthesis", synthesis)
    check("cross_exam", cross_exam)
    return {"seed": seed, "agents": agents, "round_1": round_1, "synthesis": synthesis, "cross_exam": cross_exam}


@dataclass
class Measurement:
    agents: int
    r1: int  # round-1 tokens shown in rounds 3 and 4 (identical with and without filtering)
    part_full: int  # synthesis ×(agents + 1) + cross-exam, unfiltered
    part_filtered: int
    valid: int
    filtered_artifacts: int

    @property
    def whole_full(self) -> int:
        return self.r1 + self.part_full

    @property
    def whole_filtered(self) -> int:
        return self.r1 + self.part_filtered


def measure(debate: dict[str, Any], model: str) -> Measurement:
    labels = JudgeLabels(debate["agents"], debate["seed"])

    def tokens(artifact: Any) -> int:
        return count_tokens(prompt_json(labels.judge_view(artifact)), model)

    agents, synthesis, cross_exam = debate["agents"], debate["synthesis"], debate["cross_exam"]
    top_n = TopNArtifactFilter()
    round3, round4 = Round3Filter().model_dump(), Round4Filter().model_dump()
    synthesis_r3 = top_n.filter(synthesis, limits_for(synthesis, round3))
    synthesis_r4 = top_n.filter(synthesis, limits_for(synthesis, round4))
    cross_exam_r4 = top_n.filter(cross_exam, limits_for(cross_exam, round4))
    checks = [("synthesis", synthesis_r3), ("synthesis", synthesis_r4), ("cross_exam", cross_exam_r4)]
    valid = sum(1 for name, artifact in checks if not validate(name, artifact))

    own_r1 = sum(tokens(debate["round_1"][name]) for name in agents)
    all_r1 = count_tokens(prompt_json([labels.judge_view(debate["round_1"][n]) for n in labels.order()]), model)
    full = tokens(synthesis) * len(agents) + tokens(synthesis) + tokens(cross_exam)
    filtered = tokens(synthesis_r3) * len(agents) + tokens(synthesis_r4) + tokens(cross_exam_r4)
    return Measurement(len(agents), own_r1 + all_r1, full, filtered, valid, len(checks))


def saved_pct(full: int, filtered: int) -> float:
    return (full - filtered) / full * 100 if full else 0.0


def table(rows: list[tuple[str, list[Measurement]]]) -> str:
    head = (f"{'debates':<14}{'n':>4}{'R1 (both)':>11}{'part full':>11}{'part filt':>11}{'part saved':>12}"
            f"{'whole full':>12}{'whole filt':>12}{'whole saved':>13}{'valid':>9}")
    lines = [head, "-" * len(head)]
    for label, ms in rows:
        r1 = sum(m.r1 for m in ms)
        pf, pt = sum(m.part_full for m in ms), sum(m.part_filtered for m in ms)
        wf, wt = sum(m.whole_full for m in ms), sum(m.whole_filtered for m in ms)
        valid = f"{sum(m.valid for m in ms)}/{sum(m.filtered_artifacts for m in ms)}"
        lines.append(f"{label:<14}{len(ms):>4}{r1:>11,}{pf:>11,}{pt:>11,}{saved_pct(pf, pt):>11.1f}%"
                     f"{wf:>12,}{wt:>12,}{saved_pct(wf, wt):>12.1f}%{valid:>9}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--debates", type=int, default=60)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--model", default="gpt-4o", help="model whose tokenizer counts (default gpt-4o)")
    parser.add_argument("--per-debate", action="store_true", help="also print one row per debate")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    debates = [generate_debate(args.seed * 1000 + i) for i in range(args.debates)]
    results = [measure(d, args.model) for d in debates]
    elapsed = time.perf_counter() - started

    groups: list[tuple[str, list[Measurement]]] = [
        (f"{n} agents", [m for m in results if m.agents == n]) for n in (3, 4, 5)
    ]
    rows = [(label, ms) for label, ms in groups if ms] + [("all", results)]
    print(f"Artifact filtering, rounds 3+4 input tokens ({args.debates} generated debates, seed {args.seed}, "
          f"{args.model} via {tokenizer_backend()}; limits r3 {Round3Filter().model_dump()}, "
          f"r4 {Round4Filter().model_dump()})")
    print()
    print(table(rows))
    if args.per_debate:
        print()
        print(table([(f"debate {i:03d}", [m]) for i, m in enumerate(results)]))
    whole = [saved_pct(m.whole_full, m.whole_filtered) for m in results]
    part = [saved_pct(m.part_full, m.part_filtered) for m in results]
    valid = sum(m.valid for m in results)
    total = sum(m.filtered_artifacts for m in results)
    print()
    print(f"per-debate saving, whole R3+R4 input: median {statistics.median(whole):.1f}%, "
          f"min {min(whole):.1f}%, max {max(whole):.1f}%")
    print(f"per-debate saving, filtered part only: median {statistics.median(part):.1f}%, "
          f"min {min(part):.1f}%, max {max(part):.1f}%")
    print(f"filtered artifacts schema-valid: {valid}/{total} ({valid / total * 100:.0f}%)")
    print(f"generated, filtered and counted in {elapsed:.2f} s")
    return 0 if valid == total else 1


if __name__ == "__main__":
    sys.exit(main())
