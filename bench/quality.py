"""What the debate-quality layer costs: added input tokens per consultation, and checker time per artifact.

Over generated converge debates (3 and 5 agents, the standard 4 rounds), every call's messages (system prompt,
round prompt and the JSON instruction the engine appends) are built from the real templates twice — with the layer
and without it — from the same generated artifacts, and counted with the real tokenizer. "Without" is the same
debate with the layer's parts removed: the labelling rules and anchor in the agents' system prompts, the template
lines of the layer's fields, the DEBATE STATE blocks, the verification questions, and the layer's fields of the
artifacts later rounds are shown (claim ids, coverage, claim statuses); everything else (questions, positions,
rationales, synthesis, replies) is sent in both. Each agent makes 4 labelled claims; the synthesis accounts for all
of them (as its prompt asks); no context is attached (attached files go to every call with and without the layer,
so they would lower the share). Goal: ≤ 15% more input tokens. The breakdown says how much of the addition each
part is (the debate with everything but that part, subtracted from the whole).
Checker time: citation rules + deterministic verification + absorbing into the state, per agent artifact.
Goal: ≤ 1 ms. Run: ``python bench/quality.py [--debates 20]``.

A last line counts what the prompts do not hold: the JSON schemas each call sends (natively, or in the message
for providers without structured output), with and without the layer's fields. Providers bill them as input too.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import string
import time
from typing import Any

from conclave_plugins.strategies import ConvergeStrategy

from conclave.engine.extraction import json_instruction
from conclave.engine.quality import AGENTS_NOT_SHOWN, RECORD_ONLY, claim_ids_in
from conclave.engine.session import prompt_json
from conclave.quality.anchors import ANCHORS, anchor_prompt
from conclave.quality.claims import check_rules, claims_of
from conclave.quality.debate_state import DebateState
from conclave.quality.verification import UNIVERSAL, prompt_list, run_checkers
from conclave.tokens import count_tokens

QUALITY_FIELDS = ("claims", "references", "alternatives", "failure_modes", "uncertainties", "retracts",
                  "verification", "claim_ids", "partial_coverage", "unique_insights", "blind_spots",
                  "claim_statuses", "evidence_claims")
# instruction lines and blocks of the templates that exist only for the layer
_LAYER_LINE = re.compile(r"^- (?:" + "|".join(QUALITY_FIELDS) + r")\b.*(?:\n(?!- |\n).*)*\n?", re.MULTILINE)
_STATE_INTRO = re.compile(r"\n\$debate_state\n")
WORDS = ("billing", "events", "replay", "audit", "outbox", "latency", "throughput", "team", "cost", "migration",
         "schema", "projection", "risk", "vendor", "rollout", "budget", "compliance", "storage", "queue",
         "consistency")


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


PARTS = {  # what the layer adds to the prompts, as the breakdown names it
    "system": "labelling rules + anchor (agents' system prompts)",
    "fields": "field lines of the round prompts",
    "state": "DEBATE STATE blocks",
    "questions": "verification questions (synthesis judge)",
    "artifacts": "claim ids, coverage and statuses in artifacts shown",
}
ALL = frozenset(PARTS)
CLAIMS = 4  # labelled claims per round-1 position


def independent(rng: random.Random, agent: str) -> dict[str, Any]:
    return {"position": sentence(rng, 18), "key_points": [sentence(rng, 14) for _ in range(3)],
            "rationale": " ".join(sentence(rng, 16) for _ in range(12)),
            "confidence": round(rng.uniform(0.5, 0.9), 2), "prose_excerpt": sentence(rng, 25),
            "claims": [{"id": str(i), "text": sentence(rng, 14), "label": rng.choice(["FACT", "INFER", "ASSUME"]),
                        "citations": [1 + i % 2]} for i in range(CLAIMS)],
            "references": [{"id": i, "title": sentence(rng, 6), "url": f"https://example.com/{agent}/{i}"}
                           for i in (1, 2)],
            "alternatives": [{"option": sentence(rng, 5), "rejected_because": sentence(rng, 9)} for _ in range(2)],
            "failure_modes": [{"failure": sentence(rng, 6), "mitigation": sentence(rng, 8)} for _ in range(3)],
            "uncertainties": [sentence(rng, 10)]}


def cid(agent: int, n: int) -> str:
    """The state id the engine gives claim ``n`` of agent ``agent`` (agents absorbed in name order)."""
    return f"C{agent * CLAIMS + n + 1}"


def reply(rng: random.Random, labels: list[str], i: int) -> dict[str, Any]:
    """Agent ``i`` challenges the next agent and opposes that agent's first claim with a new one."""
    target = (i + 1) % len(labels)
    return {"critique": " ".join(sentence(rng, 15) for _ in range(3)),
            "challenges": [{"target_agent": labels[target], "challenge": sentence(rng, 14),
                            "evidence": [sentence(rng, 8)]}],
            "defense": " ".join(sentence(rng, 15) for _ in range(2)),
            "revised_position": sentence(rng, 18), "vote": "MINOR", "vote_reason": sentence(rng, 10),
            "confidence": round(rng.uniform(0.5, 0.9), 2),
            "claims": [{"id": "1", "text": sentence(rng, 12), "label": "INFER", "citations": [],
                        "opposes": [cid(target, 0)]}],
            "references": [], "retracts": []}


