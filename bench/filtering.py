"""Benchmark: the share of the input of all rounds after the synthesis that filtering saves, in default debates.

Each debate is generated deterministically (seeded RNG): 3-5 agents with full round-1 positions, a synthesis with 4-8
consensus points and 2-6 tensions, one judge cross-examination per cross-examination round (5-15 challenges, 5-15
rebuttals), and agents' replies and objections of realistic length (critique, challenges, defence, revised position,
labelled claims; votes and confidences that let the exit controller repeat cross-examination or stop), all
schema-valid. The fake provider server answers with those artifacts, and each debate is run twice by the real engine
at the default settings (``rounds`` null: whatever the exit controller, the groupthink detectors and progressive
summarization play) with the same labels and id: with the default filtering and with ``filtering.enabled=false``
(which turns filtering off and changes nothing else). The input of every request after the synthesis (system and user
messages: repeated cross-examination, objection rounds and the verdict included) is counted with the real tokenizer;
the saving measured that way is set beside the one the result reports in ``token_efficiency_stats`` (goal: within 1
point; ≥ 20% saved), and the filtered input is broken down into what it is made of. ``--compare KEY=VALUE …`` plays
each debate a third time with those overrides (other filter limits, e.g. ``filtering.replies.challenges=99`` for
filtering as it was before replies shown again were filtered) and adds its saving as a column, measured in the same
run.

    python bench/filtering.py [--debates 30] [--seed 2026] [--compare KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conclave.artifacts.schema_registry import check, current_version
from conclave.config.settings import RepliesFilter, Round3Filter, Round4Filter
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


def claims_and_references(gen: TextGen, rng: random.Random, low: int, high: int) -> dict[str, Any]:
    """An agent artifact's labelled claims (FACTs cite a reference) and the references they cite."""
    refs = [{"id": i, "title": gen.phrase(3, 7), "url": f"https://example.com/{rng.randrange(10**6)}"}
            for i in range(1, rng.randint(2, 3) + 1)]
    claims = []
    for i in range(1, rng.randint(low, high) + 1):
        label = rng.choice(["FACT", "FACT", "INFER", "ASSUME"])
        cites = [rng.choice(refs)["id"]] if label == "FACT" else []
        claims.append({"id": str(i), "text": gen.sentence(), "label": label, "citations": cites})
    used = {c for claim in claims for c in claim["citations"]}
    return {"claims": claims, "references": [r for r in refs if r["id"] in used]}


