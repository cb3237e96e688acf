"""Does the debate beat the round-1 vote? Every eval protocol in four scripted panel worlds, or on a real panel.

Simulated (the default): for each world of :func:`conclave.testing.panel_world.standard_world` — independent errors,
correlated errors, conformist agents, one strong agent and two weak ones — the world is served by the fake provider
server and `conclave eval` runs as a separate CLI process over the same arithmetic items. Per protocol and world it
prints accuracy, billed tokens and dollars per item, and the paired difference to the round-1 vote with its 95%
interval; then the goal figures of issue 25. These are simulated worlds showing the mechanisms work, not real-model
accuracy.

Real (``--real``): the same table for one run of `conclave eval` on the panel your overrides name (keys from the
environment, or a local OpenAI-compatible server); it is paid, and the cost gate asks unless you add
``--override cost.auto_approve=true``.

    python bench/beat_the_vote.py [--items 500] [--worlds independent conformist] [--latency 0.002]
    python bench/beat_the_vote.py --quick                       # 40 items per world: a smoke run
    python bench/beat_the_vote.py --real --items 100 --set my_questions.jsonl --override agents=openai_only
    python bench/beat_the_vote.py --real --override providers.openai.base_url=http://127.0.0.1:8080/v1 \\
        --override agents=openai_only --override agents.security.model=qwen2.5-7b-instruct ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from conclave.config.home import default_home
from conclave.eval.scoring import is_correct
from conclave.testing.fake_server import FakeProviderServer
from conclave.testing.panel_world import WORLDS, panel_overrides, standard_world

#: the rows of the table, in order; a protocol the installed conclave does not score prints "not available"
PROTOCOLS = ("vote", "single", "single_best", "judge", "judge_pick", "vote_weighted", "vote_learned", "sc_best",
             "debate")
#: the protocols read from the judge's synthesis of round 1: the default answer protocol plays none (its
#: cross-examination is on the peers' answers), so they come from a second run of the same items with every item
#: synthesised (the gate off, the judge's verdict asked for); round 1 replays exactly, so the pairs hold
JUDGE_PROTOCOLS = ("judge", "judge_pick")
JUDGE_RUN = ("selective.enabled=false", "selective.judge_verdict=true")
#: the switches of issue 25 that "today's default" (the plain debate) turns off, where this conclave has them
NEW_SWITCHES = ("selective.enabled", "anti_conformity", "anonymous_peers")
FAKE_KEYS = {"OPENAI_API_KEY": "sk-bench-0000", "ANTHROPIC_API_KEY": "sk-ant-bench", "GEMINI_API_KEY": "bench"}
NOTICE = ("SIMULATED WORLDS: scripted agents on a fake provider server. These figures show that the mechanisms "
          "work as designed; they are not the accuracy of any real model.")
LEARNED_AFTER = 200


def paired(rows: Sequence[dict[str, Any]], a: str, b: str = "vote") -> tuple[float, float, float] | None:
    """Mean of (a right − b right) over the items, in percentage points, with its normal 95% interval."""
    pairs = [(r.get(f"{a}_correct"), r.get(f"{b}_correct")) for r in rows]
    diffs = [int(x) - int(y) for x, y in pairs if x is not None and y is not None]
    if not diffs:
        return None
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    half = 1.96 * sd / math.sqrt(n)
    return 100 * mean, 100 * (mean - half), 100 * (mean + half)


def figures(rows: Sequence[dict[str, Any]], protocol: str) -> dict[str, Any] | None:
    """Accuracy, tokens and dollars per item of ``protocol`` over ``rows``; None when no row scores it."""
    scored = [r for r in rows if r.get(f"{protocol}_correct") is not None]
    if not scored:
        return None
    costs = [r.get(f"{protocol}_cost") for r in scored]
    known = [float(c) for c in costs if c is not None]
    return {"n": len(scored), "accuracy": sum(int(r[f"{protocol}_correct"]) for r in scored) / len(scored),
            "tokens": sum(int(r.get(f"{protocol}_tokens") or 0) for r in scored) / len(scored),
            "dollars": sum(known) / len(scored) if len(known) == len(costs) else None}


def decided_after_round_1(row: dict[str, Any]) -> bool:
    """Whether the item was decided by the round-1 gate (its own flag when the eval records one, else it played
    one round only)."""
    for key in ("decided_after_round_1", "selective_decided"):
        if key in row:
            return bool(row[key])
    return int(row.get("rounds_completed") or 0) == 1


def with_single_best(rows: list[dict[str, Any]]) -> str | None:
    """Add the ``single_best`` columns to ``rows``: the single agent with the most right answers over the run (a
    hindsight pick, as in `conclave eval report`); its name, or None without per-agent rows."""
    agents = sorted({k[len("single_"): -len("_correct")] for r in rows for k in r
                     if k.startswith("single_") and k.endswith("_correct") and k != "single_correct"} - {"best"})
    if not agents:
        return None
    best = max(agents, key=lambda a: (sum(int(r.get(f"single_{a}_correct") or 0) for r in rows), -agents.index(a)))
    for row in rows:
        for field in ("correct", "tokens", "cost"):
            if f"single_{best}_{field}" in row:
                row[f"single_best_{field}"] = row[f"single_{best}_{field}"]
    return best


def merge_judge(rows: list[dict[str, Any]], judged: Sequence[dict[str, Any]]) -> None:
    """Replace the :data:`JUDGE_PROTOCOLS` columns of ``rows`` by those of the same items in ``judged``."""
    by_item = {str(r["item_id"]): r for r in judged}
    for row in rows:
        other = by_item.get(str(row["item_id"]), {})
        for key in [k for k in row if k.startswith(tuple(f"{p}_" for p in JUDGE_PROTOCOLS))]:
            del row[key]
        row.update({k: v for k, v in other.items() if k.startswith(tuple(f"{p}_" for p in JUDGE_PROTOCOLS))})


def counted_flips(rows: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """(right→wrong, wrong→right) changes between each agent's round-1 answer and the answer that counts for the
    aggregate after cross-examination (the effective answers of anti-conformity)."""
    r_w = w_r = 0
    for row in rows:
        answers = row.get("answers") or {}
        item = {"kind": row.get("kind") or "exact", "answer": row.get("expected")}
        for agent, after in (answers.get("round_3_effective") or {}).items():
            before = (answers.get("round_1") or {}).get(agent)
            if before is None or after is None:
                continue
            was, now = is_correct(before, item), is_correct(after, item)
            r_w += int(was and not now)
            w_r += int(now and not was)
    return r_w, w_r


def protocols_of(rows: Sequence[dict[str, Any]]) -> list[str]:
    """:data:`PROTOCOLS` in order, each agent's single protocol after ``single``, and any other protocol the rows
    score (``vote_matched``, ``quality``, …) at the end."""
    scored = sorted({key[: -len("_correct")] for row in rows for key in row if key.endswith("_correct")})
    singles = [p for p in scored if p.startswith("single_") and p not in PROTOCOLS]
    names = [*PROTOCOLS[:2], *singles, *PROTOCOLS[2:]]
    return names + [p for p in scored if p not in names]


def table(label: str, rows: list[dict[str, Any]]) -> list[str]:
    best = with_single_best(rows)
    width = max(14, *(len(p) + 1 for p in protocols_of(rows)))
    lines = [f"\n## {label}: {len(rows)} item(s)", "",
             f"{'protocol':<{width}} {'accuracy':>9} {'tokens/item':>12} {'$/item':>10}   {'vs vote (95% CI)':<28}"]
    for protocol in protocols_of(rows):
        found = figures(rows, protocol)
        if found is None:
            lines.append(f"{protocol:<{width}} not available")
            continue
        dollars = "unknown" if found["dollars"] is None else f"{found['dollars']:.5f}"
        diff = paired(rows, protocol)
        versus = "—" if protocol == "vote" or diff is None else \
            f"{diff[0]:+6.1f} pp [{diff[1]:+.1f}, {diff[2]:+.1f}]"
        lines.append(f"{protocol:<{width}} {100 * found['accuracy']:>8.1f}% {found['tokens']:>12.0f} {dollars:>10}   "
                     f"{versus:<28}" + (f" (hindsight: {best})" if protocol == "single_best" else ""))
    return lines


def goals(runs: dict[str, list[dict[str, Any]]], baseline: list[dict[str, Any]] | None,
          switches: Sequence[str], always: list[dict[str, Any]] | None = None) -> list[str]:
    """The figures of issue 25's goals table, from the runs by world, the independent world's baseline run
    (today's default: the new switches off) and its always-debating run (the default with the gate off)."""
    lines = ["", "## Goals (issue 25)", ""]

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    conformist = runs.get("conformist")
    if conformist:
        diff = paired(conformist, "debate")
        if diff:
            lines.append(f"- default answer protocol − vote, conformist world: {diff[0]:+.1f} pp "
                         f"[{diff[1]:+.1f}, {diff[2]:+.1f}] (goal ≥ +3 pp, CI above 0: "
                         f"{verdict(diff[0] >= 3 and diff[1] > 0)})")
        r_w = sum(int(r.get("right_to_wrong") or 0) for r in conformist)
        w_r = sum(int(r.get("wrong_to_right") or 0) for r in conformist)
        ratio = r_w / w_r if w_r else math.inf if r_w else 0.0
        c_rw, c_wr = counted_flips(conformist)
        counted = c_rw / c_wr if c_wr else math.inf if c_rw else 0.0
        lines.append(f"- right→wrong ÷ wrong→right flips, conformist world: counted for the answer (anti-conformity) "
                     f"{c_rw} ÷ {c_wr} = {counted:.2f} (goal ≤ 1/3: {verdict(counted <= 1 / 3)}); as shown in the "
                     f"replies {r_w} ÷ {w_r} = {ratio:.2f}")
    for world, rows in runs.items():
        diff, vote, debate = paired(rows, "debate"), figures(rows, "vote"), figures(rows, "debate")
        if diff and vote and debate and vote["tokens"]:
            tokens = debate["tokens"] / vote["tokens"]
            lines.append(f"- default − vote, {world}: {diff[0]:+.1f} pp [{diff[1]:+.1f}, {diff[2]:+.1f}] at "
                         f"{tokens:.2f}× the vote's billed tokens (goal: CI never below −1 pp, ≤ 1.2×: "
                         f"{verdict(diff[1] >= -1 and tokens <= 1.2)})")
    independent = runs.get("independent")
    if independent:
        share = sum(decided_after_round_1(r) for r in independent) / len(independent)
        line = f"- decided after round 1, independent world: {100 * share:.1f}% of items"
        if always and "selective.enabled" in switches:
            lost = 100 * ((figures(always, "debate") or {"accuracy": 0})["accuracy"] -
                          (figures(independent, "debate") or {"accuracy": 0})["accuracy"])
            line += f"; accuracy lost vs always debating (selective.enabled=false) {lost:+.1f} pp (goal ≥ 60%, " \
                    f"≤ 0.5 pp: {verdict(share >= 0.6 and lost <= 0.5)})"
        else:
            line += " (selective.enabled is not available here: the round-1 gate does not exist, nothing is decided " \
                    "after round 1; goal ≥ 60%: NOT met)"
        lines.append(line)
    strong = runs.get("strong_weak")
    if strong:
        later = strong[LEARNED_AFTER:]  # rows are in the order they were graded
        if figures(strong, "vote_learned") is None:
            lines.append("- learned weights after 200 graded items, strong/weak world: not available (no vote_learned "
                         "protocol in this conclave)")
        elif not later:
            lines.append(f"- learned weights, strong/weak world: needs more than {LEARNED_AFTER} items (use --items)")
        else:
            diff = paired(later, "vote_learned")
            assert diff is not None
            lines.append(f"- learned weights after {LEARNED_AFTER} graded items, strong/weak world: "
                         f"vote_learned − vote {diff[0]:+.1f} pp [{diff[1]:+.1f}, {diff[2]:+.1f}] "
                         f"over the {len(later)} later items "
                         f"(goal ≥ +5 pp: {verdict(diff[0] >= 5)})")
    if independent and baseline:
        now, before = figures(independent, "debate"), figures(baseline, "debate")
        if now and before and before["tokens"]:
            off = ", ".join(f"{s}=false" for s in switches) or "none: this conclave has none of the new switches"
            lines.append(f"- tokens per item, default answer protocol ÷ today's default (switched off: {off}), "
                         f"independent world: {now['tokens']:.0f} ÷ {before['tokens']:.0f} = "
                         f"{now['tokens'] / before['tokens']:.2f}×")
    return lines


# ---------------------------------------------------------------------------------------------- running evals

def environment(home: str, *, fake: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    if fake:
        env.update(FAKE_KEYS)
    env.update(CONCLAVE_HOME=home, CONCLAVE_PROGRESS="0")
    return env


async def conclave(args: Sequence[str], env: dict[str, str], cwd: str, *, capture: bool = True) -> tuple[int, str]:
    """Run ``python -m conclave ARGS``: (exit code, stdout); stderr and stdin (the cost gate's question) are the
    terminal's unless ``capture``."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE if capture else None,
        stdin=asyncio.subprocess.DEVNULL if capture else None, env=env, cwd=cwd)
    out, err = await process.communicate()
    if process.returncode != 0 and capture:
        sys.stderr.write(err.decode(errors="replace")[-3000:])
    return int(process.returncode or 0), out.decode()


async def available_switches(overrides: Sequence[str], env: dict[str, str], cwd: str) -> list[str]:
    """Those of :data:`NEW_SWITCHES` the composed configuration has (looked up anywhere in it by their last name)."""
    code, out = await conclave(["--cfg", "job", *overrides], env, cwd)
    if code != 0:
        return []
    config = yaml.safe_load(out) or {}
    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                dotted = f"{path}.{key}" if path else str(key)
                for switch in NEW_SWITCHES:
                    if dotted == switch or (dotted.endswith(f".{switch}") and switch not in found):
                        found.append(dotted if dotted == switch else switch)
                walk(value, dotted)

    walk(config, "")
    return [s for s in NEW_SWITCHES if s in found]


async def run_eval(run_id: str, items: int, extra: Sequence[str], env: dict[str, str], cwd: str,
                   concurrency: int, *, capture: bool = True, item_set: str = "arithmetic") -> list[dict[str, Any]]:
    args = ["eval", item_set, f"eval.n={items}", "eval.seed=25", f"eval.run_id={run_id}",
            f"eval.concurrency={concurrency}", "eval.sc_best=true", "mode=answer", *extra]
    code, _ = await conclave(args, env, cwd, capture=capture)
    path = Path(env["CONCLAVE_HOME"]) / "eval" / run_id / "items.jsonl"
    if not path.is_file():
        raise SystemExit(f"beat_the_vote: conclave eval {run_id} wrote no items (exit {code})")
    rows: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            rows[str(row["item_id"])] = row
    if code != 0:
        print(f"(conclave eval {run_id} exited {code}: failed items count as wrong)", file=sys.stderr)
    return list(rows.values())


async def simulated(args: argparse.Namespace) -> None:
    print(f"# Beat the vote — {NOTICE}\n")
    print(f"worlds: {', '.join(args.worlds)} · {args.items} item(s) per world · fake latency {args.latency}s")
    runs: dict[str, list[dict[str, Any]]] = {}
    baseline: list[dict[str, Any]] | None = None
    always: list[dict[str, Any]] | None = None
    switches: list[str] = []
    with tempfile.TemporaryDirectory(prefix="beat-the-vote-") as top:
        for name in args.worlds:
            # a home per world: learned weights learn from this world's graded history only (the seats are the
            # same in every world, their accuracies are not)
            home = os.path.join(top, name)
            os.makedirs(home)
            env = environment(home, fake=True)
            world = standard_world(name, latency=args.latency)
            async with FakeProviderServer() as fake:
                world.install(fake)
                overrides = [*fake.overrides(), *panel_overrides(world), "cost.auto_approve=true", *args.override]
                if not switches and name == args.worlds[0]:
                    switches = await available_switches(["mode=answer", *overrides], env, home)
                started = time.perf_counter()
                runs[name] = await run_eval(f"world-{name}", args.items, overrides, env, home, args.concurrency)
                wall = time.perf_counter() - started
                if "selective.enabled" in switches:
                    merge_judge(runs[name], await run_eval(f"world-{name}-judge", args.items,
                                                           [*overrides, *JUDGE_RUN], env, home, args.concurrency))
                print(*table(f"{name} world", runs[name]), sep="\n")
                print(f"(one `conclave eval` process: {wall:.0f} s wall, {len(runs[name]) / wall:.1f} items/s; "
                      f"{', '.join(JUDGE_PROTOCOLS)} from a second run with every item synthesised: "
                      f"{' '.join(JUDGE_RUN)})", flush=True)
                if name == "independent":
                    off = [f"{s}=false" for s in switches]
                    baseline = await run_eval("world-independent-today", args.items, [*overrides, *off], env, home,
                                              args.concurrency)
                    if "selective.enabled" in switches:
                        always = await run_eval("world-independent-always", args.items,
                                                [*overrides, "selective.enabled=false"], env, home, args.concurrency)
    print(*goals(runs, baseline, switches, always), sep="\n")
    print(f"\n{NOTICE}")


async def real(args: argparse.Namespace, home: str) -> None:
    print("# Beat the vote — a real panel (your overrides; paid calls)\n")
    env = environment(home, fake=False)
    here = os.getcwd()  # a relative --set path is the user's
    switches = await available_switches(["mode=answer", *args.override], env, here)
    run_id = f"beat-the-vote-{os.getpid()}"
    rows = await run_eval(run_id, args.items, args.override, env, here, args.concurrency, capture=False,
                          item_set=args.set)
    # the default answer protocol debates without a synthesis: a debated item has no judge answer, which is not
    # a wrong one, so those rows are left out
    if any(int(r.get("rounds_completed") or 0) > 1 and r.get("judge_status") != "completed" for r in rows):
        merge_judge(rows, [])
        print(f"({', '.join(JUDGE_PROTOCOLS)}: debated items were not synthesised; add "
              f"{' '.join('--override ' + o for o in JUDGE_RUN)} for them, paid)")
    print(*table("real panel", rows), sep="\n")
    print(*goals({"real panel": rows}, None, switches), sep="\n")
    print(f"\nthe run: conclave eval report {run_id} (CONCLAVE_HOME={home})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=500, help="items per world (default 500)")
    parser.add_argument("--quick", action="store_true", help="40 items per world: a smoke run")
    parser.add_argument("--worlds", nargs="+", choices=WORLDS, default=list(WORLDS))
    parser.add_argument("--latency", type=float, default=0.002, help="fake provider latency, seconds")
    parser.add_argument("--concurrency", type=int, default=8, help="eval.concurrency of each run")
    parser.add_argument("--real", action="store_true", help="run on a real panel named by --override")
    parser.add_argument("--set", default="arithmetic", help="with --real: the eval set (arithmetic, a .jsonl file, "
                        "gym:<task>); the worlds script arithmetic items")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a configuration override for every run (repeatable): the real panel, a switch")
    args = parser.parse_args()
    if args.quick:
        args.items = 40
    if args.real:
        given = [o.partition("=")[2] for o in args.override if o.startswith("home=")]
        home = Path(given[-1]).expanduser() if given else default_home()  # the rows stay where you keep them
        asyncio.run(real(args, str(home)))
    else:
        asyncio.run(simulated(args))


if __name__ == "__main__":
    main()