def synthesis(rng: random.Random, labels: list[str]) -> dict[str, Any]:
    """A synthesis that accounts for every round-1 claim, as its prompt asks and the coverage check demands:
    consensus points on agents A and B's claims, tensions between A or B and the last agent, and every claim left
    over in a unique insight of its author."""
    last = len(labels) - 1
    out: dict[str, Any] = {
        "consensus_points": [{"point": sentence(rng, 14), "supporting_agents": labels[:2], "confidence": 0.7,
                              "claim_ids": [cid(0, j), cid(1, j)]} for j in range(3)],
        "tensions": [{"topic": sentence(rng, 4), "viewpoints": [{"agent": labels[a], "viewpoint": sentence(rng, 12)}
                                                                for a in (t, last)],
                      "claim_ids": [cid(t, 3), cid(last, t)]} for t in range(2)],
        "priority_order": [sentence(rng, 5) for _ in range(3)]}
    named = {i for item in out["consensus_points"] + out["tensions"] for i in item["claim_ids"]}
    out["partial_coverage"] = []
    out["unique_insights"] = [
        {"agent": labels[a], "insight": sentence(rng, 12), "claim_ids": left}
        for a in range(len(labels)) if (left := [cid(a, n) for n in range(CLAIMS) if cid(a, n) not in named])]
    out["blind_spots"] = [sentence(rng, 8)]
    out["verification"] = [{"agent": a, "question_id": q, "passed": True, "reason": sentence(rng, 6)}
                           for a in labels for q in ("U6", "U7", "CV1", "CV2")]
    return out


def strip_layer(node: Any) -> Any:
    """An artifact as the same debate without the layer would hold it: no quality fields at any depth."""
    if isinstance(node, dict):
        return {k: strip_layer(v) for k, v in node.items() if k not in QUALITY_FIELDS}
    return [strip_layer(x) for x in node] if isinstance(node, list) else node


def shown(artifact: dict[str, Any], parts: frozenset[str], seat: str = "judge") -> str:
    """An artifact as later rounds are shown it (the engine's rule: no record-only quality fields, and agents not
    the synthesis' account of round-1 coverage)."""
    hidden = RECORD_ONLY | AGENTS_NOT_SHOWN if seat == "agents" else RECORD_ONLY
    view = {k: v for k, v in artifact.items() if k not in hidden}
    return prompt_json(view if "artifacts" in parts else strip_layer(view))


