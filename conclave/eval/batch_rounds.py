"""A batched evaluation's calls (``eval.batch=true|mixed``): every item's consultation runs at once, and each
time every unfinished item waits on a model, the waiting requests go out as one batch per provider (split at the
provider's size limit). Selective debate and early termination decide inside each consultation, between batches,
which items go on.

Every batch is journaled in the run's ``batches.jsonl`` three times: its intent (a tag of our choosing, its
requests) before the provider sees it, its id once the provider accepted it (before it is polled), its answers
when it ends. The tag travels with the batch (OpenAI: ``metadata``; Anthropic: the custom ids' prefix; Gemini: the
display name), so a run killed between the provider's acceptance and the id's journal entry finds the batch in the
provider's list when it resumes, and adopts it instead of submitting it again. A resumed run polls the batches
still open and serves every journaled answer again without asking (a request is known by its item, its content and
its occurrence), so nothing accepted is submitted twice. A request that failed inside a batch goes into the next
one (``mixed``: is asked interactively); an unreadable result line is its item's failure.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

from conclave.eval import run_store as store
from conclave.eval.batch_progress import BatchProgress, record_progress
from conclave.providers.base import (
    BatchClient,
    BatchStatus,
    Completion,
    CompletionRequest,
    MalformedResponseError,
    Provider,
    ProviderError,
    Usage,
)
from conclave.providers.pricing import PriceTable

BatchMode = Literal["true", "mixed"]
#: a transient failure while polling: ask again this many times before the batch's items fail
POLL_FAILURES = 5


@dataclass
class _Wait:
    key: str
    item: str
    round_number: int
    provider: Provider
    request: CompletionRequest
    future: asyncio.Future[Completion]
    tries: int = 0


@dataclass
class BatchFigures:
    """What the batches of one run did: spend at batch prices and its interactive equivalent, batches by wave."""

    batch_cost: float = 0.0
    interactive_cost: float = 0.0
    unpriced: set[str] = field(default_factory=set)
    requests: int = 0
    served_from_journal: int = 0
    retried: int = 0
    #: (wave, provider, or provider/model where a batch holds one model) -> batches submitted: a wave is one
    #: barrier, where every unfinished item waits
    batches: Counter[tuple[int, str]] = field(default_factory=Counter)
    lost: list[dict[str, Any]] = field(default_factory=list)  # expired, cancelled or failed batches

    def as_dict(self) -> dict[str, Any]:
        per_wave = max(self.batches.values(), default=0)
        return {"batch_cost": round(self.batch_cost, 8), "interactive_cost": round(self.interactive_cost, 8),
                "ratio": round(self.batch_cost / self.interactive_cost, 4) if self.interactive_cost else None,
                "unpriced": sorted(self.unpriced), "requests": self.requests,
                "served_from_journal": self.served_from_journal, "retried": self.retried,
                "batches": sum(self.batches.values()), "waves": len({w for w, _ in self.batches}),
                "most_batches_per_provider_per_wave": per_wave, "lost": self.lost}


class BatchRounds:
    """The batch route of one evaluation run (``for_item`` hands each consultation its view)."""

    def __init__(self, home: Path, run_id: str, mode: BatchMode, err: TextIO, provider: Callable[[str], Provider],
                 *, poll_s: float = 30.0, settle_s: float = 0.05, prices: PriceTable | None = None,
                 max_requests: int | None = None) -> None:
        """``provider``: the run's own provider instance by name (its session outlives every item's), which
        submits, polls and reads every batch."""
        self.home, self.run_id, self.mode, self.err = Path(home), run_id, mode, err
        self.provider = provider
        #: item -> [its calls' cost at batch prices, the same calls at interactive prices]
        self.per_item: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.poll_s, self.settle_s = poll_s, settle_s
        self.max_requests = max_requests  # a batch's size at most, under the provider's own limit
        self.prices = prices or PriceTable.load()
        self.figures = BatchFigures()
        self.live: set[str] = set()
        self.outstanding: Counter[str] = Counter()
        self.pending: list[_Wait] = []
        self.answers: dict[str, dict[str, Any]] = {}  # key -> a journaled completion
        self.open: dict[str, dict[str, Any]] = {}  # batch id -> its submitted record, not yet ended
        self.intents: dict[str, dict[str, Any]] = {}  # tag -> a batch about to be submitted, its id not journaled
        self.inflight: dict[str, asyncio.Future[Completion]] = {}  # key -> the answer of a resumed open batch
        self._occurrences: Counter[tuple[str, str]] = Counter()
        self._arrivals = 0
        self._wave = 0
        self._watcher: asyncio.Task[None] | None = None
        self._progress_failed = False
        self._tasks: set[asyncio.Task[None]] = set()
        for record in store.read_batches(self.home, run_id):
            event = record.get("event")
            if event == "intent":
                self.intents[str(record["tag"])] = record
            elif event == "submitted":  # the intent's requests, now with the batch's id
                intent = self.intents.pop(str(record.get("tag")), {})
                self.open[str(record["batch_id"])] = {**intent, **record}
            elif event == "abandoned":  # the provider never accepted it
                self.intents.pop(str(record.get("tag")), None)
            elif event == "answers":
                self.answers.update(record.get("answers") or {})
            elif event == "ended":
                self.open.pop(str(record.get("batch_id")), None)
        self._wave = max((int(r.get("wave") or 0) for r in [*self.open.values(), *self.intents.values()]),
                         default=0)

    # ------------------------------------------------------------------------------------- per item

    def for_item(self, item_id: str) -> ItemBatches:
        self.live.add(item_id)
        return ItemBatches(self, item_id)

    def item_done(self, item_id: str) -> None:
        """The item's consultation ended: the barrier no longer waits for it."""
        self.live.discard(item_id)
        self._kick()

    def batches(self, provider: Provider) -> bool:
        return provider.batch_client() is not None

    def resume(self) -> None:
        """Poll again the batches an earlier, killed run left open, and look up in the provider's list those it
        was submitting when it died (accepted: adopted and polled; not: their requests go into a new batch)."""
        for tag, intent in list(self.intents.items()):
            provider = self.provider(str(intent.get("provider")))
            client = provider.batch_client()
            if client is None:
                continue
            futures = {key: asyncio.get_running_loop().create_future() for key in intent.get("keys") or []}
            self.inflight.update(futures)
            print(f"conclave eval: batch {tag} ({provider.name}): was being submitted when the run stopped; "
                  f"looking for it among the provider's batches", file=self.err, flush=True)
            self._spawn(self._adopt(client, provider, intent, futures), list(futures.values()))
        for batch_id, record in list(self.open.items()):
            provider = self.provider(str(record.get("provider")))
            client = provider.batch_client()
            if client is None:
                continue
            keys = list(record.get("keys") or [])
            futures = {key: asyncio.get_running_loop().create_future() for key in keys}
            self.inflight.update(futures)
            print(f"conclave eval: batch {batch_id} ({provider.name}): polling again after a restart, "
                  f"{len(keys)} request(s), not submitted again", file=self.err, flush=True)
            self._spawn(self._resumed(client, provider, batch_id, futures), list(futures.values()))

    async def _adopt(self, client: BatchClient, provider: Provider, intent: dict[str, Any],
                     futures: dict[str, asyncio.Future[Completion]]) -> None:
        tag = str(intent["tag"])
        try:
            batch_id, why = await self._find(client, provider, intent), "the provider never accepted it"
        except ProviderError as exc:  # the list cannot be read: unknown, so the requests are asked again
            batch_id, why = None, f"its batches cannot be listed ({exc})"
        self.intents.pop(tag, None)
        if batch_id is None:
            store.append_batch(self.home, self.run_id, {"event": "abandoned", "tag": tag})
            print(f"conclave eval: batch {tag} ({provider.name}): {why}; its {len(futures)} request(s) go into "
                  f"a new batch", file=self.err, flush=True)
            for key, future in futures.items():
                self.inflight.pop(key, None)
                if not future.done():
                    future.set_exception(_NotSubmitted(f"{provider.name}: batch {tag} was never accepted",
                                                       provider=provider.name))
            return
        store.append_batch(self.home, self.run_id, {"event": "submitted", "tag": tag, "batch_id": batch_id,
                                                     "adopted": True, "at": time.time()})
        self.open[batch_id] = {**intent, "event": "submitted", "batch_id": batch_id}
        print(f"conclave eval: batch {batch_id} ({provider.name}): found by its tag {tag}, accepted before the "
              f"run stopped; polling it, {len(futures)} request(s), not submitted again", file=self.err, flush=True)
        await self._resumed(client, provider, batch_id, futures)

    async def _find(self, client: BatchClient, provider: Provider, intent: dict[str, Any]) -> str | None:
        """The id of the batch submitted with ``intent``'s tag, from the provider's list (asked again after a
        transient failure, like polling); None when the provider holds none."""
        failures = 0
        while True:
            try:
                return await client.find(str(intent["tag"]), len(intent.get("keys") or []),
                                         float(intent.get("at") or 0.0))
            except ProviderError as exc:
                failures += 1
                if failures > POLL_FAILURES or (not exc.retryable and exc.status is not None and exc.status < 500):
                    raise
                await asyncio.sleep(self.poll_s)

    async def _resumed(self, client: BatchClient, provider: Provider, batch_id: str,
                       futures: dict[str, asyncio.Future[Completion]]) -> None:
        shapes = (self.open.get(batch_id) or {}).get("shapes") or {}
        # what reading an answer needs of its request (model, schema), as journaled with the batch
        requests = {key: CompletionRequest(model=str(shape.get("model") or ""), messages=(),
                                           json_schema=shape.get("json_schema"), schema_name=shape.get("schema_name"))
                    for key, shape in shapes.items()}
        status = await self._poll(client, provider, batch_id)
        results = await self._results(client, batch_id, status, requests)
        for key, future in futures.items():
            self.inflight.pop(key, None)
            answer = results.get(key)
            if future.done():
                continue
            if isinstance(answer, Completion):
                future.set_result(answer)
            else:
                future.set_exception(answer or _missing(provider, key))

    async def complete(self, item: str, provider: Provider, request: CompletionRequest,
                       round_number: int) -> Completion:
        key = self._key(item, provider.name, request)
        if key in self.answers:  # answered in a batch of an earlier run: paid once, served again
            self.figures.served_from_journal += 1
            answer = _completion(self.answers[key], provider.name)
            self._count(item, provider, answer)  # billed in the earlier run, counted once: this item's cost
            return answer
        self.outstanding[item] += 1
        self._kick()
        try:
            resumed = self.inflight.get(key)
            if resumed is not None:
                try:
                    answer = await resumed
                    self._count(item, provider, answer)
                    return answer
                except _NotSubmitted:
                    pass  # never accepted: into the next batch
                except ProviderError:
                    if self.mode == "mixed":
                        return await self._interactive(item, provider.name, request)
                    # failed in the earlier run's batch: into the next batch
            future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
            self.pending.append(_Wait(key, item, round_number, provider, request, future))
            self._arrivals += 1
            self._kick()
            return await future
        finally:
            self.outstanding[item] -= 1

    def _key(self, item: str, provider: str, request: CompletionRequest) -> str:
        """The request's custom id: its item, its content and how many identical requests the item asked before
        (a re-sample of round 1 is another request)."""
        content = json.dumps([provider, request.model, request.system, [(m.role, m.content) for m in request.messages],
                              request.json_schema, request.max_tokens, request.temperature],
                             sort_keys=True, ensure_ascii=False, default=str)
        digest = hashlib.sha256(f"{item}\x00{content}".encode()).hexdigest()[:24]
        occurrence = self._occurrences[(item, digest)]
        self._occurrences[(item, digest)] += 1
        return f"{digest}-{occurrence}"

    # ------------------------------------------------------------------------------------- the barrier

    def _kick(self) -> None:
        if self.pending and (self._watcher is None or self._watcher.done()):
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """Submit the waiting requests once every unfinished item waits on a model and none arrived for a
        moment (the calls of one step of a round reach the route at once)."""
        while self.pending:
            seen = self._arrivals
            await asyncio.sleep(self.settle_s)
            if seen != self._arrivals:
                continue
            if all(self.outstanding[item] > 0 for item in self.live):
                self._flush()

    def _flush(self) -> None:
        # The rows of the items that finished before this barrier were written unsynced: durable before the next
        # batches spend anything (one fsync per barrier, not one per item).
        store.sync_items(self.home, self.run_id)
        waits, self.pending = self.pending, []
        self._wave += 1
        groups: dict[tuple[str, str], list[_Wait]] = defaultdict(list)
        for wait in waits:
            client = self.provider(wait.provider.name).batch_client()
            assert client is not None  # only batched providers reach the route
            groups[(wait.provider.name, wait.request.model if client.per_model else "")].append(wait)
        for (name, _), group in groups.items():
            client = self.provider(name).batch_client()
            assert client is not None
            size = min(client.limit, self.max_requests or client.limit)
            for start in range(0, len(group), size):
                chunk = group[start:start + size]
                self._spawn(self._one_batch(client, chunk, self._wave), [w.future for w in chunk])

    def _spawn(self, coroutine: Any, futures: list[asyncio.Future[Completion]]) -> None:
        """Run one batch's task; should it fail outside a provider's answer (the journal cannot be written, a
        bug), every request it holds fails with that error instead of waiting forever. A task that ended normally
        settled each request itself: answered, failed, or put back in ``pending`` for the next batch, whose
        future must stay open for it."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)

        def settle(done: asyncio.Task[None]) -> None:
            self._tasks.discard(done)
            error = None if done.cancelled() else done.exception()
            if error is None and not done.cancelled():
                return
            requeued = {wait.future for wait in self.pending}  # no longer this task's to fail
            for future in futures:
                if not future.done() and future not in requeued:
                    future.set_exception(error or asyncio.CancelledError())

        task.add_done_callback(settle)

    # ------------------------------------------------------------------------------------- one batch

    async def _one_batch(self, client: BatchClient, waits: list[_Wait], wave: int) -> None:
        provider = self.provider(waits[0].provider.name)
        rounds = sorted({w.round_number for w in waits})
        tag, at = secrets.token_hex(8), time.time()
        intent = {
            "event": "intent", "tag": tag, "provider": provider.name, "wave": wave, "rounds": rounds,
            "keys": [w.key for w in waits], "items": sorted({w.item for w in waits}), "at": at,
            "shapes": {w.key: {"model": w.request.model, "schema_name": w.request.schema_name,
                               "json_schema": w.request.json_schema} for w in waits}}
        store.append_batch(self.home, self.run_id, intent)  # on disk before the provider sees the batch
        self.intents[tag] = intent
        try:
            batch_id = await client.submit([(w.key, w.request) for w in waits], tag=tag)
        except ProviderError as exc:
            found = None
            if exc.status is None or exc.status >= 500:  # no answer, or a server's failure: it may have accepted
                try:
                    found = await client.find(tag, len(waits), at)
                except ProviderError:
                    found = None
            if found is None:
                self.intents.pop(tag, None)
                store.append_batch(self.home, self.run_id, {"event": "abandoned", "tag": tag})
                print(f"conclave eval: {provider.name}: batch of {len(waits)} request(s) refused: {exc}",
                      file=self.err, flush=True)
                for wait in waits:
                    await self._failed(wait, exc)
                return
            batch_id = found
        self.intents.pop(tag, None)
        store.append_batch(self.home, self.run_id, {"event": "submitted", "tag": tag, "batch_id": batch_id,
                                                     "at": time.time()})
        self.open[batch_id] = {**intent, "event": "submitted", "batch_id": batch_id}
        self.figures.batches[(wave, f"{provider.name}/{waits[0].request.model}" if client.per_model
                              else provider.name)] += 1
        print(f"conclave eval: batch {batch_id} ({provider.name}, round {'/'.join(map(str, rounds))}): "
              f"submitted {len(waits)} request(s)", file=self.err, flush=True)
        status = await self._poll(client, provider, batch_id)
        results = await self._results(client, batch_id, status, {w.key: w.request for w in waits})
        for wait in waits:
            answer = results.get(wait.key)
            if isinstance(answer, Completion):
                self._count(wait.item, provider, answer)
                wait.future.set_result(answer)
            elif isinstance(answer, MalformedResponseError):  # an unreadable line: that item's failure
                wait.future.set_exception(answer)
            else:
                await self._failed(wait, answer or _missing(provider, wait.key))

    async def _poll(self, client: BatchClient, provider: Provider, batch_id: str) -> BatchStatus:
        shown: tuple[str, int, int] | None = None
        failures = 0
        while True:
            try:
                status = await client.status(batch_id)
                failures = 0
            except ProviderError as exc:
                failures += 1
                if failures > POLL_FAILURES:
                    return BatchStatus("failed", f"unreachable ({exc})", 0, 0, 0)
                await asyncio.sleep(self.poll_s)
                continue
            if (status.status, status.done, status.failed) != shown:
                shown = (status.status, status.done, status.failed)
                self._progress(provider, batch_id, status)
            if status.ended:
                return status
            await asyncio.sleep(self.poll_s)

    def _progress(self, provider: Provider, batch_id: str, status: BatchStatus) -> None:
        """The batch's ``eval:batch_progress`` record: on the terminal (and so over MCP) and in ``progress.jsonl``
        (the web view's run page)."""
        record = self.open.get(batch_id) or {}
        progress = BatchProgress(self.run_id, provider.name, batch_id, status.status, status.state, status.done,
                                 status.failed, status.total, int(record.get("wave") or 0),
                                 tuple(int(r) for r in record.get("rounds") or ()), time.time())
        print(progress.line(), file=self.err, flush=True)
        try:
            record_progress(self.home, progress)
        except OSError as exc:  # a view that falls behind, never a reason to stop polling
            if not self._progress_failed:
                self._progress_failed = True
                print(f"conclave eval: warning: batch progress not recorded for the web view ({exc})",
                      file=self.err, flush=True)

    async def _results(self, client: BatchClient, batch_id: str, status: BatchStatus,
                       requests: Mapping[str, CompletionRequest]) -> dict[str, Completion | ProviderError]:
        results: dict[str, Completion | ProviderError] = {}
        if status.state != "failed" or status.total:
            try:
                results = await client.results(batch_id, requests)
            except ProviderError as exc:
                print(f"conclave eval: batch {batch_id}: results not readable: {exc}", file=self.err, flush=True)
        answered = {key: _stored(answer) for key, answer in results.items() if isinstance(answer, Completion)}
        store.append_batch(self.home, self.run_id, {"event": "answers", "batch_id": batch_id, "answers": answered})
        self.answers.update(answered)
        lost = [key for key in requests if key not in answered]
        record = {"event": "ended", "batch_id": batch_id, "state": status.state, "status": status.status,
                  "answered": len(answered), "unanswered": lost}
        store.append_batch(self.home, self.run_id, record)
        if status.state != "completed":
            items = list((self.open.get(batch_id) or {}).get("items") or [])
            self.figures.lost.append({"batch_id": batch_id, "state": status.state, "items": items})
            print(f"conclave eval: batch {batch_id} {status.state}: {len(lost)} request(s) unanswered, of item(s) "
                  f"{', '.join(items)}", file=self.err, flush=True)
        self.open.pop(batch_id, None)
        return results

    async def _failed(self, wait: _Wait, error: ProviderError) -> None:
        """A request the batch did not answer: into the next batch (``mixed``: asked interactively), until the
        provider's ``max_attempts``."""
        wait.tries += 1
        unanswered = isinstance(error, _Unanswered)  # expired or cancelled: never tried, so try it again
        if wait.tries >= wait.provider.settings.max_attempts or not (error.retryable or unanswered):
            wait.future.set_exception(error)
            return
        self.figures.retried += 1
        if self.mode == "mixed":
            try:
                wait.future.set_result(await self._interactive(wait.item, wait.provider.name, wait.request))
            except ProviderError as exc:
                wait.future.set_exception(exc)
            return
        self.pending.append(wait)
        self._arrivals += 1
        self._kick()

    async def _interactive(self, item: str, name: str, request: CompletionRequest) -> Completion:
        provider = self.provider(name)
        answer = await provider.attempt(request)
        self._count(item, provider, answer, batch=False)
        return answer

    def _count(self, item: str, provider: Provider, answer: Completion, *, batch: bool = True) -> None:
        names = (provider.name, provider.settings.api)
        billed = 0.0 if provider.costs_nothing() else self.prices.cost(names, answer.model, answer.usage,
                                                                       batch=batch)
        interactive = 0.0 if provider.costs_nothing() else self.prices.cost(names, answer.model, answer.usage)
        self.figures.requests += 1
        if billed is None or interactive is None:
            self.figures.unpriced.add(f"{provider.name}/{answer.model}")
            return
        self.figures.batch_cost += billed
        self.figures.interactive_cost += interactive
        self.per_item[item][0] += billed
        self.per_item[item][1] += interactive

    async def drain(self) -> None:
        """Wait for the batches still being polled (none once every item finished)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


class ItemBatches:
    """One item's view of the run's batches: the :class:`~conclave.providers.pool.BatchRoute` of its
    consultation."""

    def __init__(self, rounds: BatchRounds, item: str) -> None:
        self.rounds, self.item = rounds, item

    def batches(self, provider: Provider) -> bool:
        return self.rounds.batches(provider)

    async def complete(self, provider: Provider, request: CompletionRequest, round_number: int) -> Completion:
        return await self.rounds.complete(self.item, provider, request, round_number)


class _Unanswered(ProviderError):
    outcome = "cancelled"


class _NotSubmitted(ProviderError):
    """A batch an earlier run was submitting when it died, which the provider never accepted."""


def _missing(provider: Provider, key: str) -> ProviderError:
    return _Unanswered(f"{provider.name}: the batch ended without answering request {key} (expired or cancelled)",
                       provider=provider.name)


def _stored(answer: Completion) -> dict[str, Any]:
    return {"text": answer.text, "parsed": answer.parsed, "usage": asdict(answer.usage), "model": answer.model,
            "finish_reason": answer.finish_reason, "structured_output": answer.structured_output}


def _completion(data: Mapping[str, Any], provider: str) -> Completion:
    return Completion(text=str(data.get("text") or ""), parsed=data.get("parsed"),
                      usage=Usage(**dict(data.get("usage") or {})), model=str(data.get("model") or ""),
                      provider=provider, finish_reason=data.get("finish_reason"), latency_s=0.0,
                      structured_output=data.get("structured_output"))
