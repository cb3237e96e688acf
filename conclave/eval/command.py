"""``conclave eval``: run an evaluation (``conclave eval SET [overrides…]``, ``-m`` to sweep), resume one, report.

    conclave eval [SET] [overrides…]            SET: a .jsonl file, `arithmetic` or `gym:<task>` (default arithmetic)
    conclave eval -m SET key=a,b,c [hydra/launcher=joblib]      a sweep: one run per value, one grouped report
    conclave eval resume RUN                   continue an interrupted run; finished items are not run again
    conclave eval report RUN|SWEEP [--format markdown|json|html]
"""

from __future__ import annotations

import glob
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from hydra.plugins.sweeper import Sweeper

from conclave.cli.commands.arguments import CommandParser
from conclave.cli.hydra_app import prepare_hydra, report_error, worst_exit
from conclave.cli.main import _split_question, hydra_quote
from conclave.cli.panel import offline_panel_blocked, panel_override
from conclave.compose import hydra_error_message
from conclave.config.home import default_home
from conclave.engine.cost.consent import decide_consent
from conclave.engine.cost.estimate import CostEstimate
from conclave.engine.interaction import Interaction
from conclave.errors import ConclaveError, UsageError
from conclave.eval import hydra_task
from conclave.eval import run_store as store
from conclave.eval.evaluate import new_run_id, remember
from conclave.eval.hydra_task import eval_entry
from conclave.eval.run_report import FORMATS, render, render_sweep

USAGE = __doc__ or ""


def run(argv: list[str]) -> int:
    if argv and argv[0] == "report":
        return report(argv[1:])
    if argv and argv[0] == "resume":
        return resume(argv[1:])
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE.strip())
        return 0
    return evaluate(argv)


def evaluate(argv: list[str]) -> int:
    """Compose the configuration with Hydra (overrides, sweeps, launchers) and run the eval task."""
    flags, overrides, spec = _split_question(argv)
    multirun = any(f in ("-m", "--multirun") for f in flags)
    extra = ["+eval=default"]
    if spec is not None:
        extra.append("eval.set=" + hydra_quote(spec))
    if not any(o.lstrip("+~").startswith("mode=") for o in overrides):
        extra.append("mode=answer")
    extra.append("question=eval")  # replaced by each item's question
    sweep_id = None
    if multirun:
        given = [o.partition("=")[2].strip("'\"") for o in overrides if o.startswith("eval.sweep_id=")]
        if given:
            sweep_id = given[-1]
        else:
            sweep_id = "sw" + new_run_id()[2:]
            extra.append(f"eval.sweep_id={sweep_id}")
    panel = panel_override(overrides, os.environ, default_home())
    everything = [*([panel] if panel else []), *extra, *overrides]
    if missing := offline_panel_blocked(everything):
        raise UsageError(missing)  # before any item runs, as a consultation stops
    # cost.auto_approve=true on the command line approves any estimate: the estimating pass would only print it
    # (each job still prints its own), so it is skipped
    approving = any(o.replace(" ", "").lower() in ("cost.auto_approve=true", "eval.approved=true") for o in overrides)
    if multirun and not approving:
        code = sweep_gate(flags, everything, sweep_id)
        if code is not None:
            return code
        everything.append("eval.approved=true")
    code = run_task(flags, everything)
    if sweep_id is not None and code != 2:
        # The report is printed here, by the parent, from the runs' files: a launcher's workers (Ray prefixes every
        # line they print with its pid) never write the result, and workers with their own homes are read there.
        home = default_home()
        runs = sweep_runs([home], sweep_id)
        elsewhere = not runs
        if elsewhere:
            runs = sweep_runs(worker_homes(everything, sweep_id), sweep_id)
        if runs:
            sys.stdout.write(render_sweep(sweep_id, runs, report_format(everything)))
            if any(r.get("status") != "complete" for r in runs):
                code = max(code, 1)
        if elsewhere and code in (0, 1):
            # the workers wrote to their own homes (home=…): their journals and index join this one by merging
            print(f"conclave eval: sweep {sweep_id} ran in other data homes; bring them here with "
                  f"`conclave index merge HOME…`, then `conclave eval report {sweep_id}`", file=sys.stderr)
    return code


def sweep_runs(homes: list[Path], sweep_id: str) -> list[dict[str, Any]]:
    """The runs of ``sweep_id`` found in ``homes``."""
    runs = [store.read_run(home, r) for home in homes for r in store.run_ids(home)]
    return [r for r in runs if r.get("sweep_id") == sweep_id]


def worker_homes(overrides: list[str], sweep_id: str) -> list[Path]:
    """The data homes a sweep's workers wrote to when ``home=`` names one per job (``…/${eval.sweep_id}/job-
    ${hydra:job.num}``): ``${eval.sweep_id}`` is this sweep, any other interpolation matches anything."""
    given = [o.partition("=")[2].strip("'\"") for o in overrides if o.lstrip("+").startswith("home=")]
    if not given or "${" not in given[-1]:
        return []
    pattern = re.sub(r"\$\{[^}]*\}", "*", given[-1].replace("${eval.sweep_id}", sweep_id))
    return [Path(p) for p in sorted(glob.glob(os.path.expanduser(pattern))) if Path(p).is_dir()]


def report_format(overrides: list[str]) -> str:
    """The sweep report's format: ``json`` with ``output.format=json`` (the last such override), else Markdown."""
    given = [o.partition("=")[2].strip("'\" ").lower() for o in overrides if o.startswith("output.format=")]
    return "json" if given and given[-1] == "json" else "markdown"