def render(text: str, values: dict[str, str], parts: frozenset[str], *, user: bool = True) -> str:
    """A template as the engine sends it with ``parts`` of the layer; a user message ends with the JSON instruction
    the engine appends (native structured output: the schema itself is counted apart)."""
    if "fields" not in parts:
        text = _LAYER_LINE.sub("", text)
    if "state" not in parts:
        text = _STATE_INTRO.sub("\n", text)
    if "system" not in parts:
        text = text.split("\n=== EPISTEMIC LABELING ===", 1)[0]
    text = string.Template(text).safe_substitute(values)
    return f"{text.rstrip()}\n\n{json_instruction('independent', True)}" if user else text


def debate_tokens(rng: random.Random, agents: int, parts: frozenset[str]) -> int:
    """Input tokens of every call of one standard converge debate, each seat shown the state block the engine
    builds for it (the judge: what the latest round touched; an agent: its own, linked, contested and named
    claims). The generated artifacts are the same whatever ``parts`` holds."""
    strategy = ConvergeStrategy()
    names = [f"agent{i}" for i in range(agents)]
    labels = [f"Agent {chr(65 + i)}" for i in range(agents)]
    label_of = dict(zip(names, labels, strict=True)).__getitem__
    question = sentence(rng, 20)
    r1 = {n: independent(rng, n) for n in names}
    syn = synthesis(rng, labels)
    replies = {label: reply(rng, labels, i) for i, label in enumerate(labels)}
    cross = {"challenges": [{"challenger": labels[1], "target_agent": labels[0], "challenge": sentence(rng, 14),
                             "evidence": [sentence(rng, 8)]}],
             "rebuttals": [{"agent": labels[0], "rebuttal": sentence(rng, 14)}], "unresolved": [sentence(rng, 8)],
             "claim_statuses": [{"claim_id": "C1", "status": "contested", "reason": sentence(rng, 8)}]}
    state = DebateState(question, names)
    for n in names:
        state.absorb(1, n, r1[n])
    state.round = 1

    def block(seat: str | None, *shown: str) -> str:
        if "state" not in parts:
            return ""
        focus = state.focus(seat, claim_ids_in(shown))
        return state.block(label_of, focus=focus, own=seat, evidence=seat is None)

    base = {"question": question, "panel": ", ".join(labels), "absent": "Every panel member is present.",
            "earlier_rounds": "",
            "verification_questions": prompt_list([*UNIVERSAL, *strategy.verification_questions])
            if "questions" in parts else ""}
    total = 0
    persona = render(strategy.template("agent_system").text, {"persona_name": "expert", "persona_focus": "x"},
                     parts, user=False)
    judge = strategy.template("judge_system").text
    anchors = list(ANCHORS)
    systems = [persona + ("\n\n" + anchor_prompt(anchors[i % 4]) if "system" in parts else "")
               for i in range(agents)]
    for i in range(agents):
        total += count_tokens(systems[i] + render(strategy.template("round1").text, base, parts))
    independents = prompt_json([json.loads(shown(a, parts)) for a in r1.values()])
    total += count_tokens(judge + render(strategy.template("round2").text, {
        **base, "independents": independents, "debate_state": block(None)}, parts))
    state.round = 2
    for i, name in enumerate(names):
        total += count_tokens(systems[i] + render(strategy.template("round3_agent").text, {
            **base, "label": labels[i], "own_position": shown(r1[name], parts),
            "synthesis": shown(syn, parts, "agents"), "debate_state": block(name, shown(syn, ALL, "agents"))}, parts))
    for name in names:
        state.absorb(3, name, replies[label_of(name)])
    state.round = 3
    total += count_tokens(judge + render(strategy.template("round3_judge").text, {
        **base, "synthesis": shown(syn, parts), "debate_state": block(None), "replies": prompt_json(
            {label: json.loads(shown(r, parts)) for label, r in replies.items()})}, parts))
    total += count_tokens(judge + render(strategy.template("round4").text, {
        **base, "independents": independents, "synthesis": shown(syn, parts),
        "cross_exam": shown(cross, parts)}, parts))
    return total


