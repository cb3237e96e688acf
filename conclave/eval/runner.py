"""Run an evaluation: one ``mode=answer`` consultation per item, every protocol scored from it, rows stored as
items finish. The whole run is estimated first and goes through the cost gate once; a run resumed with its id
skips every item already finished (nothing finished is paid twice)."""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, TextIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conclave.config import Settings
from conclave.errors import ConfigError, UsageError
from conclave.eval import store
from conclave.eval.items import Item
from conclave.eval.protocols import Capture, ItemResult, score
from conclave.eval.sources import SourceOptions, load
from conclave.eval.summary import run_columns, summarise

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
DEFAULT_ITEMS, DEFAULT_ITEMS_LOCAL = 20, 3
OBJECTIVE = r"^(single|vote|judge|debate|quality)_accuracy(_per_dollar)?$"


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
    from conclave.eval import quality_arm

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
    """:func:`run` inside a running event loop."""
    out, err = out or sys.stdout, err or sys.stderr
    from conclave.engine.consent import decide_consent
    from conclave.engine.ids import config_hash, config_snapshot
    from conclave.store.recorder import Recorder

    home = ev.settings.home
    run = _load_or_start(ev)
    done = {row["item_id"]: row for row in store.read_items(home, ev.run_id)
            if not ev.options.retry_failed or row.get("status") in ("complete", "completed_degraded")}
    todo = [item for item in ev.items if item.id not in done]
    if ev.local_panel:
        print("conclave eval: offline panel on the local model — a 270M model's accuracy is not evidence about "
              "debate; it only shows the harness working. Set a provider key for a real evaluation.", file=err)
    estimate = await estimate_run(ev.settings, todo, plugins, ev)
    total = estimate.total
    shown = "unknown (a model has no price)" if total is None else f"${total:.4f}"
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
    run.update(status="running", estimated_cost=total, config_hash=config_hash(snapshot), local_panel=ev.local_panel,
               quality_overrides=ev.arm_overrides, quality_off=ev.quality_off or None,
               quality_reused_round_1=None if ev.arm is None else ev.reuse_round_1)
    store.write_run(home, run)
    store.index_run(home, run)

    # Every item's consultation was approved as part of the whole run's estimate.
    cost = ev.settings.cost.model_copy(update={"auto_approve": True})
    base = ev.settings.model_copy(update={"cost": cost})
    arm = None if ev.arm is None else ev.arm.model_copy(update={"cost": ev.arm.cost.model_copy(
        update={"auto_approve": True})})
    recorder = Recorder(home)
    semaphore = asyncio.Semaphore(ev.options.concurrency)
    finished = len(done)
    started = time.monotonic()
    order = list(ev.settings.agents)
    single = ev.options.single_agent or order[0]

    async def one(item: Item) -> None:
        nonlocal finished
        async with semaphore:
            result = await run_item(item, base, plugins, recorder, order, single, arm, ev.reuse_round_1,
                                    ev.extra_samples)
        row = result.as_row()
        store.append_item(home, ev.run_id, row)
        try:
            store.index_item(home, ev.run_id, row)
        except Exception as exc:  # the file is the truth; `conclave index rebuild` repairs the index
            print(f"conclave eval: warning: index write failed ({exc}); rows are safe in {store.eval_dir(home)}",
                  file=err)
        done[item.id] = row
        finished += 1
        marks = " ".join(f"{p} {'✓' if o.correct else '✗'}" for p, o in result.protocols.items())
        print(f"  [{finished}/{len(ev.items)}] {item.id}: {marks}  ({result.status})", file=err, flush=True)

    try:
        async with asyncio.TaskGroup() as group:
            for item in todo:
                group.create_task(one(item))
    finally:
        recorder.close()
        rows = [done[i.id] for i in ev.items if i.id in done]
        complete = len(rows) == len(ev.items)
        summary = ev.summary = summarise(rows)
        run.update(status="complete" if complete else "interrupted",
                   completed_at=_now() if complete else None,
                   wall_s=round(float(run.get("wall_s") or 0.0) + time.monotonic() - started, 3),
                   summary=summary, **run_columns(summary))
        run["total_cost"] = summary["protocols"]["debate"]["cost"]
        run["total_tokens"] = summary["protocols"]["debate"]["tokens"]
        store.write_run(home, run)
        try:
            store.index_run(home, run)
        except Exception as exc:
            print(f"conclave eval: warning: index write failed ({exc})", file=err)
    from conclave.eval.report import render

    if quiet:
        print(f"conclave eval: run {ev.run_id} ({len(rows)} item(s)): {summary['verdict_line']}", file=err)
    else:
        out.write(render(run, rows, "json" if ev.settings.output.format == "json" else "markdown"))
        out.flush()
    return EXIT_OK if summary["failed_items"] == 0 else EXIT_FAILED