def generate_debate(seed: int) -> dict[str, Any]:
    """One debate's artifacts (round 1 per agent with labelled claims, synthesis tied to claim ids, a judge
    cross-examination and a reply per agent for each cross-examination round, objections), valid at the current
    artifact format (the replies and objections get their headers from the engine)."""
    rng = random.Random(seed)
    gen = TextGen(rng)
    agents = rng.sample(AGENT_POOL, rng.randint(3, 5))
    version = current_version()

    def header(kind: str, number: int) -> dict[str, Any]:
        return {"artifact_type": kind, "schema_version": version, "round_number": number, "created_at": HEADER_AT}

    round_1 = {
        name: {
            **header("independent", 1),
            "agent_id": name,
            "position": gen.sentences(1, 2),
            "key_points": [gen.sentence() for _ in range(rng.randint(3, 5))],
            "rationale": "\n\n".join(gen.sentences(3, 5) for _ in range(rng.randint(2, 3))),
            "confidence": round(rng.uniform(0.55, 0.95), 2),
            "prose_excerpt": gen.sentences(1, 2),
            **claims_and_references(gen, rng, 3, 5),
        }
        for name in agents
    }
    # the engine numbers round-1 claims C1, C2, … across the panel; the judge ties its statements to them
    claim_ids = [f"C{i}" for i in range(1, sum(len(a["claims"]) for a in round_1.values()) + 1)]

    def cites(low: int, high: int) -> list[str]:
        return sorted(rng.sample(claim_ids, rng.randint(low, high)), key=lambda c: int(c[1:]))
    synthesis = {
        **header("synthesis", 2),
        "consensus_points": [
            {
                "point": gen.sentence(),
                "supporting_agents": rng.sample(agents, rng.randint(1, len(agents))),
                "confidence": round(rng.uniform(0.45, 0.97), 2),
                "claim_ids": cites(1, 3),
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
                "claim_ids": cites(2, 3),
            }
            for _ in range(rng.randint(2, 6))
        ],
        "priority_order": rng.sample(PRIORITIES, rng.randint(3, 6)),
        "partial_coverage": [{"point": gen.sentence(), "agents": rng.sample(agents, 2), "claim_ids": cites(1, 2)}
                             for _ in range(rng.randint(0, 2))],
        "unique_insights": [{"agent": rng.choice(agents), "insight": gen.sentence(), "claim_ids": cites(1, 1)}
                            for _ in range(rng.randint(1, 3))],
        "blind_spots": [gen.sentence() for _ in range(rng.randint(0, 2))],
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

    def cross_exam() -> dict[str, Any]:
        return {
            **header("cross_exam", 3),
            "challenges": [challenge() for _ in range(rng.randint(5, 15))],
            "rebuttals": [rebuttal() for _ in range(rng.randint(5, 15))],
            "unresolved": [gen.sentence() for _ in range(rng.randint(1, 4))],
        }

    labels = [f"Agent {chr(65 + i)}" for i in range(len(agents))]

    def reply(round_index: int) -> dict[str, Any]:
        # a BLOCKER is likelier in the first cross-examination, and confidence grows as the debate goes on: the exit
        # controller stops on consensus after one, two or three cross-examination rounds
        vote = "BLOCKER" if rng.random() < (0.25 if round_index == 0 else 0.08) else rng.choice(["ACCEPT", "MINOR"])
        return {
            "critique": gen.sentences(2, 4),
            "challenges": [{"target_agent": rng.choice([*labels, "consensus"]), "challenge": gen.sentence(long=True),
                            "evidence": [gen.phrase(6, 12) for _ in range(rng.randint(0, 2))]}
                           for _ in range(rng.randint(1, 3))],
            "defense": gen.sentences(2, 3),
            "revised_position": gen.sentences(1, 2),
            "vote": vote,
            "vote_reason": gen.sentence() if vote != "ACCEPT" else "",
            "confidence": round(rng.uniform(0.62, 0.9) if round_index == 0 else rng.uniform(0.7, 0.92), 2),
            **claims_and_references(gen, rng, 2, 4),
        }

    def objection() -> dict[str, Any]:
        return {
            "counterargument": {"text": gen.sentences(2, 3), "opposes": []},
            "alternative_hypothesis": {"text": gen.sentences(1, 2)},
            "challenged_assumption": {"assumption": gen.sentence(), "challenge": gen.sentences(1, 2), "opposes": []},
            "revised_position": gen.sentences(1, 2),
            "confidence": round(rng.uniform(0.6, 0.9), 2),
            **claims_and_references(gen, rng, 1, 3),
        }

    cross_exams = [cross_exam() for _ in range(4)]
    replies = {name: [reply(i) for i in range(4)] for name in agents}
    objections = {name: [objection() for _ in range(3)] for name in agents}
    for artifact in round_1.values():
        check("independent", artifact)
    check("synthesis", synthesis)
    for artifact in cross_exams:
        check("cross_exam", artifact)
    return {"seed": seed, "agents": agents, "round_1": round_1, "synthesis": synthesis, "cross_exams": cross_exams,
            "replies": replies, "objections": objections}


PERSONAS = {"security": "security", "architect": "architecture", "pragmatist": "pragmatic",
            "performance": "performance", "skeptic": "skeptic", "testing": "testing", "devops": "devops"}
JUDGE_MODEL = "bench-judge"
LATER_ROUNDS = {"cross_exam_reply": 3, "cross_exam": 3, "verdict": 4}  # request schema -> round


@dataclass
class Measurement:
    agents: int
    full: int  # input of every request after the synthesis, without filtering
    filtered: int  # … with filtering
    stats_sent: int  # what the result's token_efficiency_stats says was sent …
    stats_saved: int  # … and saved
    parts: dict[str, int]  # what the filtered input is made of (tokens per part)
    parts_full: dict[str, int]  # … and the unfiltered input
    rounds: int  # rounds the debate played (the verdict included)
    cross_exams: int  # cross-examination rounds
    objections: int  # objection rounds
    compared: int | None = None  # … with filtering and the ``--compare`` overrides


async def play(debate: dict[str, Any], fake: Any, agent: Callable[[str], Callable[[Any], Any]],
               judge: Callable[[Any], Any], overrides: list[str]) -> Any:
    """Run ``debate``'s panel through the engine on the fake server — agent ``name`` answered by ``agent(name)``,
    the judge by ``judge`` — with the debate's own shuffle seed; the consultation's result."""
    from conclave.api import compose_settings
    from conclave.engine.run import Consultation

    fake.reset()
    panel = ["~agents"]
    for name in debate["agents"]:
        fake.script(f"bench-{name}", agent(name))
        panel += [f"+agents.{name}.provider=openai", f"+agents.{name}.model=bench-{name}",
                  f"+agents.{name}.persona={PERSONAS[name]}"]
    fake.script(JUDGE_MODEL, judge)
    settings = compose_settings(debate["question"], [*fake.overrides(), *panel, "judge.provider=openai",
                                                     f"judge.model={JUDGE_MODEL}", "cost.auto_approve=true",
                                                     "hedging.enabled=false", *overrides])
    return await Consultation(settings, resume_from={"shuffle_seed": debate["seed"]}).run()


async def run_debate(debate: dict[str, Any], fake: Any, verbose: bool, extra: tuple[str, ...] = ()
                     ) -> tuple[Any, list[Any]]:
    from conclave.testing.fake_server import Reply
    from conclave.testing.schema_instances import instance_for

    played: dict[tuple[str, str], int] = {}  # (who, schema) -> answers given so far: both runs answer alike

    def nth(who: str, kind: str, answers: list[dict[str, Any]]) -> dict[str, Any]:
        i = played[who, kind] = played.get((who, kind), -1) + 1
        return answers[min(i, len(answers) - 1)]

    def agent_script(name: str) -> Any:
        def reply(request: Any) -> Reply:
            kind = _schema_title(request)
            if kind == "independent":
                return Reply(json=debate["round_1"][name])
            if kind == "cross_exam_reply":
                return Reply(json=nth(name, kind, debate["replies"][name]))
            if kind == "objection":
                return Reply(json=nth(name, kind, debate["objections"][name]))
            return Reply(json=instance_for(request.schema))
        return reply

    def judge(request: Any) -> Reply:
        kind = _schema_title(request)
        if kind == "synthesis":
            return Reply(json=debate["synthesis"])
        if kind == "cross_exam":
            return Reply(json=nth("judge", kind, debate["cross_exams"]))
        return Reply(json=instance_for(request.schema))

    result = await play(debate, fake, agent_script, judge, [f"filtering.enabled={str(not verbose).lower()}", *extra])
    if result.status != "complete":
        raise SystemExit(f"debate {debate['seed']} ended {result.status}: {result.abort_reason}")
    return result, [r for r in fake.requests if _schema_title(r) not in ("", "independent", "synthesis")]


def _schema_title(request: Any) -> str:
    from conclave.engine.extraction import request_schema

    titles = _titles(request_schema)
    schema = request.schema if isinstance(request.schema, dict) else {}
    return titles.get(str(schema.get("title", "")), "")


_TITLES: dict[str, str] = {}


def _titles(request_schema: Any) -> dict[str, str]:
    if not _TITLES:
        from conclave.artifacts.schema_registry import schema_names

        _TITLES.update({request_schema(n)["title"]: n for n in schema_names() if n != "common"})
    return _TITLES


def _input_tokens(requests: list[Any]) -> int:
    """System and user messages of chat-completions requests, counted as the engine counts what it sends."""
    return sum(count_tokens("\n".join(m["content"] for m in r.json["messages"] if m["role"] in ("system", "user")))
               for r in requests)


PARTS = ("round-1 answers", "synthesis", "cross-exam (judge)", "replies, round judged", "replies, shown again",
         "objections (agents)",
         "DEBATE STATE", "summaries", "system prompts", "instructions, question, rest")
SUMMARY_HEAD = re.compile(r"^Round \d+ · .*\(summary\)$")


def _json_part(value: Any) -> str | None:
    """Which part a JSON value shown in a prompt is (None: not one of the artifacts)."""
    if isinstance(value, list):
        return "round-1 answers" if value and all(isinstance(v, dict) and "key_points" in v for v in value) else None
    if not isinstance(value, dict):
        return None
    if "consensus_points" in value:
        return "synthesis"
    if "challenges" in value and "rebuttals" in value:
        return "cross-exam (judge)"
    if "key_points" in value:
        return "round-1 answers"
    first = next(iter(value.values()), None)
    if isinstance(first, dict):
        if "key_points" in first:
            return "round-1 answers"
        if "counterargument" in first:
            return "objections (agents)"
        if "critique" in first or "vote" in first:
            return "replies, round judged"  # the $replies of the judge recording their round
    return None


def _parts(requests: list[Any]) -> dict[str, int]:
    """The input of ``requests`` by part: each system prompt, each JSON artifact line, DEBATE STATE blocks and
    round summaries (up to the next blank line), and the rest (template text, question, pointers, instruction)."""
    parts = dict.fromkeys(PARTS, 0)
    for request in requests:
        for message in request.json["messages"]:
            if message["role"] == "system":
                parts["system prompts"] += count_tokens(message["content"])
                continue
            if message["role"] != "user":
                continue
            block: str | None = None
            for line in message["content"].split("\n"):
                if not line.strip():
                    block = None
                elif line.startswith("=== DEBATE STATE ==="):
                    block = "DEBATE STATE"
                elif SUMMARY_HEAD.match(line):
                    block = "summaries"
                part = block or "instructions, question, rest"
                if block is None and line.startswith(("{", "[")):
                    try:
                        value = json.loads(line)
                    except ValueError:
                        value = None
                    if isinstance(value, dict) and ("replies" in value or "judge" in value):  # a round in full
                        for key, name in (("replies", "replies, shown again"), ("judge", "cross-exam (judge)")):
                            if key in value:
                                parts[name] += count_tokens(prompt_json(value[key]))
                        continue
                    part = _json_part(value) or part
                parts[part] += count_tokens(line)
    return parts


async def measure(debate: dict[str, Any], compare: tuple[str, ...] = ()) -> Measurement:
    from conclave.testing.fake_server import FakeProviderServer

    async with FakeProviderServer() as fake:
        _, full_requests = await run_debate(debate, fake, verbose=True)
        result, requests = await run_debate(debate, fake, verbose=False)
        compared = _input_tokens((await run_debate(debate, fake, False, compare))[1]) if compare else None
    stats = result.token_efficiency_stats or {}
    kinds = [_schema_title(r) for r in requests]
    return Measurement(
        agents=len(debate["agents"]), full=_input_tokens(full_requests), filtered=_input_tokens(requests),
        stats_sent=int(stats.get("tokens_used", 0)), stats_saved=int(stats.get("tokens_saved_via_filtering", 0)),
        parts=_parts(requests), parts_full=_parts(full_requests), rounds=result.completed_rounds,
        cross_exams=kinds.count("cross_exam"), objections=kinds.count("objection") // len(debate["agents"]),
        compared=compared,
    )


def pct(part: int, whole: int) -> float:
    return part / whole * 100 if whole else 0.0


def table(rows: list[tuple[str, list[Measurement]]], compare: bool = False) -> str:
    head = (f"{'debates':<12}{'n':>4}{'rounds':>8}{'input full':>12}{'filtered':>10}{'saved (server)':>16}"
            f"{'saved (stats)':>15}{'Δ points':>10}" + (f"{'saved (compare)':>17}" if compare else ""))
    lines = [head, "-" * len(head)]
    for label, ms in rows:
        full, filtered = sum(m.full for m in ms), sum(m.filtered for m in ms)
        sent, saved = sum(m.stats_sent for m in ms), sum(m.stats_saved for m in ms)
        measured, reported = pct(full - filtered, full), pct(saved, sent + saved)
        rounds = sum(m.rounds for m in ms) / len(ms)
        other = f"{pct(full - sum(m.compared or 0 for m in ms), full):>16.1f}%" if compare else ""
        lines.append(f"{label:<12}{len(ms):>4}{rounds:>8.1f}{full:>12,}{filtered:>10,}{measured:>15.1f}%"
                     f"{reported:>14.1f}%{reported - measured:>+10.1f}{other}")
    return "\n".join(lines)


def breakdown(ms: list[Measurement]) -> str:
    """What the input after the synthesis is made of, filtered and not."""
    after = {p: sum(m.parts[p] for m in ms) for p in PARTS}
    before = {p: sum(m.parts_full[p] for m in ms) for p in PARTS}
    total_after, total_before = sum(after.values()), sum(before.values())
    head = f"{'part of the input':<30}{'filtered':>10}{'share':>8}{'unfiltered':>12}{'share':>8}{'saved':>8}"
    lines = [head, "-" * len(head)]
    for p in PARTS:
        lines.append(f"{p:<30}{after[p]:>10,}{pct(after[p], total_after):>7.1f}%{before[p]:>12,}"
                     f"{pct(before[p], total_before):>7.1f}%{pct(before[p] - after[p], before[p]):>7.1f}%")
    lines.append(f"{'all':<30}{total_after:>10,}{100:>7.1f}%{total_before:>12,}{100:>7.1f}%"
                 f"{pct(total_before - total_after, total_before):>7.1f}%")
    return "\n".join(lines)


def bench_setup(doc: str | None, argv: list[str] | None, debates: int, *, compare: bool = False
                ) -> argparse.Namespace:
    """A throw-away home and a fake key for a benchmark on the fake server, and its ``--debates``/``--seed``
    (and ``--compare``)."""
    import os
    import tempfile

    os.environ["OPENAI_API_KEY"] = "sk-bench-not-a-key"  # the fake server takes any key; nothing leaves loopback
    os.environ["CONCLAVE_HOME"] = tempfile.mkdtemp(prefix="conclave-bench-")
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
    parser.add_argument("--debates", type=int, default=debates)
    parser.add_argument("--seed", type=int, default=2026)
    if compare:
        parser.add_argument("--compare", nargs="*", default=[], metavar="KEY=VALUE",
                            help="overrides of a third run of each debate, whose saving is added as a column")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import asyncio

    args = bench_setup(__doc__, argv, 30, compare=True)

    started = time.perf_counter()
    debates = []
    for i in range(args.debates):
        debate = generate_debate(args.seed * 1000 + i)
        debate["question"] = QUESTIONS[i % len(QUESTIONS)]
        debates.append(debate)

    async def run_all() -> list[Measurement]:
        return [await measure(d, tuple(args.compare)) for d in debates]

    results = asyncio.run(run_all())
    elapsed = time.perf_counter() - started
    groups = [(f"{n} agents", [m for m in results if m.agents == n]) for n in (3, 4, 5)]
    groups += [(f"{n} cross-ex.", [m for m in results if m.cross_exams == n]) for n in (1, 2, 3, 4)]
    rows = [(label, ms) for label, ms in groups if ms] + [("all", results)]
    print(f"Share of the input of every request after the synthesis that filtering saves, on {args.debates} default "
          f"debates (rounds=null) run by the engine against the fake server (seed {args.seed}; counted via "
          f"{tokenizer_backend()}; limits r3 {Round3Filter().model_dump()}, r4 {Round4Filter().model_dump()}, "
          f"replies {RepliesFilter().model_dump()})")
    if args.compare:
        print(f"saved (compare): the same debates filtered with {' '.join(args.compare)}")
    print()
    print(table(rows, bool(args.compare)))
    worst = max(abs(pct(m.stats_saved, m.stats_sent + m.stats_saved) - pct(m.full - m.filtered, m.full))
                for m in results)
    print()
    print(f"largest per-debate gap between the server's count and the result's stats: {worst:.2f} points (goal ≤ 1); "
          f"saved goal ≥ 20%")
    cross = [m.cross_exams for m in results]
    print(f"rounds played: {min(m.rounds for m in results)}-{max(m.rounds for m in results)}; cross-examination "
          f"rounds per debate: " + ", ".join(f"{n}× {cross.count(n)}" for n in sorted(set(cross)))
          + f"; objection rounds: {sum(m.objections for m in results)} in {len(results)} debates")
    print()
    print(breakdown(results))
    print()
    print(f"{elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
