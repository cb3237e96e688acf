"""Benchmark: context tokens of 5-, 6- and 8-round debates with and without progressive summarization.

Each debate is generated deterministically (seeded RNG, the same phrase pools as ``bench/filtering.py``): 3-5
agents with full round-1 positions and labelled claims with references, a synthesis, and for every
cross-examination round fresh replies (critique, challenges, defence, revised position, 2-4 new claims, a vote:
one agent always BLOCKER, confidences swinging, so the debate never settles) and a fresh judge record. The
exit controller therefore repeats cross-examination up to ``exit.round_cap`` = N, which fixes the length. Each
debate runs twice through the real engine against the fake provider server, with ``summarization.enabled`` true
and false; the model answers are identical in both runs. Context tokens = the user message of every call the
server received, counted with the real tokenizer (system prompts are the same in both runs and left out).

    python bench/summarization.py [--debates 5] [--seed 2026]
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import filtering as fb

from conclave.tokens import count_tokens, tokenizer_backend

LENGTHS = (5, 6, 8)


def generate(seed: int) -> dict[str, Any]:
    debate = fb.generate_debate(seed)
    debate["question"] = fb.QUESTIONS[seed % len(fb.QUESTIONS)]
    return debate


def reply(debate: dict[str, Any], name: str, k: int) -> dict[str, Any]:
    rng = random.Random(f"{debate['seed']}/{name}/{k}")
    gen = fb.TextGen(rng)
    others = [a for a in debate["agents"] if a != name]
    return {
        "critique": gen.sentences(2, 4),
        "challenges": [{"target_agent": rng.choice(others), "challenge": gen.sentence(long=True),
                        "evidence": [gen.phrase(6, 12) for _ in range(rng.randint(0, 2))]}
                       for _ in range(rng.randint(1, 3))],
        "defense": gen.sentences(2, 3),
        "revised_position": gen.sentences(1, 2),
        "vote": "BLOCKER" if name == debate["agents"][0] else rng.choice(["ACCEPT", "MINOR"]),
        "vote_reason": gen.sentence(),
        "confidence": 0.9 if k % 2 == 0 else 0.5,
        **fb.claims_and_references(gen, rng, 2, 4),
    }


def cross_exam(debate: dict[str, Any], k: int) -> dict[str, Any]:
    rng = random.Random(f"{debate['seed']}/judge/{k}")
    gen = fb.TextGen(rng)
    agents = debate["agents"]
    return {
        "challenges": [{"challenger": a, "target_agent": b, "challenge": gen.sentence(long=True),
                        "evidence": [gen.phrase(6, 12)]}
                       for a, b in (rng.sample(agents, 2) for _ in range(rng.randint(4, 8)))],
        "rebuttals": [{"agent": rng.choice(agents), "rebuttal": gen.sentences(1, 2)} for _ in range(rng.randint(3, 6))],
        "unresolved": [gen.sentence() for _ in range(rng.randint(1, 3))],
    }


@dataclass
class Run:
    rounds: dict[int, int]  # round -> context tokens sent (the result's figures, counted on what was sent)
    server: int  # every user message the fake server received
    largest: int  # the largest single user message
    saved_in_run: float | None  # what the result reports summarization saved (its own with/without count)


async def run(debate: dict[str, Any], fake: Any, length: int, summarize: bool) -> Run:
    from conclave.testing.fake_server import Reply
    from conclave.testing.schema_instances import instance_for

    def agent(name: str) -> Any:
        asked = Counter[str]()

        def answer(request: Any) -> Reply:
            kind = fb._schema_title(request)
            if kind == "independent":
                return Reply(json=debate["round_1"][name])
            asked[kind] += 1
            return Reply(json=reply(debate, name, asked[kind]))
        return answer

    judged = Counter[str]()

    def judge(request: Any) -> Reply:
        kind = fb._schema_title(request)
        judged[kind] += 1
        if kind == "synthesis":
            return Reply(json=debate["synthesis"])
        if kind == "cross_exam":
            return Reply(json=cross_exam(debate, judged[kind]))
        return Reply(json=instance_for(request.schema))

    result = await fb.play(debate, fake, agent, judge, [f"exit.round_cap={length}",
                                                         f"summarization.enabled={str(summarize).lower()}"])
    if result.status != "complete" or result.completed_rounds != length:
        raise SystemExit(f"debate {debate['seed']} ended {result.status} after {result.completed_rounds} rounds: "
                         f"{result.abort_reason}")
    messages = [m["content"] for r in fake.requests for m in r.json["messages"] if m["role"] == "user"]
    counts = [count_tokens(m) for m in messages]
    context = result.context or {}
    return Run({r["round_number"]: r["tokens"] for r in context.get("rounds", [])}, sum(counts), max(counts),
               context.get("saved"))


def main(argv: list[str] | None = None) -> int:
    import asyncio

    args = fb.bench_setup(__doc__, argv, 5)
    started = time.perf_counter()
    debates = [generate(args.seed * 1000 + i) for i in range(args.debates)]

    async def run_all() -> dict[int, list[tuple[Run, Run]]]:
        from conclave.testing.fake_server import FakeProviderServer

        out: dict[int, list[tuple[Run, Run]]] = {}
        async with FakeProviderServer() as fake:
            for length in LENGTHS:
                out[length] = [(await run(d, fake, length, True), await run(d, fake, length, False))
                               for d in debates]
        return out

    results = asyncio.run(run_all())
    print(f"Context tokens (user messages the server received, {tokenizer_backend()}) of {args.debates} generated "
          f"debates (3-5 agents, seed {args.seed}) per length, with and without progressive summarization")
    print()
    head = (f"{'rounds':>6}{'whole debate: with':>20}{'without':>10}{'ratio':>7}{'less':>7}"
            f"{'rounds ≥5: with':>17}{'without':>10}{'ratio':>7}{'less':>7}{'largest call':>14}{'in-run Δ':>10}")
    print(head)
    print("-" * len(head))
    for length, pairs in results.items():
        on = sum(p[0].server for p in pairs)
        off = sum(p[1].server for p in pairs)
        late_on = sum(t for p in pairs for n, t in p[0].rounds.items() if n >= 5)
        late_off = sum(t for p in pairs for n, t in p[1].rounds.items() if n >= 5)
        largest = max(p[0].largest for p in pairs)
        # the result's own with/without figure against the two runs' measurement (they should agree)
        reported = [p[0].saved_in_run for p in pairs if p[0].saved_in_run is not None]
        measured = 1 - late_on / late_off if late_off else 0.0
        gap = (sum(reported) / len(reported) - measured) * 100 if reported else float("nan")
        print(f"{length:>6}{on:>20,}{off:>10,}{on / off:>7.3f}{(1 - on / off) * 100:>6.1f}%"
              f"{late_on:>17,}{late_off:>10,}{late_on / late_off:>7.3f}{measured * 100:>6.1f}%{largest:>14,}"
              f"{gap:>+9.1f}p")
    print()
    print("goal: > 40% less context for debates of 5+ rounds; every call ≤ 8,000 tokens (largest call, with "
          "summaries); in-run Δ = the result's own saving minus the two runs' (points)")
    print(f"{time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
