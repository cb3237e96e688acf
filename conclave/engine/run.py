"""The consultation runner: drives the state machine through the rounds and always ends with a result.

``await Consultation(settings).run()`` returns a :class:`ConsultationResult` whatever the providers do: failures
become an honest status (``completed_degraded``, ``partial``, ``aborted``). Cancellation (Ctrl-C) saves the
partial result in ``.result`` and re-raises. A ``recorder`` (the journal) sees every event as a critical
subscriber; a round's records are written out when it ends (they survive the process being killed) and made
durable (fsync and head) before the next round spends anything.

Each round run is journaled between ``round:started`` and exactly one end record, which ``conclave resume``
trusts (:func:`conclave.store.resume_points.completed_round_artifacts`):

- ``round:completed`` — the round ran to its end. ``ok`` is true when it produced what the next round needs,
  false when it failed in a way that stops the consultation (fewer than 2 valid round-1 answers, no usable judge
  artifact). Only an ok round is ever restored; a failed one is re-run by a resume.
- ``round:interrupted`` — it did not run to its end: ``reason`` ``cancelled`` (Ctrl-C / task cancellation),
  ``stopped`` (the in-flight cost gate between the round-3 replies and the judge) or ``error`` (an unexpected
  exception). Never restored: a resume runs the round again from the start.

A SIGKILL leaves neither record; a resume re-runs that round too.

A resumed run (``resume_from``) counts what its earlier runs were billed (``resume_from["spent"]``) in the
result's cost and tokens and in the in-flight ``cost.abort_ratio`` check, which then holds the whole
consultation's spend against the estimate of every planned round (restored ones included).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from conclave.artifacts import schema_registry as artifacts
from conclave.config.settings import Settings
from conclave.engine.assemble import Provenance, assemble_result
from conclave.engine.cost.consent import decide_consent, store_always_allow
from conclave.engine.cost.estimate import (
    CostEstimate,
    PlannedText,
    SpentSoFar,
    output_floor,
    planned_texts,
    price_calls,
    spent,
)
from conclave.engine.cost.limits import check_context_windows
from conclave.engine.extraction import request_schema
from conclave.engine.ids import config_hash, config_snapshot, new_consultation_id
from conclave.engine.inputs import prepare_inputs
from conclave.engine.interaction import Interaction
from conclave.engine.labels import JudgeLabels, new_seed
from conclave.engine.play import derive_verdict, play
from conclave.engine.restore import interrupted_answers, restore_rounds, resumed_rounds
from conclave.engine.rounds import SYNTHESIS, Plan, PlanChange, Step
from conclave.engine.session import Session
from conclave.engine.session_layers import with_layers
from conclave.engine.settle import decide as decide_final
from conclave.engine.settle import settles, synthesis_of, with_judge
from conclave.engine.state import ConsultState, StateMachine, Transition
from conclave.engine.termination import decide_early_termination
from conclave.engine.vote_gate import aggregator_name, ballots_of, synthesis_from_vote
from conclave.engine.vote_gate import decide as decide_vote
from conclave.engine.vote_gate import enabled as gate_enabled
from conclave.errors import ConfigError, StorageError
from conclave.events import (
    CONSULTATION_COMPLETED,
    CONSULTATION_STARTED,
    COST_ESTIMATED,
    COST_GATE_TRIGGERED,
    EARLY_TERMINATION,
    FINAL_AGGREGATE,
    PLAN_CHANGED,
    ROUND_COMPLETED,
    ROUND_INTERRUPTED,
    ROUND_STARTED,
    STATE_TRANSITION,
    USER_CONSENT,
    VOTE_GATE,
    EventBus,
    Subscriber,
)
from conclave.plugin_manager import get_plugins
from conclave.providers.base import ProviderError
from conclave.providers.hedge_memory import HedgeMemory
from conclave.providers.pool import BatchRoute, ProviderPool
from conclave.quality.exit import ExitController, max_plan
from conclave.quality.objection import OBJECTION, RoundInputs
from conclave.tokens import utf8_upper_bound
from conclave.version import __version__

if TYPE_CHECKING:
    from conclave.engine.result import ConsultationResult

log = logging.getLogger(__name__)

S = ConsultState
#: how long after round 1 starts the exact estimate is counted: time for its requests to leave
EXACT_COUNT_AFTER_S = 0.05


class Recorder(Protocol):
    """A durable sink for events (the journal): receives each event, and ``flush()`` makes them durable."""

    def __call__(self, event: Any) -> None: ...

    def flush(self) -> None: ...


class Controller(Protocol):
    """Runs after every round; may change what is still to come through the session's plan."""

    def __call__(self, session: Session, steps: list[Step], restored: set[int]) -> None: ...