def _without_layer(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: ({p: _without_layer(x) for p, x in v.items() if p not in QUALITY_FIELDS} if k == "properties"
                    else [r for r in v if r not in QUALITY_FIELDS] if k == "required" else _without_layer(v))
                for k, v in node.items()}
    return [_without_layer(x) for x in node] if isinstance(node, list) else node


def schema_tokens(agents: int, layer: bool) -> int:
    """Tokens of the schemas one standard converge debate sends (every call, as the engine sends them)."""
    from conclave.engine.extraction import request_schema

    total = 0
    for name, calls in (("independent", agents), ("synthesis", 1), ("cross_exam_reply", agents), ("cross_exam", 1),
                        ("verdict", 1)):
        schema = request_schema(name) if layer else _without_layer(request_schema(name))
        total += count_tokens(json.dumps(schema, ensure_ascii=False, separators=(",", ":"))) * calls
    return total


def checker_seconds(rng: random.Random, artifacts: int) -> float:
    samples = [independent(rng, f"a{i % 5}") for i in range(artifacts)]
    state = DebateState("q", [f"a{i}" for i in range(5)])
    start = time.perf_counter()
    for i, artifact in enumerate(samples):
        claims, references, _ = claims_of(artifact)
        check_rules(claims, references)
        run_checkers(artifact, UNIVERSAL)
        state.absorb(1 + i // 50, f"a{i % 5}", artifact)
    return (time.perf_counter() - start) / artifacts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--debates", type=int, default=20)
    parser.add_argument("--artifacts", type=int, default=2000)
    args = parser.parse_args()
    print("what the debate-quality layer adds: input tokens per consultation, checker time per artifact")
    print(f"{'agents':>6} {'debates':>7} {'tokens without':>15} {'tokens with':>12} {'added':>8} {'goal':>6}")

    def mean(agents: int, parts: frozenset[str]) -> float:
        return sum(debate_tokens(random.Random(seed), agents, parts) for seed in range(args.debates)) / args.debates

    prompts: dict[int, tuple[float, float]] = {}
    shares: dict[int, dict[str, float]] = {}
    for agents in (3, 5):
        without, with_layer = mean(agents, frozenset()), mean(agents, ALL)
        prompts[agents] = (without, with_layer)
        shares[agents] = {p: (with_layer - mean(agents, ALL - {p})) / (with_layer - without) for p in PARTS}
        added = with_layer / without - 1
        print(f"{agents:>6} {args.debates:>7} {without:>15,.0f} {with_layer:>12,.0f} "
              f"{added:>7.1%} {'met' if added <= 0.15 else 'MISSED':>6}")
    print("share of the addition, by part (3 agents / 5 agents):")
    for part, what in PARTS.items():
        print(f"  {part:<10} {shares[3][part]:>6.1%} / {shares[5][part]:>6.1%}  {what}")
    for agents in (3, 5):
        without, with_layer = schema_tokens(agents, False), schema_tokens(agents, True)
        p_without, p_with = prompts[agents]
        print(f"{agents} agents, schemas sent per consultation: {without:,} → {with_layer:,} tokens "
              f"({with_layer / without - 1:+.1%}); prompts + schemas: {p_without + without:,.0f} → "
              f"{p_with + with_layer:,.0f} ({(p_with + with_layer) / (p_without + without) - 1:+.1%})")
    per = checker_seconds(random.Random(1), args.artifacts)
    print(f"checker time per artifact: {per * 1e3:.3f} ms over {args.artifacts} artifacts (goal ≤ 1 ms: "
          f"{'met' if per <= 1e-3 else 'MISSED'})")


if __name__ == "__main__":
    main()
