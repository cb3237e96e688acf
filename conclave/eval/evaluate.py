"""Run an evaluation: one ``mode=answer`` consultation per item, every protocol scored from it, rows stored as
items finish. The whole run is estimated first and goes through the cost gate once; a run resumed with its id
skips every item already finished (nothing finished is paid twice)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, TextIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conclave.config.settings import Settings
from conclave.engine.aggregation import AggregationContext, Ballot
from conclave.engine.cost.consent import decide_consent, store_always_allow
from conclave.engine.cost.estimate import CostEstimate, estimate_cost
from conclave.engine.ids import config_hash, config_snapshot
from conclave.engine.inputs import prepare_inputs
from conclave.engine.interaction import Interaction
from conclave.engine.labels import JudgeLabels
from conclave.engine.rounds import Plan
from conclave.engine.run import Consultation
from conclave.engine.session import Session
from conclave.engine.session_layers import with_layers
from conclave.errors import ConfigError, UsageError
from conclave.eval import quality_arm
from conclave.eval import run_store as store
from conclave.eval.batch_rounds import BatchMode, BatchRounds
from conclave.eval.graded import GradedHistory
from conclave.eval.items import Item
from conclave.eval.protocols import (
    Capture,
    ItemResult,
    add_matched_vote,
    add_quality,
    add_sc_best,
    same_round_1,
    score,
    spent_in,
)
from conclave.eval.quality_arm import resume_point, round_one_calls
from conclave.eval.run_report import render
from conclave.eval.sources import SourceOptions, load
from conclave.eval.summary import run_columns, summarise
from conclave.events import EventBus
from conclave.providers.base import Provider, Usage
from conclave.providers.pool import ProviderPool
from conclave.quality.exit import max_plan
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.resume_points import load_resume_point

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
DEFAULT_ITEMS, DEFAULT_ITEMS_LOCAL = 20, 3
OBJECTIVE = r"^(single|vote|judge|debate|quality|vote_weighted|vote_learned|judge_pick|sc_best)_accuracy(_per_dollar)?$"


class EvalOptions(BaseModel):
    """The ``eval.*`` keys of ``conclave eval`` (Hydra overrides, sweepable like any other key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    set: Annotated[str, Field(min_length=1)] = "arithmetic"
    #: a benchmark file's column per field (question, answer, choices, id; null = the field's own name)
    columns: dict[str, str | list[str] | None] = Field(default_factory=dict)
    answer_format: str = "auto"  # how the gold answers are written (conclave.eval.sources.ANSWER_FORMATS)
    split: str | None = None  # a saved DatasetDict's split (null: test, or its only split)
    shuffle_choices: bool = False  # shuffle each item's choices (seeded): for files whose right choice is always first
    n: Annotated[int, Field(ge=0)] | None = None  # items; null = 20 (3 on the offline local panel); 0 = whole set
    seed: int = 0
    concurrency: Annotated[int, Field(ge=1, le=64)] = 4  # items in flight at once in this process
    run_id: str | None = None  # resume this run (or name a new one)
    sweep_id: str | None = None  # set by `conclave eval -m`: the runs of one sweep
    single_agent: str | None = None  # the agent scored as "single"; null = the first agent of the panel
    #: on resume, run again the items whose consultation failed (they are paid again); by default they stay as
    #: they are, counted wrong for the protocols they never reached
    retry_failed: bool = False
    #: what the task returns to a Hydra sweeper (hydra/sweeper=optuna): <protocol>_accuracy or
    #: <protocol>_accuracy_per_dollar; null = the exit code
    objective: Annotated[str, Field(pattern=OBJECTIVE)] | None = None
    #: the quality protocol's arm: auto, off, or {key: value, …} set on top of this configuration (quality_arm)
    quality: str | dict[str, Any] = "off"
    #: set by `conclave eval -m`: estimate_only — the sweep's first pass, which only estimates each job (nothing is
    #: spent); approved — the sweep's whole estimate went through the cost gate, so its jobs do not ask again
    estimate_only: bool = False
    approved: bool = False
    #: also score self-consistency at the debate's budget: extra independent round-1 samples of the panel until
    #: they make as many model calls as the full debate plans (paid: about the debate's calls again, per item)
    matched_vote: bool = False
    #: what the matched vote matches the debate on: billed tokens, or dollars (needs every model priced)
    matched_on: Literal["tokens", "dollars"] = "tokens"
    #: also score self-consistency of the best agent (highest learned weight from graded history; none: the
    #: single agent) at the debate's billed tokens: extra round-1 samples of that agent alone, until their tokens
    #: reach the debate's (paid: estimated as the best agent's round-1 calls that the debate's planned tokens hold)
    sc_best: bool = False
    #: run through the providers' batch APIs at their batch prices: true (a provider without one is refused),
    #: mixed (such a provider, and a request a batch failed, is asked interactively), false
    batch: bool | Literal["mixed"] = False
    #: seconds between two status requests of an open batch
    batch_poll_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    #: the most requests one batch holds (null: the provider's own limit); more are split into several batches
    batch_max_requests: Annotated[int, Field(ge=1)] | None = None
    #: this job's Hydra overrides, filled in by the task: `conclave eval resume` replays them, a sweep groups by them
    overrides: list[str] = Field(default_factory=list)


def options_from(data: dict[str, Any]) -> EvalOptions:
    try:
        return EvalOptions.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = "eval." + ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(EvalOptions.model_fields)
            raise ConfigError([f"{key}: unknown key; allowed: {allowed}"]) from None
        raise ConfigError([f"{key}: {err['msg'][0].lower() + err['msg'][1:]} (got {err.get('input')!r})"]) from None


@dataclass
class EvalRun:
    """What one evaluation run needs: its validated base settings, options and items."""

    settings: Settings
    options: EvalOptions
    items: list[Item]
    run_id: str
    local_panel: bool = False
    summary: dict[str, Any] | None = None  # set when the run ends
    #: the quality protocol's configuration (None: not run, for ``quality_off``), and its overrides
    arm: Settings | None = None
    arm_overrides: dict[str, Any] | None = None
    quality_off: str = ""
    reuse_round_1: bool = False  # the arm's round-1 calls are the base's: restored, not paid again
    extra_samples: int = 0  # the matched-budget vote's extra round-1 samples per item (set by the estimate)
    round_1_key: str | None = None  # what round 1 sends (set by the estimate): sweep points pair on it
    best_agent: str | None = None  # sc_best's agent (set by the estimate)
    best_samples: int = 0  # sc_best's most extra samples per item (set by the estimate)


#: re-samples compared with round 1 before an endpoint that returns them unchanged is called repeating
REPEAT_PROBE = 2


@dataclass
class MatchedBudget:
    """The matched vote's running balance over the run: each item draws round-1 samples while one more brings the
    run's matched total closer to the debates' (billed tokens, or dollars), so the run's ratio lands near 1."""

    on: str = "tokens"
    limit: int = 1  # samples per item at most (twice the planned number): the cost gate approved about that
    debate: float = 0.0
    vote: float = 0.0
    repeating: str | None = None  # why sampling stopped
    announced: bool = False
    copies: int = 0  # re-samples identical to their item's round 1
    varied: bool = False  # some re-sample differed: the endpoint samples, it never repeats itself

    def saw(self, same: bool, item_id: str) -> None:
        """Count one re-sample; the endpoint repeats itself when the run's first ``REPEAT_PROBE`` re-samples were
        all copies of round 1 (a sampling endpoint soon gives a different one)."""
        self.copies += same
        self.varied = self.varied or not same
        if not self.varied and self.copies >= REPEAT_PROBE and self.repeating is None:
            self.repeating = (f"the endpoint returned round 1 unchanged on its first {self.copies} re-samples "
                              f"(last on item {item_id}; temperature 0?): the matched vote stopped instead of "
                              "paying for copies")

    def size(self, data: dict[str, Any] | None) -> float:
        data = data or {}
        if self.on == "dollars":
            return float(data.get("cost") or 0.0)
        return float(int(data.get("input_tokens") or 0) + int(data.get("output_tokens") or 0))

    def more(self, item_debate: float, item_vote: float, per_sample: float) -> bool:
        gap = (self.debate + item_debate) - (self.vote + item_vote)
        return per_sample > 0 and abs(gap - per_sample) < abs(gap)

    def ratio(self) -> float | None:
        return self.vote / self.debate if self.debate else None


def prepare(settings: Settings, options: EvalOptions, plugins: Any) -> EvalRun:
    """Check the configuration for an evaluation and load the items (raises a one-line error)."""
    if settings.mode.strategy != "answer":
        raise ConfigError([f"mode: conclave eval scores final answers, which only mode=answer gives "
                           f"(got mode={settings.mode.strategy})"])
    single = options.single_agent or next(iter(settings.agents))
    if single not in settings.agents:
        raise ConfigError([f"eval.single_agent: {single!r} is not on the panel; allowed: {', '.join(settings.agents)}"])
    local = all(a.provider == "local" for a in settings.agents.values())
    n = options.n if options.n is not None else (DEFAULT_ITEMS_LOCAL if local else DEFAULT_ITEMS)
    items = load(options.set, n=n, seed=options.seed, options=SourceOptions(
        options.columns, options.answer_format, options.split, options.shuffle_choices))
    run_id = store.check_run_id(options.run_id) if options.run_id else new_run_id()
    if not any(o.lstrip("+~").startswith("quality.stage=") for o in options.overrides):
        # the protocols compare fixed debates: the quality detectors record what they would do (shadow) without
        # adding rounds, unless quality.stage is given on the command line
        settings = settings.model_copy(update={"quality": settings.quality.model_copy(update={"stage": "shadow"})})

    arm_overrides, base_overrides, off = quality_arm.resolve(options.quality, settings, options.overrides)
    settings = quality_arm.apply(settings, base_overrides, "eval.quality")
    arm = quality_arm.apply(settings, arm_overrides, "eval.quality") if arm_overrides else None
    if arm is not None and arm.mode.strategy != "answer":
        raise ConfigError([f"eval.quality: mode: the quality protocol scores final answers, which only mode=answer "
                           f"gives (got mode={arm.mode.strategy})"])
    return EvalRun(settings, options.model_copy(update={"single_agent": single, "n": n}), items, run_id, local,
                   arm=arm, arm_overrides=arm_overrides or None, quality_off=off)


def objective(evaluation: EvalRun) -> float:
    """The value ``eval.objective`` names, from the finished run (accuracy per dollar: accuracy ÷ cost per item;
    0 when the cost is unknown or nothing was spent, so a sweeper never prefers a run it cannot price)."""
    name = evaluation.options.objective or ""
    protocol, _, rest = name.partition("_accuracy")
    figures = ((evaluation.summary or {}).get("protocols") or {}).get(protocol) or {}
    accuracy = float(figures.get("accuracy") or 0.0)
    if not rest:
        return accuracy
    per_item = figures.get("cost_per_item")
    return accuracy / per_item if per_item else 0.0


def new_run_id() -> str:
    return datetime.now(UTC).strftime("ev-%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def run(evaluation: EvalRun, plugins: Any, interaction: Any, *, quiet: bool = False, out: TextIO | None = None,
        err: TextIO | None = None) -> int:
    """Run (or resume) the evaluation to its end and print its report (``quiet``: only its verdict line, on
    stderr — a sweep prints one report for all its runs); the exit code."""
    try:
        return asyncio.run(run_async(evaluation, plugins, interaction, quiet=quiet, out=out, err=err))
    except KeyboardInterrupt:
        print(f"conclave eval: interrupted; finished items are saved — resume with: conclave eval resume "
              f"{evaluation.run_id}", file=err or sys.stderr)
        return EXIT_INTERRUPTED


async def run_async(ev: EvalRun, plugins: Any, interaction: Any, *, quiet: bool = False, out: TextIO | None = None,
                    err: TextIO | None = None) -> int:
    """:func:`run` inside a running event loop, holding the run's lock throughout: its ``run.json`` says
    ``running`` only while this process holds it, so readers see a killed run as interrupted."""
    with store.running(ev.settings.home, ev.run_id):
        return await _run_locked(ev, plugins, interaction, quiet=quiet, out=out, err=err)


async def _run_locked(ev: EvalRun, plugins: Any, interaction: Any, *, quiet: bool, out: TextIO | None,
                      err: TextIO | None) -> int:
    out, err = out or sys.stdout, err or sys.stderr

    home = ev.settings.home
    run = _load_or_start(ev)
    done = {row["item_id"]: row for row in store.read_items(home, ev.run_id)
            if not ev.options.retry_failed or row.get("status") in ("complete", "completed_degraded")}
    todo = [item for item in ev.items if item.id not in done]
    if ev.local_panel:
        print("conclave eval: offline panel on the local model — a 270M model's accuracy is not evidence about "
              "debate; it only shows the harness working. Set a provider key for a real evaluation.", file=err)
    batching = await batch_panel(ev, plugins) if ev.options.batch else None
    estimate = await estimate_run(ev.settings, todo, plugins, ev, batch=batching)
    partners = sweep_partners(ev)
    if partners:
        print(f"conclave eval: paired sweep point: {sum(1 for i in todo if i.id in partners)} item(s) restore their "
              f"round 1 from an earlier point of sweep {ev.options.sweep_id} (not re-sampled, not re-paid)", file=err)
        estimate = await estimate_run(ev.settings, todo, plugins, ev, paired=set(partners), batch=batching)
    total = estimate.total
    shown = "unknown (a model has no price)" if total is None else f"${total:.4f}"
    interactive = None
    if batching is not None:
        interactive = await interactive_estimate(ev.settings, plugins, estimate)
        shown += (" at batch prices (interactive: " + ("unknown" if interactive is None else f"${interactive:.4f}")
                  + (f", ratio {total / interactive:.3f})" if total is not None and interactive else ")"))
    print(f"conclave eval: run {ev.run_id}: {len(todo)} of {len(ev.items)} item(s) to run "
          f"({len(done)} already finished); estimated cost {shown} for {len(estimate.calls)} planned call(s)",
          file=err)
    if ev.options.approved:
        print("conclave eval: approved with its sweep's whole estimate", file=err)
    else:
        consent = decide_consent(estimate, ev.settings, interaction)
        if not consent.approved:
            print(f"conclave eval: run not started: {consent.reason}", file=err)
            return EXIT_FAILED
        remember(consent, home, err)
    snapshot = config_snapshot(ev.settings, "")
    run.update(status="running", pid=os.getpid(), estimated_cost=total, config_hash=config_hash(snapshot),
               local_panel=ev.local_panel, quality_overrides=ev.arm_overrides, quality_off=ev.quality_off or None,
               quality_reused_round_1=None if ev.arm is None else ev.reuse_round_1, round_1_key=ev.round_1_key)
    if batching is not None:
        run.update(batch_mode=batching, estimated_interactive_cost=interactive)
    store.write_run(home, run)
    store.index_run(home, run)

    # Every item's consultation was approved as part of the whole run's estimate.
    cost = ev.settings.cost.model_copy(update={"auto_approve": True})
    base = ev.settings.model_copy(update={"cost": cost})
    arm = None if ev.arm is None else ev.arm.model_copy(update={"cost": ev.arm.cost.model_copy(
        update={"auto_approve": True})})
    recorder = Recorder(home)
    # the learned votes' graded history: read once, then each item added as it is indexed (not re-read per item)
    graded = GradedHistory(home)
    # batched, every item is in flight at once: a round of all of them is one batch per provider
    semaphore = asyncio.Semaphore(max(1, len(todo)) if batching else ev.options.concurrency)
    run_pool = ProviderPool(base, plugins)
    rounds = None if batching is None else BatchRounds(home, ev.run_id, batching, err, run_pool.provider,
                                                       poll_s=ev.options.batch_poll_s,
                                                       max_requests=ev.options.batch_max_requests)
    finished = len(done)
    started = time.monotonic()
    order = list(ev.settings.agents)
    single = ev.options.single_agent or order[0]
    prices = "free" if ev.local_panel else "unknown" if total is None else "known"
    matched = None
    if ev.options.matched_vote:
        if ev.options.matched_on == "dollars" and prices != "known":
            raise ConfigError(["eval.matched_on: dollars needs every model priced; allowed here: tokens"])
        matched = MatchedBudget(on=ev.options.matched_on, limit=max(2 * ev.extra_samples, REPEAT_PROBE))

    async def one(item: Item) -> None:
        nonlocal finished
        async with semaphore:
            try:
                result = await run_item(item, base, plugins, recorder, order, single, arm, ev.reuse_round_1,
                                        matched, partners.get(item.id),
                                        best=ev.best_agent if ev.options.sc_best else None,
                                        best_samples=ev.best_samples,
                                        batch=None if rounds is None else rounds.for_item(item.id),
                                        seed=item_seed(ev.run_id, item.id), graded=graded)
            finally:
                if rounds is not None:
                    rounds.item_done(item.id)
        if matched is not None and matched.repeating and not matched.announced:
            matched.announced = True
            print(f"conclave eval: matched vote stopped: {matched.repeating}", file=err, flush=True)
        row = result.as_row()
        if rounds is not None:  # what its calls cost at batch prices, and would have cost interactively
            billed, equivalent = rounds.per_item.get(item.id, [0.0, 0.0])
            row.update(batch_cost=round(billed, 8), interactive_equivalent_cost=round(equivalent, 8))
        store.append_item(home, ev.run_id, row, durable=rounds is None)  # batched: synced at each barrier
        graded.forget(ev.run_id, item.id)  # the row it replaces, when a failed item is run again
        try:
            store.index_item(home, ev.run_id, row)
        except Exception as exc:  # the file is the truth; `conclave index rebuild` repairs the index
            print(f"conclave eval: warning: index write failed ({exc}); rows are safe in {store.eval_dir(home)}",
                  file=err)
        graded.learn(ev.run_id, item.id)  # the later items' learned votes count it from now on, as read from the index
        done[item.id] = row
        finished += 1
        marks = " ".join(f"{p} {'✓' if o.correct else '✗'}" for p, o in result.protocols.items()
                         if not p.startswith("single_"))  # the per-agent baselines are in the report
        print(f"  [{finished}/{len(ev.items)}] {item.id}: {marks}  ({result.status})", file=err, flush=True)

    try:
        async with run_pool:
            if rounds is not None:
                rounds.resume()
            async with asyncio.TaskGroup() as group:
                for item in todo:
                    group.create_task(one(item))
            if rounds is not None:
                await rounds.drain()
    finally:
        recorder.close()
        graded.close()
        if rounds is not None:
            store.sync_items(home, ev.run_id)  # the rows written since the last barrier
        rows = [done[i.id] for i in ev.items if i.id in done]
        complete = len(rows) == len(ev.items)
        summary = ev.summary = summarise(rows, prices=prices)
        if matched is not None:
            summary.update(matched_on=matched.on, matched_ratio=matched.ratio(), matched_stopped=matched.repeating)
        if rounds is not None:
            summary["batch"] = batch_summary(rows, rounds.figures.as_dict())
        run.update(status="complete" if complete else "interrupted",
                   completed_at=_now() if complete else None,
                   wall_s=round(float(run.get("wall_s") or 0.0) + time.monotonic() - started, 3),
                   summary=summary, **run_columns(summary))
        store.write_run(home, run)
        try:
            store.index_run(home, run)
        except Exception as exc:
            print(f"conclave eval: warning: index write failed ({exc})", file=err)

    if matched is not None:
        shown_ratio = "unknown" if matched.ratio() is None else f"{matched.ratio():.3f}"
        print(f"conclave eval: matched vote: {shown_ratio}× the debate's billed {matched.on} "
              f"({'stopped: a repeating endpoint' if matched.repeating else 'goal 0.95–1.05'})", file=err)
    if summary["with_failures"]:
        counts = ", ".join(f"{name} {p['failed']} failed, {p['skipped']} skipped"
                           for name, p in summary["protocols"].items()
                           if name != "single_best" and (p.get("failed") or p.get("skipped")))
        print(f"conclave eval: run {ev.run_id} has failures: {summary['failed_items']} item(s) failed ({counts}); "
              f"the headline is on items every compared protocol completed", file=err)
    if rounds is not None:
        figures = summary["batch"]
        ratio = "unknown" if figures["ratio"] is None else f"{figures['ratio']:.3f}"
        print(f"conclave eval: batch spend ${figures['batch_cost']:.4f}, interactive equivalent "
              f"${figures['interactive_cost']:.4f} (ratio {ratio}); {figures['batches']} batch(es), at most "
              f"{figures['most_batches_per_provider_per_wave']} per provider per round", file=err)
        for lost in figures["lost"]:
            print(f"conclave eval: batch {lost['batch_id']} {lost['state']}: item(s) {', '.join(lost['items'])}",
                  file=err)
    if quiet:
        print(f"conclave eval: run {ev.run_id} ({len(rows)} item(s)): {summary['verdict_line']}", file=err)
    else:
        out.write(render(run, rows, "json" if ev.settings.output.format == "json" else "markdown"))
        out.flush()
    return EXIT_OK if summary["failed_items"] == 0 else EXIT_FAILED


def item_seed(run_id: str, item_id: str) -> int:
    """The judge labels' shuffle seed of an item's consultation, the same in every run of the eval run: a resumed
    batched run asks exactly what the killed one asked, so its journaled batches answer it."""
    return int.from_bytes(hashlib.sha256(f"{run_id}\x00{item_id}".encode()).digest()[:4], "big")


async def batch_panel(ev: EvalRun, plugins: Any) -> BatchMode:
    """``eval.batch``'s mode, once every provider of the panel and judge has a batch API (``mixed``: those
    without one are asked interactively); raises a one-line configuration error naming one that has none."""
    mode: BatchMode = "mixed" if ev.options.batch == "mixed" else "true"
    if mode == "mixed":
        return mode
    names = sorted({a.provider for a in ev.settings.agents.values()} | {ev.settings.judge.provider})
    async with ProviderPool(ev.settings, plugins) as pool:
        for name in names:
            if pool.provider(name).batch_client() is None:
                raise ConfigError([f"eval.batch: provider {name} ({pool.provider(name).endpoint()}) has no batch "
                                   f"API; allowed: eval.batch=mixed (its calls interactive), or false"])
    return mode


async def interactive_estimate(settings: Settings, plugins: Any, estimate: CostEstimate) -> float | None:
    """What the estimate's planned calls would cost through the interactive APIs (None: a model has no price)."""
    total = 0.0
    async with ProviderPool(settings, plugins) as pool:
        for call in estimate.calls:
            cost = pool.interactive_cost(call.provider, call.model, Usage(
                call.input_tokens, call.output_tokens, call.cached_input_tokens, call.cache_write_tokens))
            if cost is None:
                return None
            total += cost
    return round(total, 8)


def batch_summary(rows: Sequence[dict[str, Any]], figures: dict[str, Any]) -> dict[str, Any]:
    """The run's batch figures: spend and its interactive equivalent summed from the item rows (so a reader
    recomputes them), the rest as this process counted them."""
    billed = round(math.fsum(float(r.get("batch_cost") or 0.0) for r in rows), 8)
    equivalent = round(math.fsum(float(r.get("interactive_equivalent_cost") or 0.0) for r in rows), 8)
    return {**figures, "batch_cost": billed, "interactive_cost": equivalent,
            "ratio": round(billed / equivalent, 4) if equivalent else None}


async def run_item(item: Item, settings: Settings, plugins: Any, recorder: Any, order: Sequence[str],
                   single: str, arm: Settings | None = None, reuse: bool = False,
                   matched: MatchedBudget | None = None, paired: dict[str, Any] | None = None,
                   best: str | None = None, best_samples: int = 0, batch: Any = None,
                   seed: int | None = None, graded: GradedHistory | None = None) -> ItemResult:
    """One consultation on ``item``, journaled and indexed like any other, scored for every protocol; with
    ``arm``, a second consultation (the quality protocol) continues from the first one's round 1 (``reuse``) or
    runs whole; with ``matched``, round-1 samples for the vote at the debate's budget; with ``paired`` (a sweep
    point's own row for this item), round 1 is restored from that consultation's journal instead of paid again."""
    first = plugins.strategies.get(settings.mode.strategy).plan[0].name
    start = restored_round_1(settings.home, paired, first) if paired else None
    capture = Capture()
    if start is None and seed is not None:
        start = {"shuffle_seed": seed}
    consultation = Consultation(
        asking(settings, item), plugins=plugins,
        interaction=Interaction.non_interactive(), subscribers=[capture], recorder=recorder,
        resume_from=start, batch=batch,
    )
    base = (await consultation.run()).as_dict()
    if start and paired:
        # the protocols cost what their rounds cost where round 1 was paid; this run spent nothing on it
        capture.rounds[1] = {**capture.rounds.get(1, {}), "cost": paired.get("vote_cost"),
                             "input_tokens": int(paired.get("vote_tokens") or 0), "output_tokens": 0,
                             "duration_s": float(paired.get("vote_wall_s") or 0.0)}
        for agent in order:
            capture.agents[(1, agent)] = {"cost": paired.get(f"single_{agent}_cost"),
                                          "input_tokens": int(paired.get(f"single_{agent}_tokens") or 0),
                                          "duration_s": float(paired.get(f"single_{agent}_wall_s") or 0.0)}
    scored = score(item, base, capture, order, single, home=settings.home, graded=graded)
    if start and paired:
        scored.spent["debate"] = spent_in(capture, skip=(1,))
        scored.round_1_from = str(paired.get("run_id"))
    if matched is not None:
        await draw_matched(scored, settings, plugins, recorder, item, base, capture, matched, batch)
    if best is not None:
        await _self_consistency_of_best(item, settings, plugins, recorder, scored, capture, best, best_samples,
                                        batch)
    if arm is None:
        return scored
    fork: dict[str, Any] | None = {}
    if reuse:
        fork = resume_point(base, capture, first)
    if fork is None:  # the base consultation has no round 1 to continue from: nothing to compare
        add_quality(scored, None, None, capture, reuse)
        return scored
    arm_capture = Capture()
    arm_run = Consultation(
        asking(arm, item), plugins=plugins,
        interaction=Interaction.non_interactive(), subscribers=[arm_capture], recorder=recorder, resume_from=fork,
        batch=batch,
    )
    add_quality(scored, (await arm_run.run()).as_dict(), arm_capture, capture, reuse)
    return scored


async def draw_matched(scored: ItemResult, settings: Settings, plugins: Any, recorder: Any, item: Item,
                       base: dict[str, Any], capture: Capture, matched: MatchedBudget, batch: Any = None) -> None:
    """Draw independent round-1 samples of the panel, one at a time, while one more brings the run's matched
    vote closer to the debates' billed tokens (or dollars); stop, for this item and the rest of the run, when the
    first samples repeat round 1 exactly."""
    one_round = asking(settings, item).model_copy(update={"rounds": 1, "quick": False})
    debate = sum(matched.size(d) for d in capture.rounds.values())
    vote = matched.size(capture.rounds.get(1))
    per_sample = vote
    samples: list[dict[str, Any]] = []
    captures: list[Capture] = []
    while matched.repeating is None and len(samples) < matched.limit and matched.more(debate, vote, per_sample):
        sample_capture = Capture()
        sample = (await Consultation(one_round, plugins=plugins, interaction=Interaction.non_interactive(),
                                     subscribers=[sample_capture], recorder=recorder, batch=batch).run()).as_dict()
        samples.append(sample)
        captures.append(sample_capture)
        vote += matched.size(sample_capture.rounds.get(1))
        matched.saw(same_round_1(sample, base), item.id)
    skipped = matched.repeating is not None
    if not skipped:
        matched.debate += debate
        matched.vote += vote
    add_matched_vote(scored, samples, captures, capture, skipped=skipped)


def restored_round_1(home: Any, paired: dict[str, Any], first_round_type: str) -> dict[str, Any] | None:
    """The round-1 answers of a sweep's earlier point, read from that consultation's journal, as answers already
    paid for; None when its journal has no usable round 1."""
    try:
        point = load_resume_point(StoreLayout(Path(home)), str(paired["consultation_id"]), resumable=False)
    except Exception:
        return None
    round_1 = point.resume_from.get("round_1") or {}
    if not round_1:
        return None
    return {"interrupted": {"round_number": 1, "artifacts": [
                {"agent": name, "artifact": artifact, "round_type": first_round_type}
                for name, artifact in round_1.items()]},
            "labels": point.resume_from.get("labels") or {}, "shuffle_seed": point.resume_from.get("shuffle_seed")}


def sweep_partners(ev: EvalRun) -> dict[str, dict[str, Any]]:
    """item id → the row of the sweep's earliest other point that paid its own round 1 on the same item with the
    same round-1 calls (empty outside a sweep)."""
    if not ev.options.sweep_id or ev.round_1_key is None:
        return {}
    home = ev.settings.home
    points = []
    for run_id in store.run_ids(home):
        if run_id == ev.run_id:
            continue
        other = store.read_run(home, run_id)
        if other.get("sweep_id") == ev.options.sweep_id and other.get("round_1_key") == ev.round_1_key:
            points.append(other)
    questions = {item.id: item.question for item in ev.items}
    partners: dict[str, dict[str, Any]] = {}
    for other in sorted(points, key=lambda r: str(r.get("started_at") or "")):
        for row in store.read_items(home, other["run_id"]):
            item_id = str(row.get("item_id"))
            if item_id in partners or row.get("round_1_from") or questions.get(item_id) != row.get("question"):
                continue
            if row.get("vote_status", "completed") == "completed" and row.get("consultation_id"):
                partners[item_id] = {**row, "run_id": other["run_id"]}
    return partners


def best_agent(settings: Settings, fallback: str, plugins: Any) -> str:
    """The agent with the highest learned weight from the graded history in the index (the ``learned``
    aggregator's), or ``fallback`` when there is no graded history."""
    ballots = [Ballot(name, a.persona, a.provider, a.model, "", None) for name, a in settings.agents.items()]
    found = plugins.aggregators.get("learned").aggregate(ballots, [[i] for i in range(len(ballots))],
                                                        AggregationContext(home=settings.home))
    if not any(found.basis.values()):
        return fallback
    return max(ballots, key=lambda b: (found.weights.get(b.agent, 0.0), b.agent == fallback)).agent


async def _self_consistency_of_best(item: Item, settings: Settings, plugins: Any, recorder: Any,
                                    scored: ItemResult, capture: Capture, best: str, most: int,
                                    batch: Any = None) -> None:
    """Sample the best agent alone (panels of 2-5 copies of it, rounds=1) until its round-1 tokens reach the
    debate's billed tokens (at most ``most`` extra samples, the estimate's), and score the vote over its answers
    (``sc_best``)."""
    target = scored.protocols["debate"].tokens
    first = capture.agents.get((1, best), {})
    spent = int(first.get("input_tokens") or 0) + int(first.get("output_tokens") or 0)  # the base's own answer
    per_call = max(1, spent)
    spec = settings.agents[best]
    samples, captures, drawn = [], [], 0
    while spent < target and drawn < most:
        size = min(5, most - drawn, max(2, -(-(target - spent) // per_call)))  # a panel has 2 to 5 agents
        if size < 2:
            break
        copies = {f"{best}_{k + 1}": spec for k in range(size)}
        one_round = asking(settings, item).model_copy(update={"rounds": 1, "quick": False, "agents": copies})
        captures.append(Capture())
        samples.append((await Consultation(one_round, plugins=plugins, interaction=Interaction.non_interactive(),
                                           subscribers=[captures[-1]], recorder=recorder,
                                           batch=batch).run()).as_dict())
        used = captures[-1].rounds.get(1) or {}
        spent += int(used.get("input_tokens") or 0) + int(used.get("output_tokens") or 0)
        drawn += size
    add_sc_best(scored, best, samples, captures, capture)


def asking(settings: Settings, item: Item) -> Settings:
    """``settings`` for ``item``'s consultation: its prompt (a multiple-choice item's options included) and, for a
    multiple-choice item, answers constrained to its option letters."""
    update: dict[str, Any] = {"question": item.prompt}
    if item.choices:
        options = {**settings.mode.options, "choices": item.letters}
        update["mode"] = settings.mode.model_copy(update={"options": options})
    return settings.model_copy(update=update)


def remember(consent: Any, home: Any, err: TextIO) -> None:
    """The user answered "always": store the new ``cost.always_allow_under`` in the user settings."""
    if consent.new_threshold is not None:
        path = store_always_allow(home, consent.new_threshold)
        print(f"conclave eval: cost.always_allow_under={consent.new_threshold:.2f} saved in {path}", file=err)


async def estimate_run(settings: Settings, items: Sequence[Item], plugins: Any, ev: EvalRun | None = None,
                       paired: set[str] | None = None, batch: BatchMode | None = None) -> Any:
    """The cost estimate of every planned call of every item: the engine's own per-consultation estimate, summed;
    with a quality arm (``ev.arm``), its calls too — round 1 left out when the arm reuses the base's, which this
    decides and records in ``ev.reuse_round_1``."""
    strategy = plugins.strategies.get(settings.mode.strategy)(settings.mode.options)
    bus = EventBus("eval-estimate")
    labels = JudgeLabels(settings.agents, 0, None)
    context = ""
    if settings.context or settings.project:
        context = prepare_inputs(settings, Interaction.non_interactive()).context
    total = CostEstimate()
    arm = ev.arm if ev is not None else None
    # batched, each call is priced at its provider's batch price (``mixed``: those without a batch API, interactive)
    route = PricedAsBatch() if batch else None
    async with ProviderPool(settings, plugins, bus, batch=route) as pool:
        for item in items:
            session = with_layers(Session(settings=settings, plugins=plugins, strategy=strategy, pool=pool,
                                          bus=bus, labels=labels, question=item.prompt, context_text=context))
            # every round an item's debate may play, cross-examination repeats up to exit.round_cap included
            longest = Plan(max_plan(session.plan.types, session.exit_limits()))
            whole = estimate_cost(session, longest.numbers(), plan=longest)
            if ev is not None and ev.round_1_key is None:  # what round 1 sends: sweep points pair on it
                calls = json.dumps([list(c) for c in round_one_calls(session)], ensure_ascii=False)
                ev.round_1_key = hashlib.sha256(calls.encode("utf-8")).hexdigest()
            # a paired sweep point restores round 1 from an earlier point: its calls are not paid again
            total.calls.extend(whole.only([n for n in longest.numbers() if n != 1]).calls
                               if paired and item.id in paired else whole.calls)
            if ev is not None and ev.options.matched_vote:
                round_one = whole.only([1])
                if not ev.extra_samples:  # about as many billed tokens as the debate plans
                    ratio = _billed(whole) / max(1, _billed(round_one))
                    ev.extra_samples = max(1, -(-int(ratio * 100) // 100) - 1)
                for _ in range(ev.extra_samples):
                    total.calls.extend(round_one.calls)
            if ev is not None and ev.options.sc_best:
                if ev.best_agent is None:
                    ev.best_agent = best_agent(settings, ev.options.single_agent or next(iter(settings.agents)),
                                               plugins)
                # as many best-agent round-1 calls as the debate's planned tokens hold (planned output is each
                # call's cap, so this bounds what the debate bills)
                best_call = [c for c in whole.only([1]).calls if c.agent == ev.best_agent][:1]
                per_call = max(1, sum(c.input_tokens + c.output_tokens for c in best_call))
                samples = -(-(whole.input_tokens + whole.output_tokens) // per_call)
                ev.best_samples = max(ev.best_samples, samples)
                total.calls.extend(best_call * samples)
        if arm is not None and ev is not None:
            arm_strategy = plugins.strategies.get(arm.mode.strategy)(arm.mode.options)
            async with ProviderPool(arm, plugins, bus) as arm_pool:
                for index, item in enumerate(items or ev.items[:1]):
                    base_session = with_layers(Session(
                        settings=settings, plugins=plugins, strategy=strategy, pool=pool, bus=bus, labels=labels,
                        question=item.prompt, context_text=context))
                    arm_session = with_layers(Session(
                        settings=arm, plugins=plugins, strategy=arm_strategy, pool=arm_pool, bus=bus, labels=labels,
                        question=item.prompt, context_text=context))
                    if index == 0:  # the same rule for every item: only the question differs, in both alike
                        ev.reuse_round_1 = round_one_calls(base_session) == round_one_calls(arm_session)
                    if items:
                        first = 2 if ev.reuse_round_1 else 1
                        arm_longest = Plan(max_plan(arm_session.plan.types, arm_session.exit_limits()))
                        numbers = [n for n in arm_longest.numbers() if n >= first]
                        total.calls.extend(estimate_cost(arm_session, numbers, plan=arm_longest).calls)
    return total


class PricedAsBatch:
    """The estimate's batch route: it sends nothing, it only says which providers' calls are batch-priced."""

    def batches(self, provider: Provider) -> bool:
        return provider.batch_client() is not None

    async def complete(self, provider: Provider, request: Any, round_number: int) -> Any:
        raise RuntimeError("the estimate asks no model")


def _billed(estimate: Any) -> int:
    return int(estimate.input_tokens or 0) + int(estimate.output_tokens or 0)


def _load_or_start(ev: EvalRun) -> dict[str, Any]:
    home = ev.settings.home
    definition = {"set_spec": ev.options.set, "seed": ev.options.seed, "items": len(ev.items)}
    if (store.run_dir(home, ev.run_id) / "run.json").is_file():
        run = store.read_run(home, ev.run_id)
        for key, value in definition.items():
            if run.get(key) != value:
                raise UsageError(f"eval.run_id: run {ev.run_id} was started with {key}={run.get(key)!r}, "
                                 f"not {value!r}; resume it with its own set (conclave eval resume {ev.run_id})")
        return run
    agents = {name: {"persona": a.persona, "provider": a.provider, "model": a.model}
              for name, a in ev.settings.agents.items()}
    return {
        "run_id": ev.run_id, "sweep_id": ev.options.sweep_id, **definition, "status": "starting",
        "started_at": _now(), "mode": ev.settings.mode.strategy, "panel": agents,
        "judge": f"{ev.settings.judge.provider}/{ev.settings.judge.model}",
        "overrides": list(ev.options.overrides),
        "single_agent": ev.options.single_agent, "n": ev.options.n,
        "local_panel": ev.local_panel, "rounds": ev.settings.planned_rounds, "pid": os.getpid(),
    }


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
