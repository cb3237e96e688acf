"""What tier 1 of the safety evaluator costs per response: milliseconds, and a share of the response's processing.

Part 1 times tier 1 (the pattern rules and the response triggers, exactly as the engine runs them on each artifact)
over generated artifacts of realistic size: ordinary answers, answers dense with the words that wake the rules'
keyword prefilters (security vocabulary, "how to", "my", "without", …) so the regexes do run, and judge syntheses.
Part 2 runs whole consultations in process against the fake provider server (3 agents + judge, 4 rounds) at a fake
latency L and compares tier 1's time per response, as the engine recorded it in ``safety:checked``, with the time
from sending each call to accepting its artifact (``agent:completed`` duration). Goal: ≤ 1 ms per response (and
~1-2% of processing time). Run: ``python bench/safety.py [--repeat 300] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from typing import Any

from conclave.quality.safety_rules import RESPONSE_TRIGGER_KINDS, Rules, artifact_text

ORDINARY = ("billing", "events", "replay", "audit", "outbox", "latency", "throughput", "team", "cost", "migration",
            "schema", "projection", "risk", "vendor", "rollout", "budget", "compliance", "storage", "queue")
# words that occur in many rules' keyword lists: every answer built from them runs most of the regexes
DENSE = ("security", "attack", "exploit", "vulnerability", "how to", "my team", "without", "someone", "bypass",
         "avoid", "kill", "harm", "step by step", "malware", "trojan", "auto", "past", "steal", "bomb", "poison",
         "legal", "treatment", "detection", "antivirus")


def sentence(rng: random.Random, words: tuple[str, ...], n: int) -> str:
    return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."


def independent(rng: random.Random, words: tuple[str, ...]) -> dict[str, Any]:
    return {
        "artifact_type": "independent", "schema_version": "1.0", "round_number": 1,
        "created_at": "2026-11-23T22:00:00.000Z", "agent_id": "architect",
        "position": sentence(rng, words, 18), "key_points": [sentence(rng, words, 14) for _ in range(3)],
        "rationale": " ".join(sentence(rng, words, 16) for _ in range(12)),
        "confidence": 0.7, "prose_excerpt": sentence(rng, words, 25),
        "claims": [{"id": str(i), "text": sentence(rng, words, 14), "label": "INFER", "citations": []}
                   for i in range(4)],
        "failure_modes": [{"failure": sentence(rng, words, 6), "mitigation": sentence(rng, words, 8)}
                          for _ in range(3)],
    }


def synthesis(rng: random.Random, words: tuple[str, ...]) -> dict[str, Any]:
    return {
        "artifact_type": "synthesis", "schema_version": "1.0", "round_number": 2,
        "created_at": "2026-11-23T22:00:00.000Z",
        "consensus_points": [{"point": sentence(rng, words, 16), "supporting_agents": ["Agent A", "Agent B"],
                              "confidence": 0.7} for _ in range(6)],
        "tensions": [{"topic": sentence(rng, words, 5), "viewpoints": [
            {"agent": a, "viewpoint": sentence(rng, words, 30)} for a in ("Agent A", "Agent B", "Agent C")]}
            for _ in range(4)],
        "priority_order": [sentence(rng, words, 4) for _ in range(5)],
        "unique_insights": [sentence(rng, words, 20) for _ in range(4)],
    }


def time_tier1(rules: Rules, artifact: dict[str, Any], repeat: int) -> list[tuple[float, float]]:
    """(wall ms, CPU ms of this thread) of tier 1 on ``artifact``, ``repeat`` times: CPU time is what tier 1
    itself costs; wall time also counts the moments a busy machine gave the core to someone else."""
    kinds = ["block", *RESPONSE_TRIGGER_KINDS]
    out = []
    for _ in range(repeat):
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        rules.scan("agent", artifact_text(artifact), kinds)
        out.append(((time.perf_counter_ns() - t0) / 1e6, (time.thread_time_ns() - c0) / 1e6))
    return out


def part_one(repeat: int) -> list[tuple[str, str, float, float, float, float]]:
    rng = random.Random(2026)
    rules = Rules.load()
    rows = []
    for label, make, words in (("ordinary answer", independent, ORDINARY),
                               ("keyword-dense answer", independent, DENSE),
                               ("ordinary synthesis", synthesis, ORDINARY),
                               ("keyword-dense synthesis", synthesis, DENSE)):
        samples = [make(rng, words) for _ in range(20)]
        times = [t for s in samples for t in time_tier1(rules, s, max(1, repeat // 20))]
        size = statistics.mean(len(artifact_text(s).encode()) for s in samples) / 1024
        wall = sorted(t[0] for t in times)
        cpu = sorted(t[1] for t in times)
        rows.append((label, f"{size:.1f} kB", wall[len(wall) // 2], wall[int(len(wall) * 0.95)],
                     cpu[len(cpu) // 2], cpu[int(len(cpu) * 0.95)]))
    return rows


async def one_run(latency: float) -> tuple[float, float, int]:
    """(tier-1 ms per response, processing ms per response, responses) of one 4-round consultation."""
    from conclave.api import compose_settings
    from conclave.engine.run import Consultation
    from conclave.events import AGENT_COMPLETED, SAFETY_CHECKED
    from conclave.testing.fake_server import FakeProviderServer, Reply
    from conclave.testing.schema_instances import instance_for

    rng = random.Random(7)

    def answer(request: Any) -> Reply:
        title = str((request.schema or {}).get("title", ""))
        if "Independent" in title or "Round 1" in title:
            body = {k: v for k, v in independent(rng, ORDINARY).items()
                    if k not in ("artifact_type", "schema_version", "round_number", "created_at", "agent_id")}
            return Reply(json=body, latency=latency)
        return Reply(json=instance_for(request.schema), latency=latency)

    events: list[Any] = []
    async with FakeProviderServer() as fake:
        for model in ("gpt-4o", "claude-sonnet-4-5", "gemini-2.5-pro", "gpt-4.1"):
            fake.script(model, answer)
        settings = compose_settings("Should we move billing to event sourcing?",
                                    [*fake.overrides(), "cost.auto_approve=true", "judge.model=gpt-4.1"])
        await Consultation(settings, subscribers=[events.append]).run()
    checks = [e.data for e in events if e.type == SAFETY_CHECKED and e.data["round_number"] > 0]
    responses = sum(c["responses"] for c in checks)
    tier1 = sum(c["tier1_ms"] for c in checks) / responses
    calls = [e.data["duration_s"] * 1000 for e in events if e.type == AGENT_COMPLETED and e.data.get("ok")]
    return tier1, statistics.mean(calls), responses


def part_two(latencies: list[float], runs: int) -> list[tuple[str, int, float, float, float]]:
    os.environ.setdefault("CONCLAVE_HOME", tempfile.mkdtemp(prefix="conclave-bench-"))
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        os.environ.setdefault(var, "bench-key-0000")
    asyncio.run(one_run(0.0))  # warm up: schemas, templates, the rules' compilation
    rows = []
    for latency in latencies:
        results = [asyncio.run(one_run(latency)) for _ in range(runs)]
        tier1 = statistics.median(r[0] for r in results)
        processing = statistics.median(r[1] for r in results)
        rows.append((f"engine, L = {latency:g} s", results[0][2], tier1, processing, 100 * tier1 / processing))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=400, help="timings per text kind (part 1)")
    parser.add_argument("--runs", type=int, default=3, help="consultations per latency (part 2)")
    args = parser.parse_args()
    print("Tier 1 of the safety evaluator per response (patterns + response triggers); goal ≤ 1 ms per response")
    print()
    print(f"{'text':<26} {'size':>8} {'wall p50':>9} {'wall p95':>9} {'cpu p50':>8} {'cpu p95':>8}  (ms)")
    for label, size, p50, p95, cpu50, cpu95 in part_one(args.repeat):
        print(f"{label:<26} {size:>8} {p50:>9.3f} {p95:>9.3f} {cpu50:>8.3f} {cpu95:>8.3f}")
    print()
    print(f"{'consultation':<26} {'answers':>8} {'tier1 ms':>9} {'call ms':>9} {'share':>8}")
    for label, responses, tier1, processing, share in part_two([0.0, 0.3], args.runs):
        print(f"{label:<26} {responses:>8} {tier1:>9.3f} {processing:>9.1f} {share:>7.2f}%")
    print()
    print("share = tier-1 time per response ÷ time from sending the call to accepting its artifact (median of runs);")
    print(f"machine load while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