def sweep_gate(flags: list[str], overrides: list[str], sweep_id: str | None) -> int | None:
    """A sweep's whole estimate through the cost gate once, before any job runs: every job is composed and
    estimated in this process (Hydra's basic launcher, nothing spent), then the sum is approved, asked about or
    refused exactly like one run's. None: approved, go; else the exit code (1 refused, 2 a configuration error)."""
    # the user's launcher (joblib, Ray, SLURM) and its settings are for the real jobs; estimating runs here
    local = [o for o in overrides if not o.lstrip("+~").startswith(("hydra/launcher=", "hydra.launcher."))]
    hydra_task.ESTIMATES.clear()

    # The sweeper composes every job once to check the batch and once more to launch it; composing is most of
    # this pass's time, and launching finds the same errors, so the check is left to the real sweep.
    check = Sweeper.validate_batch_is_legal
    Sweeper.validate_batch_is_legal = lambda self, batch: None  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory(prefix="conclave-sweep-estimate-") as scratch:
            code = run_task(flags, [*local, "hydra/launcher=basic", "hydra/hydra_logging=disabled",
                                    f"hydra.sweep.dir={scratch}", "eval.estimate_only=true"])
    finally:
        Sweeper.validate_batch_is_legal = check  # type: ignore[method-assign]
    jobs = list(hydra_task.ESTIMATES)
    hydra_task.ESTIMATES.clear()
    if code != 0 or not jobs:
        return code or 1
    settings = jobs[0][0]
    whole = CostEstimate([call for _, estimate, _ in jobs for call in estimate.calls])
    totals = [estimate.total for _, estimate, _ in jobs]
    items = sum(n for _, _, n in jobs)
    if None in totals:
        shown = f"unknown (no price for {', '.join(whole.unknown_prices)})"
    else:
        low, high = min(totals), max(totals)
        each = f"${low:.4f}" if low == high else f"${low:.4f}–${high:.4f}"
        shown = f"{len(jobs)} job(s) × {each} per job = ${whole.total:.4f}"
    print(f"conclave eval: sweep {sweep_id}: {items} item(s) in {len(jobs)} job(s); estimated cost {shown} for "
          f"{len(whole.calls)} planned call(s)", file=sys.stderr)
    consent = decide_consent(whole, settings, Interaction.from_terminal())
    if not consent.approved:
        print(f"conclave eval: sweep not started: {consent.reason}", file=sys.stderr)
        return 1
    remember(consent, settings.home, sys.stderr)
    return None


def run_task(flags: list[str], overrides: list[str]) -> int:
    """Hand ``flags`` and ``overrides`` to Hydra with the eval task; configuration errors become one line, exit 2."""
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        prepare_hydra()
        saved = sys.argv
        sys.argv = [saved[0] if saved else "conclave", *flags, *overrides]
        try:
            eval_entry()
        finally:
            sys.argv = saved
    except ConclaveError as exc:
        report_error(exc)
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (2 if exc.code else 0)
    except Exception as exc:
        message = hydra_error_message(exc)
        if message is None:
            raise
        print(f"conclave: {message}", file=sys.stderr)
        return 2
    return worst_exit()


def resume(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave eval resume", description="Continue an interrupted run.")
    parser.add_argument("run_id")
    args = parser.parse_args(argv)

    run = store.read_run(default_home(), args.run_id)
    if run.get("status") == "complete":
        print(f"conclave eval: run {args.run_id} is complete; nothing to resume "
              f"(conclave eval report {args.run_id})", file=sys.stderr)
        return 0
    # a resumed run goes through the cost gate for what remains, even when its sweep was approved as a whole
    kept = [o for o in run.get("overrides") or [] if not o.startswith(("eval.run_id=", "eval.approved="))]
    return run_task([], [*kept, f"eval.run_id={args.run_id}"])


def report(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave eval report", description="Report an evaluation run or sweep.")
    parser.add_argument("run", help="a run id, a sweep id, or 'latest'")
    parser.add_argument("--format", default="markdown")
    args = parser.parse_args(argv)
    if args.format not in FORMATS:
        raise UsageError(f"--format: {args.format!r} is not one of: {', '.join(FORMATS)}")

    home = default_home()
    ids = store.run_ids(home)
    target = args.run
    if target == "latest":
        if not ids:
            raise UsageError(f"no eval runs under {store.eval_dir(home)}")
        target = max(ids, key=lambda r: str(store.read_run(home, r).get("started_at")))
    if target in ids:
        run = store.read_run(home, target)
        sys.stdout.write(render(run, _ordered(store.read_items(home, target)), args.format))
        return 0
    runs: list[dict[str, Any]] = [r for r in (store.read_run(home, i) for i in ids) if r.get("sweep_id") == target]
    if not runs:
        store.read_run(home, target)  # raises the one-line "not found" error listing known runs
    sys.stdout.write(render_sweep(target, runs, args.format))
    return 0


def _ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows in natural item-id order ("arith-0-2" before "arith-0-10"), whatever order they finished in."""
    def key(row: dict[str, Any]) -> list[Any]:
        return [(0, int(part), "") if part.isdigit() else (1, 0, part)
                for part in re.split(r"(\d+)", str(row["item_id"])) if part]

    return sorted(rows, key=key)
