"""Benchmark: the input a consultation with a 100 KB context is billed, with prompt caching and without.

Each panel (3 agents + judge, 4 rounds) runs as separate `python -m conclave "Q" context=<100 KB file>` processes
against the fake provider server in its own process, which models each API's prompt cache (OpenAI's automatic
prefix cache, Anthropic's cache_control breakpoints, Gemini's cached contents; a prefix is readable once the request
that wrote it is answered). Per panel, three runs: caching (the default hints, `prompt_cache: on` for the fake),
no caching (`prompt_cache=off` and the fake's caches off: every token billed in full), and caching with filtering
off (`filtering.enabled=false`). Billed input is read from the index the CLI wrote: Σ over calls of uncached input ×
input price + cached input × cached price + cache writes × write price (list prices: plugins/pricing). The
floor is the ratio had every input token of the uncached run been billed at its model's cached rate (0.50 for
gpt-4o, whose cached rate is half its input rate; 0.10 for gpt-5, Claude and Gemini 2.5); the write floor bills each
(provider, model)'s first call in full (at the write rate on Anthropic) and the rest at the cached rate: what no
layout of these calls can beat, since each model must be sent the prefix once before it can read it. Each panel
also gets a line per model (its calls, share read, tokens written, its own ratios and its share of the bill).

    python bench/caching.py [--latency 0.05] [--context-kb 100] [--rounds 4|default] [--panels "openai,gemini"]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fake_process import fake_server_process

from conclave.providers.base import Usage
from conclave.providers.pricing import PriceTable

QUESTION = "Should the billing service move to event sourcing, given the code and notes in the context?"
_GPT5 = tuple(f"{seat}.model=gpt-5" for seat in ("agents.security", "agents.architect", "agents.pragmatist", "judge"))
#: row label, panel (conf/agents) and extra overrides. OpenAI sends every schema as a function tool (one list for
#: every call); once more with the schema in the user message instead (structured_output=prompt), and once with
#: gpt-5, whose cached rate is 10% of its input rate (gpt-4o's is 50%: no layout can bring it under 0.50)
PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("anthropic", "anthropic_only", ()),
    ("openai", "openai_only", ()),
    ("openai, prompt", "openai_only", ("providers.openai.structured_output=prompt",)),
    ("openai, gpt-5", "openai_only", _GPT5),
    ("gemini", "gemini_only", ()),
    ("default (mixed)", "default", ()),
)
GOAL = 0.40
#: the rounds override (``--rounds``): 4 = round 1, synthesis, one cross-examination, verdict
ROUNDS: list[str] = ["rounds=4"]
#: providers whose cache is filled only by a billed write (Anthropic's cache_control): a first call costs the write
WRITE_ONLY = frozenset({"anthropic"})

_WORDS = [
    "ledger", "invoice", "account", "balance", "event", "stream", "projection", "replay", "snapshot", "aggregate",
    "command", "handler", "idempotent", "retry", "outbox", "consumer", "partition", "offset", "schema", "migration",
    "audit", "compliance", "latency", "throughput", "rollback", "reconciliation", "settlement", "currency",
    "refund", "dispute", "chargeback", "tax",
]


def context_file(path: Path, kilobytes: int) -> Path:
    """A deterministic text of ``kilobytes`` KB: code-like sections and prose, like a project summary."""
    rng = random.Random(2026)
    parts: list[str] = []
    size, n = 0, 0
    while size < kilobytes * 1024:
        n += 1
        if n % 3:
            words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(40, 90)))
            block = f"## Note {n}\n\n{words.capitalize()}.\n\n"
        else:
            name = "_".join(rng.sample(_WORDS, 2))
            block = (f"def {name}(event, store):\n    \"\"\"{' '.join(rng.sample(_WORDS, 8))}.\"\"\"\n"
                     f"    state = store.load(event.{rng.choice(_WORDS)}_id)\n"
                     f"    if state.{rng.choice(_WORDS)} > {rng.randint(1, 999)}:\n"
                     f"        return store.append(event, expected_version=state.version)\n"
                     f"    raise ValueError(\"{' '.join(rng.sample(_WORDS, 5))}\")\n\n")
        parts.append(block)
        size += len(block.encode())
    path.write_text("".join(parts)[: kilobytes * 1024])
    return path


@dataclass
class Billed:
    input_tokens: int = 0
    cached: int = 0
    written: int = 0
    input_cost: float = 0.0
    #: the input cost had every input token been billed at its model's cached rate: the lowest any layout can reach
    #: if caches came for free
    floor_cost: float = 0.0
    #: the input cost had each (provider, model)'s first call been billed in full (at the cache-write rate where
    #: the cache is only filled by a write: Anthropic) and every later call at the cached rate: nothing can be read
    #: before one call has sent it, so no layout of these calls beats this (to within the first call's short tail)
    write_floor_cost: float = 0.0
    calls: int = 0
    #: (provider, model) -> its own Billed (calls, tokens and costs of that model alone)
    by_model: dict[tuple[str, str], Billed] = field(default_factory=dict)

    @property
    def cached_share(self) -> float:
        return self.cached / self.input_tokens if self.input_tokens else 0.0

    def add(self, price: Any, usage: Usage, first: bool, write_only: bool) -> None:
        self.calls += 1
        self.input_tokens += usage.input_tokens
        self.cached += usage.cached_input_tokens
        self.written += usage.cache_write_tokens
        self.input_cost += price.cost(usage)
        self.floor_cost += price.cost(Usage(usage.input_tokens, 0, usage.input_tokens, 0))
        n = usage.input_tokens
        self.write_floor_cost += price.cost(Usage(n, 0, 0, n if write_only else 0) if first else Usage(n, 0, n, 0))


def run(overrides: list[str], context: Path, extra: list[str]) -> Billed:
    """One CLI consultation in a fresh home; its calls as the index recorded them, priced."""
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        env.update({"CONCLAVE_HOME": home, "OPENAI_API_KEY": "sk-bench", "ANTHROPIC_API_KEY": "sk-ant-bench",
                    "GEMINI_API_KEY": "bench"})
        proc = subprocess.run([sys.executable, "-m", "conclave", QUESTION, *overrides, f"context=[{context}]",
                               *ROUNDS, "hedging.enabled=false", "cost.auto_approve=true", "output.format=json",
                               *extra],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"conclave failed ({' '.join(extra)}): {proc.stderr[-2000:]}")
        json.loads(proc.stdout)  # a complete result
        prices = PriceTable.load()
        billed = Billed()
        with sqlite3.connect(Path(home) / "index.db") as db:
            rows = db.execute("select provider, model, agent, round_number, input_tokens, cached_input_tokens, "
                              "cache_write_tokens from calls order by started_at").fetchall()
        for provider, model, agent, round_number, tokens, cached, written in rows:
            usage = Usage(tokens or 0, 0, cached or 0, written or 0)
            price = prices.price(provider, model)
            assert price is not None, f"no price for {provider}/{model}"
            group = billed.by_model.setdefault((provider, model), Billed())
            first, write_only = group.calls == 0, provider in WRITE_ONLY
            billed.add(price, usage, first, write_only)
            group.add(price, usage, first, write_only)
            if os.environ.get("CACHING_BENCH_CALLS"):
                print(f"    {provider}/{model} {agent} r{round_number}: in {usage.input_tokens:,} cached "
                      f"{usage.cached_input_tokens:,} written {usage.cache_write_tokens:,}", file=sys.stderr)
        return billed


def with_caching(overrides: list[str], mode: str) -> list[str]:
    return [o if ".prompt_cache=" not in o else o.split("=")[0] + f"={mode}" for o in overrides]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--context-kb", type=int, default=100)
    parser.add_argument("--rounds", default="4", help="rounds=N, or 'default' (what the exit controller plays)")
    parser.add_argument("--panels", default="", help="comma-separated row labels to run (default: all)")
    args = parser.parse_args()
    ROUNDS[:] = [] if args.rounds == "default" else [f"rounds={args.rounds}"]
    wanted = {p.strip() for p in args.panels.split(",") if p.strip()}
    print(f"billed input of one CLI consultation (3 agents + judge, rounds={args.rounds}) with a "
          f"{args.context_kb} KB context: prompt caching on ÷ off, and what filtering saves with caching on")
    header = (f"{'panel':<15} {'input tok':>10} {'cached':>7} {'$ in off':>9} {'$ in on':>9} {'on÷off':>7} "
              f"{'goal':>5} {'floor':>6} {'w.floor':>8}  {'filter: tok saved':>17} {'$ saved':>8}")
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        context = context_file(Path(tmp) / "context.md", args.context_kb)
        for label, panel, extra in PANELS:
            if wanted and label not in wanted:
                continue
            # a fresh server for each run: a consultation must not read what an earlier one cached
            with fake_server_process(args.latency, rich=True) as overrides:
                on = run(with_caching(overrides, "on"), context, [f"agents={panel}", *extra])
            with fake_server_process(args.latency, rich=True) as overrides:
                verbose = run(with_caching(overrides, "on"), context,
                              [f"agents={panel}", "filtering.enabled=false", *extra])
            with fake_server_process(args.latency, prompt_cache=False, rich=True) as overrides:
                off = run(with_caching(overrides, "off"), context, [f"agents={panel}", *extra])
            ratio = on.input_cost / off.input_cost
            token_saving = 1 - on.input_tokens / verbose.input_tokens
            cost_saving = 1 - on.input_cost / verbose.input_cost
            print(f"{label:<15} {off.input_tokens:>10,} {on.cached_share:>6.0%} {off.input_cost:>9.4f} "
                  f"{on.input_cost:>9.4f} {ratio:>7.2f} {'met' if ratio <= GOAL else 'MISS':>5} "
                  f"{off.floor_cost / off.input_cost:>6.2f} {off.write_floor_cost / off.input_cost:>8.2f}  "
                  f"{token_saving:>17.1%} {cost_saving:>8.1%}")
            for (provider, model), group in on.by_model.items():
                base = off.by_model.get((provider, model), Billed())
                share = base.input_cost or 1.0
                print(f"  {provider + '/' + model:<28} {group.calls} calls ({base.calls} off), "
                      f"{group.cached_share:.0%} read, {group.written:,} written; on÷off "
                      f"{group.input_cost / share:.2f}, floor {base.floor_cost / share:.2f}, write floor "
                      f"{base.write_floor_cost / share:.2f}; {base.input_cost / off.input_cost:.0%} of the "
                      f"panel's uncached bill", flush=True)
    print(f"goal: billed input with caching ≤ {GOAL:.0%} of the uncached bill; 'input tok' = uncached run's input "
          "tokens; 'cached' = share of the cached run's input read from caches; 'floor' = on÷off had every input "
          "token of the uncached run been billed at the cached rate; 'w.floor' (write floor) = on÷off had each "
          "(provider, model)'s first call been billed in full (at the write rate on Anthropic, whose cache is filled "
          "only by a write) and every later one at the cached rate: nothing is read from a cache before one call "
          "has sent it, so no layout of these calls can go below it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