async def run_item(item: Item, settings: Settings, plugins: Any, recorder: Any, order: Sequence[str],
                   single: str, arm: Settings | None = None, reuse: bool = False, extra: int = 0) -> ItemResult:
    """One consultation on ``item``, journaled and indexed like any other, scored for every protocol; with
    ``arm``, a second consultation (the quality protocol) continues from the first one's round 1 (``reuse``) or
    runs whole."""
    from conclave.engine.interaction import Interaction
    from conclave.engine.runner import Consultation
    from conclave.eval.protocols import add_quality
    from conclave.eval.quality_arm import resume_point

    capture = Capture()
    consultation = Consultation(
        asking(settings, item), plugins=plugins,
        interaction=Interaction.non_interactive(), subscribers=[capture], recorder=recorder,
    )
    base = (await consultation.run()).as_dict()
    scored = score(item, base, capture, order, single)
    if extra:
        from conclave.eval.protocols import add_matched_vote

        one_round = asking(settings, item).model_copy(update={"rounds": 1, "quick": False})
        captures = [Capture() for _ in range(extra)]
        samples = await asyncio.gather(*(
            Consultation(one_round, plugins=plugins, interaction=Interaction.non_interactive(), subscribers=[c],
                         recorder=recorder).run() for c in captures))
        add_matched_vote(scored, [s.as_dict() for s in samples], captures, capture)
    if arm is None:
        return scored
    start: dict[str, Any] | None = {}
    if reuse:
        first = plugins.strategies.get(arm.mode.strategy).plan[0].name
        start = resume_point(base, capture, first)
    if start is None:  # the base consultation has no round 1 to continue from: nothing to compare
        add_quality(scored, None, None, capture, reuse)
        return scored
    arm_capture = Capture()
    fork = Consultation(
        asking(arm, item), plugins=plugins,
        interaction=Interaction.non_interactive(), subscribers=[arm_capture], recorder=recorder, resume_from=start,
    )
    add_quality(scored, (await fork.run()).as_dict(), arm_capture, capture, reuse)
    return scored


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
        from conclave.engine.consent import store_always_allow

        path = store_always_allow(home, consent.new_threshold)
        print(f"conclave eval: cost.always_allow_under={consent.new_threshold:.2f} saved in {path}", file=err)


async def estimate_run(settings: Settings, items: Sequence[Item], plugins: Any, ev: EvalRun | None = None) -> Any:
    """The cost estimate of every planned call of every item: the engine's own per-consultation estimate, summed;
    with a quality arm (``ev.arm``), its calls too — round 1 left out when the arm reuses the base's, which this
    decides and records in ``ev.reuse_round_1``."""
    from conclave.engine.cost import CostEstimate, estimate_cost
    from conclave.engine.labels import JudgeLabels
    from conclave.engine.rounds import Plan
    from conclave.engine.session import Session
    from conclave.events import EventBus
    from conclave.providers.pool import ProviderPool
    from conclave.quality.exit import max_plan

    strategy = plugins.strategies.get(settings.mode.strategy)(settings.mode.options)
    bus = EventBus("eval-estimate")
    labels = JudgeLabels(settings.agents, 0, None)
    context = ""
    if settings.context or settings.project:
        from conclave.engine.inputs import prepare_inputs
        from conclave.engine.interaction import Interaction

        context = prepare_inputs(settings, Interaction.non_interactive()).context
    total = CostEstimate()
    arm = ev.arm if ev is not None else None
    async with ProviderPool(settings, plugins, bus) as pool:
        for item in items:
            session = Session(settings=settings, plugins=plugins, strategy=strategy, pool=pool, bus=bus,
                              labels=labels, question=item.prompt, context_text=context)
            # every round an item's debate may play, cross-examination repeats up to exit.round_cap included
            longest = Plan(max_plan(session))
            whole = estimate_cost(session, longest.numbers(), plan=longest)
            total.calls.extend(whole.calls)
            if ev is not None and ev.options.matched_vote:
                round_one = whole.only([1])
                if not ev.extra_samples:  # as many model calls as the debate plans (the samples of self-consistency)
                    ev.extra_samples = max(1, -(-len(whole.calls) // max(1, len(round_one.calls))) - 1)
                for _ in range(ev.extra_samples):
                    total.calls.extend(round_one.calls)
        if arm is not None and ev is not None:
            from conclave.eval.quality_arm import round_one_calls

            arm_strategy = plugins.strategies.get(arm.mode.strategy)(arm.mode.options)
            async with ProviderPool(arm, plugins, bus) as arm_pool:
                for index, item in enumerate(items or ev.items[:1]):
                    base_session = Session(settings=settings, plugins=plugins, strategy=strategy, pool=pool,
                                           bus=bus, labels=labels, question=item.prompt, context_text=context)
                    arm_session = Session(settings=arm, plugins=plugins, strategy=arm_strategy, pool=arm_pool,
                                          bus=bus, labels=labels, question=item.prompt, context_text=context)
                    if index == 0:  # the same rule for every item: only the question differs, in both alike
                        ev.reuse_round_1 = round_one_calls(base_session) == round_one_calls(arm_session)
                    if items:
                        first = 2 if ev.reuse_round_1 else 1
                        arm_longest = Plan(max_plan(arm_session))
                        numbers = [n for n in arm_longest.numbers() if n >= first]
                        total.calls.extend(estimate_cost(arm_session, numbers, plan=arm_longest).calls)
    return total


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