class _Stop(Exception):
    """Internal: the consultation has reached a terminal state; unwind to result assembly."""


class Consultation:
    """One consultation. Construct, then ``await run()``; ``result`` and ``refusal`` are set when it ends.

    ``resume_from`` carries stored artifacts of completed rounds (``round_1`` {agent: artifact}, ``round_2``,
    ``round_3_replies``, ``round_3``) plus ``labels`` and ``shuffle_seed``; those rounds are restored, not re-run.
    Its ``spent`` (what earlier runs were billed, see :meth:`SpentSoFar.from_journal`) counts in the result's
    cost and tokens and in the abort-ratio check.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        plugins: Any = None,
        interaction: Interaction | None = None,
        subscribers: Iterable[Subscriber] = (),
        recorder: Recorder | None = None,
        resume_from: Mapping[str, Any] | None = None,
        consultation_id: str | None = None,
        first_seq: int = 0,
        environ: Mapping[str, str] | None = None,
        stdin_text: str | None = None,
        stream: bool = False,
        batch: BatchRoute | None = None,
    ) -> None:
        if plugins is None:
            plugins = get_plugins()
        self.settings = settings
        self.plugins = plugins
        self.interaction = interaction or Interaction.non_interactive()
        self.resume_from = dict(resume_from or {})
        self.id = consultation_id or new_consultation_id()
        self.bus = EventBus(self.id, first_seq=first_seq)
        self.recorder = recorder
        if recorder is not None:
            self.bus.subscribe(recorder, critical=True)
        for subscriber in subscribers:
            self.bus.subscribe(subscriber)
        self.machine = StateMachine(self._on_transition)
        #: called after every round with (session, its steps, restored round numbers); a controller may end or
        #: extend the plan through ``session.plan.end_here`` / ``session.plan.insert_next``

        #: after each cross-examination round: consensus, convergence or the cap, else cross-examination repeats
        self.exit = ExitController.from_resume(self.interaction, self.resume_from)
        self.controllers: list[Controller] = [self._quality, self._history, self._vote_gate, self._groupthink,
                                                 self._early_termination, self._exit]
        self.result: ConsultationResult | None = None
        self.refusal: str | None = None  # why the cost gate stopped it (nothing was spent): shown instead of a result
        self._environ = environ
        self._stdin_text = stdin_text
        self._batch = batch  # calls go through the providers' batch APIs (a batched evaluation)
        self._stream = stream  # ask providers to stream and publish the text as it arrives (agent:chunk)
        self._estimate: CostEstimate | None = None  # the rounds this run will play: consent, early termination
        self._budget: CostEstimate | None = None  # every planned round: the result's estimate and the abort check
        self._prior = SpentSoFar.from_journal(self.resume_from.get("spent"))  # billed by earlier runs
        self._exact: asyncio.Future[None] | None = None  # the exact estimate, while it is being counted
        #: a lower bound of the exact estimate's total that needs no tokenizer (every planned call's output cap),
        #: which lets the cost gate pass while the exact estimate is still being counted (:meth:`_gate`)
        self._floor: float | None = None
        self._count_go = asyncio.Event()  # the exact count may start (round 1 is under way)
        self._count_now = False  # it is needed now: no waiting for requests to leave
        self._checks_ready: asyncio.Future[None] | None = None  # schema checks prepared while round 1 waits
        self._estimated_rounds: int | None = None  # how many rounds the estimate covers (the cap when repeating)

    # ------------------------------------------------------------------------------------------ lifecycle

    async def run(self) -> ConsultationResult:
        started, created_at = time.monotonic(), artifacts.now_iso()
        strategy = self.plugins.strategies.get(self.settings.mode.strategy)(self.settings.mode.options)
        problems = strategy.panel_problems(list(self.settings.agents))
        if problems:
            raise ConfigError(problems)
        inputs = prepare_inputs(self.settings, self.interaction, self._stdin_text, self._environ)
        stored_seed = self.resume_from.get("shuffle_seed")
        seed = int(stored_seed) if stored_seed is not None else new_seed()  # 0 is a seed like any other
        labels = JudgeLabels(self.settings.agents, seed, self.resume_from.get("labels"))

        # the home's hedging file: latency history that sets the hedge delay from the first call, and the shared
        # hedge budget
        memory = HedgeMemory(self.settings.home)
        async with ProviderPool(self.settings, self.plugins, self.bus, environ=self._environ,
                                hedge_memory=memory, batch=self._batch) as pool:
            self._check_keys(pool)
            # every request waits until what the journal holds before it is durable (written on its own thread)
            until_durable = getattr(self.recorder, "until_durable", None)
            if until_durable is not None:
                pool.before_spending = functools.partial(until_durable, self.id)
            session = with_layers(Session(
                settings=self.settings, plugins=self.plugins, strategy=strategy, pool=pool, bus=self.bus,
                labels=labels, question=inputs.question, context_text=inputs.context, images=inputs.images,
            ))
            session.stream = session.judge.stream = self._stream
            self.machine.follow(session.plan.states())
            session.judge.restore(self.resume_from.get("judge_fallback"))
            session.plan.on_change = lambda change: self._on_plan_change(session, change)
            check_context_windows(session)  # before the journal starts: an impossible prompt is a usage error
            self._check_images(session, inputs.context_sources)
            snapshot = config_snapshot(self.settings, inputs.question)
            provenance = Provenance(
                consultation_id=self.id,
                created_at=created_at,
                started_monotonic=started,
                scrub_report=inputs.scrub_report,
                context_sources=inputs.context_sources,
                prompt_versions=strategy.prompt_versions(),
                config_hash=config_hash(snapshot),
            )
            self._emit_started(session, snapshot, provenance)
            try:
                await self._flow(session)
            except _Stop:
                await self._exact_estimate()  # the result reports the exact estimate even when it stopped early
            except (asyncio.CancelledError, KeyboardInterrupt):
                # Ctrl-C: asyncio cancels us (or, inside a blocking prompt, KeyboardInterrupt arrives directly).
                session.record.abort_reason = session.record.abort_reason or "interrupted by the user"
                if self._exact is not None:
                    self._exact.cancel()
                with contextlib.suppress(StorageError):  # a failed journal refuses the transition's record
                    self.machine.abort("interrupted")
                self._finish(session, provenance)
                raise
            except Exception as caught:
                # A bug, or the journal failing (a critical subscriber, or the requests that wait for its writes):
                # stop spending, keep what exists.
                exc = _storage_failure(caught) or caught
                if isinstance(exc, StorageError) and not pool.attempts:
                    # nothing was asked in this run (the start itself could not be recorded: its write runs on
                    # the recorder's I/O thread and fails before round 1 spends): nothing to show, the caller
                    # says why in one line
                    raise exc from None
                if isinstance(exc, StorageError):  # says in one line which path failed and why
                    session.record.abort_reason = str(exc)
                else:
                    log.exception("consultation %s stopped by an unexpected error", self.id)
                    session.record.abort_reason = f"internal error: {_describe(exc)}"
                with contextlib.suppress(StorageError):
                    self.machine.abort("internal error")
            return self._finish(session, provenance)

    def _finish(self, session: Session, provenance: Provenance) -> ConsultationResult:
        if self._checks_ready is not None:
            self._checks_ready.cancel()  # only a warm-up: whatever it had not prepared is built when needed
        result = assemble_result(session, self.machine, provenance, self._budget, self._prior)
        completed = self.machine.state is S.COMPLETE
        result = result.model_copy(update={
            "exit": self.exit.summary(session.exit_limits(), rounds_played=session.record.completed_rounds,
                                      planned_rounds=session.planned_rounds, completed=completed,
                                      estimated_rounds=self._estimated_rounds),
            "context": session.context.summary(),
        })
        self.result = result
        try:
            self.bus.emit(CONSULTATION_COMPLETED, status=result.status, result=result.as_dict())
            self._flush()
        except StorageError:
            pass  # the journal failed earlier and the abort reason says so
        except Exception:
            log.exception("could not record the end of consultation %s", self.id)
        return result

    # ------------------------------------------------------------------------------------------ the flow

    async def _flow(self, session: Session) -> None:
        """Play the plan round by round; controllers may end or extend it after each round."""
        plan, record = session.plan, session.record
        session.safety.cache.update(self.resume_from.get("safety") or {})
        if session.safety.screen_question():  # tiers 1 and 2 on the question: before anything is spent
            self._stop(record, session.safety.blocked["reason"] if session.safety.blocked else None)
        self._go(S.ESTIMATING, "estimating cost from the prompts")
        if session.quality.groupthink.replay_plan(session.plan, self.resume_from):  # objection rounds played before
            self.machine.follow(session.plan.states())
        restored = restore_rounds(session, self.resume_from)
        self._estimate_and_consent(session, restored)
        if self._prior.total:  # earlier runs may have spent the budget already: check that exactly, first
            await self._exact_estimate()
            self._check_budget(session, "the earlier runs")
        if session.safety.preflight_needed:
            self._flush()  # the pre-flight's call is the first spending
        if await session.safety.preflight():  # tier 3 on a question tier 2 flagged, before any agent is asked
            self._stop(record, session.safety.blocked["reason"] if session.safety.blocked else None)
        previous: int | None = None
        while (steps := plan.next_round()) is not None:
            number = steps[0].number
            if previous is not None:
                await self._gate(session, f"round {previous}")  # before spending on the next round
            else:
                self._count_go.set()  # the exact estimate: while round 1's requests are in flight
                self._prepare_checks(session)
            if number in restored:
                reason = f"restored round {number}"
            else:
                reason = "cost approved" if previous is None else f"round {previous} complete"
            self._go(steps[0].type.state, reason)
            if number not in restored:
                failure = await self._round(session, steps)
                if failure is not None:  # a failed round is not a completed one, whatever answers it kept
                    self._stop(record, failure)
            record.completed_rounds = previous = number
            if number > 1:  # the controllers after round 1 need no estimate; early termination's needs the exact one
                await self._exact_estimate()
            for controller in self.controllers:
                controller(session, steps, restored)
        await self._exact_estimate()
        self._go(S.COMPLETE, self._complete(session))

    def _complete(self, session: Session) -> str:
        """Derive the verdict when no verdict round ran; the reason the consultation is complete."""
        record, settings = session.record, self.settings
        early = record.early_termination or {}
        gate = record.vote_gate or {}
        if record.verdict is None and gate.get("decided"):
            derive_verdict(session, synthesis_from_vote(gate, ballots_of(session)))
            return "decided by the vote after round 1"
        final = None
        if settles(settings, session.strategy):
            aggregator = self.plugins.aggregators.get(aggregator_name(settings, session.strategy))
            final = decide_final(session, aggregator)
        if final is not None:
            if record.verdict is None:  # no judge verdict ran: the verdict is the aggregate's
                derive_verdict(session, synthesis_of(final))
            record.final_aggregate = final = with_judge(final, record.round_4)
            self.bus.emit(FINAL_AGGREGATE, **final)
            if record.round_4 is None:
                return "decided by the aggregate after cross-examination"
        if record.verdict is None and record.round_2 is not None:
            derive_verdict(session)
        if early.get("accepted"):
            return "early termination accepted"
        if record.round_4 is not None:
            return "verdict rendered"
        return "quick=true" if settings.quick and settings.planned_rounds == 2 else f"rounds={settings.planned_rounds}"

    async def _round(self, session: Session, steps: list[Step]) -> str | None:
        """Play one round (its steps in order) between ``round:started`` and its end record, then flush.

        None when it produced what the next round needs; else why the consultation stops, and the round ends
        ``round:completed`` with ``ok: false``. When a step raises — Ctrl-C, the cost gate between steps, a bug —
        ``round:interrupted``, and the exception goes on. See the module doc.
        """
        number, name = steps[0].number, steps[-1].type.name
        since, t0 = len(session.pool.attempts), time.monotonic()
        self.bus.emit(ROUND_STARTED, round_number=number, round_type=name)
        failure = None
        try:
            for i, step in enumerate(steps):
                if i:
                    done = steps[i - 1].type
                    await self._gate(session, f"round {number} {done.short or done.name}")
                failure = await play(session, step, interrupted_answers(self.resume_from, step))
                failure = await session.safety.after_step(step) or failure  # a block is the reason it stops
                if failure is not None:
                    break
        except BaseException as exc:
            self._round_interrupted(session, number, name, since, t0, exc)
            raise
        self.bus.emit(ROUND_COMPLETED, **self._round_totals(number, name, session, since, t0), ok=failure is None,
                      safety=session.safety.round_summary(number))
        # Written out at once, so a killed process keeps every answer it paid for; fsynced (with the records the
        # controllers add) when the next round starts, before it spends anything.
        self._flush(durable=False)
        return failure

    def _round_totals(self, number: int, name: str, session: Session, since: int, t0: float) -> dict[str, Any]:
        used = spent(session.pool, since)
        return {
            "round_number": number,
            "round_type": name,
            "duration_s": round(time.monotonic() - t0, 3),
            "input_tokens": used.usage.input_tokens,
            "output_tokens": used.usage.output_tokens,
            "cost": used.total,
        }

    def _round_interrupted(
        self, session: Session, number: int, name: str, since: int, t0: float, exc: BaseException
    ) -> None:
        """Record that round ``number`` did not run to its end (best effort: ``exc`` is what the caller sees)."""
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
            reason, detail = "cancelled", "interrupted by the user"
        elif isinstance(exc, _Stop):
            reason, detail = "stopped", session.record.abort_reason or "stopped"
        else:
            reason, detail = "error", _describe(exc)
        try:
            self.bus.emit(ROUND_INTERRUPTED, **self._round_totals(number, name, session, since, t0), reason=reason,
                          detail=detail)
            self._flush()
        except StorageError:
            pass  # the journal failing is what interrupted the round: the caller reports it
        except Exception:
            log.exception("could not record that round %d of consultation %s was interrupted", number, self.id)

    # ------------------------------------------------------------------------------------------ gates

    def _estimate_and_consent(self, session: Session, restored: set[int]) -> None:
        """Estimate the rounds this run may play (all but ``restored``) and ask for consent to spend that.

        When cross-examination may repeat, the estimate covers the longest plan the exit controller could play
        (every repeat up to ``exit.round_cap``): a ceiling; the result reports the rounds that ran.

        First an upper bound that needs no tokenizer (every token covers at least one byte): when it is
        approved without asking anyone (``cost.auto_approve``, or under ``cost.always_allow_under``), round 1
        starts at once and the exact estimate is counted later, while calls are in flight (:meth:`_count_exactly`),
        so loading a tokenizer never delays a request; the cost gate meanwhile decides on a lower bound
        (:meth:`_gate`). Otherwise the exact estimate is what is asked
        about or refused. The abort-ratio budget (``self._budget``) is the exact estimate of every planned
        round: on a resumed run the restored rounds' calls were billed by an earlier run, and that counts too.
        """
        longest = Plan(max_plan(session.plan.types, session.exit_limits()))
        numbers = longest.numbers()
        self._estimated_rounds = len(numbers)
        rounds = [n for n in numbers if n not in restored]
        planned = planned_texts(session, numbers, plan=longest) + session.safety.planned_texts(numbers)
        rounds = session.safety.estimate_rounds(rounds)  # the question's full evaluation, when planned
        bound = price_calls(session.pool, planned, utf8_upper_bound).only(rounds)
        consent = decide_consent(bound, self.settings, Interaction.non_interactive(), upper_bound=True)
        if consent.approved:
            self._exact = asyncio.ensure_future(self._count_exactly(session, planned, rounds))
            self._floor = output_floor(session.pool, planned)
            self._go(S.AWAITING_CONSENT, "upper bound of the estimate ready")
        else:
            self._record_estimate(price_calls(session.pool, planned), rounds, self._gate_may_stop(session, restored))
            self._go(S.AWAITING_CONSENT, "estimate ready")
            assert self._estimate is not None
            self._flush()  # the start is durable before anyone is asked (a run killed in the prompt resumes)
            consent = decide_consent(self._estimate, self.settings, self.interaction,
                                     may_stop_after_round_1=self._gate_may_stop(session, restored))
        stored = None
        if consent.new_threshold is not None:
            home = self.settings.home
            stored = str(store_always_allow(home, consent.new_threshold))
        self.bus.emit(
            USER_CONSENT,
            approved=consent.approved,
            auto_approved=consent.auto_approved,
            reason=consent.reason,
            always_allow_under=consent.new_threshold,
            stored_in=stored,
        )
        self._flush(durable=False)  # durable with round 1's start (or before the safety pre-flight's call)
        if not consent.approved:
            self.refusal = consent.reason
            self._stop(session.record, f"cost not approved: {consent.reason}")

    @staticmethod
    def _gate_may_stop(session: Session, restored: set[int]) -> bool:
        """Whether the vote gate may end the consultation after round 1 (it is on, and round 1 is to be played):
        the estimate covers the full plan and says so."""
        return gate_enabled(session) and 1 not in restored and len(session.plan.numbers()) > 1

    def _record_estimate(self, budget: CostEstimate, rounds: list[int], may_stop_after_round_1: bool = False) -> None:
        self._budget = budget
        estimate = self._estimate = budget.only(rounds)
        first = estimate.only([1]).total if may_stop_after_round_1 else None
        self.bus.emit(
            COST_ESTIMATED,
            estimated_cost=estimate.total,
            input_tokens=estimate.input_tokens,
            cached_input_tokens=estimate.cached_input_tokens,
            output_tokens=estimate.output_tokens,
            unknown_prices=estimate.unknown_prices,
            rounds=rounds,
            # the estimate covers the full plan; with the vote gate on it may stop after round 1, costing this
            may_stop_after_round=1 if may_stop_after_round_1 else None,
            round_1_cost=first,
        )

    def _prepare_checks(self, session: Session) -> None:
        """Once round 1's requests have left, prepare the schema checks every answer of the plan goes through
        (validators, reference lookups): their one-time cost is paid while round 1 waits, not between its last
        answer and round 2's request. On the event loop, so the modules they import are imported by one thread."""
        names = sorted({t.schema for t in session.plan} | {t.schema for t in session.strategy.plan})
        seats = {(agent.spec.provider, agent.spec.model) for agent in session.agents.values()} | {
            (session.judge.provider, session.judge.model)}
        try:
            providers = [(session.pool.provider(name), model) for name, model in sorted(seats)]
        except Exception:  # only a warm-up: the call that needs the provider meets the error
            providers = []

        def prepare_requests() -> None:
            """The schemas as requests carry them: inlined, then in each seat's provider's form (a warm-up: a
            failure is met again, and reported, by the request that needs the schema)."""
            try:
                schemas = [request_schema(name) for name in names]
                for provider, model in providers:
                    provider.prepare_schemas(model, schemas)
            except Exception:
                log.debug("preparing the request schemas failed", exc_info=True)

        async def prepare() -> None:
            await asyncio.sleep(EXACT_COUNT_AFTER_S)  # round 1's requests have left
            artifacts.prepare_checks(names)
            prepare_requests()

        self._checks_ready = asyncio.ensure_future(prepare())

    async def _count_exactly(self, session: Session, planned: list[PlannedText], rounds: list[int]) -> None:
        """The exact estimate, counted in a worker thread once round 1's requests have left (or at once when
        something needs it sooner: :meth:`_exact_estimate`).

        Building a tokenizer and counting every planned prompt holds the interpreter lock for a few hundred
        milliseconds: started after the requests are sent, it overlaps their network time instead of delaying
        them. Nothing waits for it before the cost gate needs it (:meth:`_gate`) or early termination does."""
        await self._count_go.wait()
        if not self._count_now:
            await asyncio.sleep(EXACT_COUNT_AFTER_S)  # the round's requests have left
        self._record_estimate(await asyncio.to_thread(price_calls, session.pool, planned), rounds,
                              self._gate_may_stop(session, set()))

    async def _gate(self, session: Session, phase: str) -> None:
        """The cost gate before spending more (:meth:`_check_budget`). While the exact estimate is still being
        counted, a spend within ``abort_ratio`` × its lower bound (:attr:`_floor`) passes without waiting for it:
        no exact estimate could stop it. Otherwise the gate waits for the exact estimate and decides on it."""
        if self._exact is None or self._floor is None \
                or (spent(session.pool) + self._prior).total > self.settings.cost.abort_ratio * self._floor:
            await self._exact_estimate()
        self._check_budget(session, phase)

    async def _exact_estimate(self) -> None:
        """Wait for the exact estimate when it is still being counted (before it is needed)."""
        if self._exact is not None:
            self._count_now = True
            self._count_go.set()
            exact, self._exact = self._exact, None
            await exact

    def _check_budget(self, session: Session, phase: str) -> None:
        """Abort before spending more when the actual cost passed ``abort_ratio`` × the estimate.

        Actual: every billed call of the consultation, earlier runs' included; estimate: every planned round's
        calls (on a first run, exactly what the user approved). Without a known estimate (the user approved an
        unknown price) there is nothing to compare against.
        """
        estimate = self._budget.total if self._budget else None
        if not estimate:
            return
        actual, ratio = (spent(session.pool) + self._prior).total, self.settings.cost.abort_ratio
        if actual <= ratio * estimate:
            return
        self.bus.emit(COST_GATE_TRIGGERED, estimated_cost=estimate, actual_cost=actual, abort_ratio=ratio, phase=phase)
        self._stop(
            session.record,
            f"cost_exceeded: actual ${actual:.4f} is over {ratio:g} × the estimate ${estimate:.4f} after {phase}",
        )

    @staticmethod
    def _history(session: Session, steps: list[Step], restored: set[int]) -> None:
        """After every round: keep its artifacts for the context of later rounds (summarized in long debates)."""
        session.context.capture(steps, restored)

    @staticmethod
    def _quality(session: Session, steps: list[Step], restored: set[int]) -> None:
        """After every round: the debate state, citation rules and verification (never stops a round)."""
        session.quality.after_round(session, steps, restored)

    def _exit(self, session: Session, steps: list[Step], restored: set[int]) -> None:
        """After each cross-examination round: consensus, convergence or the cap, else cross-examination repeats."""
        self.exit.after_round(steps, restored, record=session.record, plan=session.plan, present=session.present(),
                              claims=session.quality.state.claims, limits=session.exit_limits(),
                              emit=session.bus.emit)

    def _groupthink(self, session: Session, steps: list[Step], restored: set[int]) -> None:
        """After every round: the groupthink detectors; a firing inserts a critical objection round."""
        inputs = RoundInputs(session.record, session.plan, session.quality.state.claims, session.planned_rounds,
                             session.strategy.template(OBJECTION.template).id, session.bus.emit)
        session.quality.groupthink.after_round(steps, restored, inputs, self.interaction)

    def _vote_gate(self, session: Session, steps: list[Step], restored: set[int]) -> None:
        """After round 1, with more rounds to come (none restored): when the panel agrees, the aggregated answer
        decides and the plan ends here (:mod:`conclave.engine.vote_gate`); the decision is journaled either way."""
        plan = session.plan
        if steps[0].number != 1 or plan.finished or not gate_enabled(session):
            return
        if any(n in restored for n in plan.numbers() if n > 1):
            return
        name = aggregator_name(self.settings, session.strategy)
        answers = "final_answer" in artifacts.declared_properties(steps[0].type.schema)
        gate = decide_vote(session, self.plugins.aggregators.get(name), has_final_answer=answers)
        session.record.vote_gate = gate
        self.bus.emit(VOTE_GATE, **gate)
        if gate["decided"]:
            plan.end_here(gate["summary"])

    def _early_termination(self, session: Session, steps: list[Step], restored: set[int]) -> None:
        """After the synthesis, with more rounds to come (none of them restored): offer to stop on a strong
        consensus; accepted, the plan ends here and the verdict is derived from the synthesis."""
        plan = session.plan
        if steps[-1].type.name != SYNTHESIS.name or plan.finished:
            return
        if any(n in restored for n in plan.numbers() if n > steps[-1].number):
            return
        # every round the estimate covers after this one (with the repeats cross-examination might have had)
        remaining = sorted({c.round_number for c in self._estimate.calls if c.round_number > steps[-1].number}) \
            if self._estimate else []
        record = session.record
        assert record.round_2 is not None
        estimate = self._estimate
        decision = decide_early_termination(
            strategy=session.strategy,
            settings=self.settings,
            round_1=record.round_1,
            synthesis=record.round_2,
            interaction=self.interaction,
            cost_saved=estimate.for_rounds(remaining) if estimate else None,
            groupthink=session.quality.groupthink.guard(),
        )
        record.early_termination = decision
        self.bus.emit(EARLY_TERMINATION, **decision)
        if decision["accepted"]:
            plan.end_here("early termination accepted")

    # ------------------------------------------------------------------------------------------ helpers

    def _go(self, to: str, reason: str) -> None:
        self.machine.transition(to, reason)

    def _stop(self, record: Any, reason: str | None) -> None:
        record.abort_reason = reason or record.abort_reason or "stopped"
        self.machine.abort(record.abort_reason)
        raise _Stop

    def _on_plan_change(self, session: Session, change: PlanChange) -> None:
        self.machine.follow(session.plan.states())
        self.bus.emit(PLAN_CHANGED, action=change.action, after_step=change.after, round_types=change.round_types,
                      reason=change.reason, plan=[t.name for t in session.plan])

    def _on_transition(self, transition: Transition) -> None:
        data = transition.as_dict()
        self.bus.emit(STATE_TRANSITION, **{"from": data["from"], "to": data["to"], "reason": data["reason"]})

    def _flush(self, *, durable: bool = True) -> None:
        """Make the journal durable; ``durable=False``: only hand it to the operating system when the recorder
        can (``write_out``), leaving the fsync to its next flush."""
        if self.recorder is None:
            return
        write_out = None if durable else getattr(self.recorder, "write_out", None)
        if write_out is not None:
            write_out(self.id)  # this consultation's journal only: a recorder may be shared by many
        elif getattr(self.recorder, "until_durable", None) is not None:  # conclave's recorder, maybe shared
            self.recorder.flush(consultation_id=self.id)  # type: ignore[call-arg]
        else:
            self.recorder.flush()

    def _check_keys(self, pool: Any) -> None:
        """Refuse to start when an agent's or the judge's provider has no API key (before anything is spent)."""
        problems = []
        users = [(f"agents.{n}.provider", a.provider) for n, a in self.settings.agents.items()]
        users.append(("judge.provider", self.settings.judge.provider))
        for key, provider in users:
            if pool.has_key(provider):
                continue
            try:
                problems.append(f"{key}: provider {provider!r} has no API key; set "
                                f"{pool.provider(provider).key_variables()}")
            except ProviderError as exc:
                problems.append(f"{key}: {exc}")
        if problems:
            raise ConfigError(problems)

    def _check_images(self, session: Session, sources: list[dict[str, Any]]) -> None:
        """Attached images go to the seats whose model accepts images. Every other seat is named in one line (on
        stderr, and in each image's ``not_sent_to`` in the record); with ``strict_models=true`` the consultation is
        refused instead, before anything is spent."""
        if not session.images:
            return
        seats = [(name, a.provider, a.model) for name, a in self.settings.agents.items()]
        seats.append(("judge", session.judge.provider, session.judge.model))
        blind = [(name, provider, model) for name, provider, model in seats
                 if not session.images_for(provider, model)]
        if not blind:
            return
        files = ", ".join(image.path for image in session.images)
        if self.settings.strict_models:
            who = ", ".join(f"{name} ({provider}/{model})" for name, provider, model in blind)
            raise ConfigError([f"strict_models=true: {who} cannot take the attached image(s) {files} (text-only in "
                               "the price sheets, which mark image models vision: true); choose models that take "
                               "images or leave the images out"])
        for name, provider, model in blind:
            self.interaction.warn(f"{name} ({provider}/{model}) does not accept images: it gets the text context "
                                  f"without {files}")
        for source in sources:
            if source["kind"] == "image":
                source["not_sent_to"] = [name for name, _, _ in blind]

    def _emit_started(self, session: Session, snapshot: dict[str, Any], provenance: Provenance) -> None:
        settings = self.settings
        self.bus.emit(
            CONSULTATION_STARTED,
            question=session.question,
            mode=settings.mode.strategy,
            strategy=settings.mode.strategy,
            agents=[
                {"name": n, "persona": a.persona, "provider": a.provider, "model": a.model}
                for n, a in settings.agents.items()
            ],
            judge={"provider": settings.judge.provider, "model": settings.judge.model},
            planned_rounds=session.planned_rounds,
            plan=[t.name for t in session.plan],
            config=snapshot,
            config_hash=provenance.config_hash,
            prompt_versions=provenance.prompt_versions,
            conclave_version=__version__,
            scrub_report=provenance.scrub_report,
            judge_labels=dict(session.labels.by_name),
            shuffle_seed=session.labels.seed,
            peer_labels=session.all_peer_labels(),
            context_sources=provenance.context_sources,
            verbose=settings.verbose,
            filtering=settings.filtering.enabled,
            resumed_rounds=resumed_rounds(self.resume_from),
            anchors=dict(session.quality.anchors),
            verification_questions=[q.id for q in session.quality.questions],
            parent=settings.parent,  # a follow-up: the consultation it continues
        )


async def run_consultation(settings: Settings, **options: Any) -> ConsultationResult:
    """Convenience: ``Consultation(settings, **options).run()``."""
    return await Consultation(settings, **options).run()


def _storage_failure(exc: BaseException) -> StorageError | None:
    """The journal's failure behind ``exc``: itself, or the first of a task group's errors when every one of
    them is a storage failure (each agent's request met the failed journal write it waited for)."""
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        errors = _leaves(exc)
        if errors and all(isinstance(e, StorageError) for e in errors):
            return cast(StorageError, errors[0])
    return None


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"
