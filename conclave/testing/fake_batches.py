"""The fake server's batch APIs: OpenAI Batch (``/v1/files`` + ``/v1/batches``), Anthropic Message Batches
(``/v1/messages/batches``) and Gemini batch mode (``models/{model}:batchGenerateContent`` with inlined requests,
``batches/{id}``, ``batches/{id}:cancel``), as the official SDKs call them.

A batch is answered in one piece ``latency`` seconds after it was created (its counts grow linearly until then),
every request answered as the interactive endpoint would answer it (the model's script: a :class:`Fault` is that
request's failure, a malformed fault a result line that is not JSON). ``outcomes`` scripts how the next batches
end (``completed``, ``expired``, ``cancelled``); a batch over ``limits`` requests is refused with HTTP 400.
``received`` counts request lines, ``resubmitted`` those whose body had already been answered successfully in an
earlier batch (paid twice), or that an earlier accepted batch already holds (submitted twice), ``created`` every
accepted batch as ``(api, id, requests)``. ``stall_create`` holds a create call's response that many seconds after
the batch was accepted (a client killed meanwhile never learns its id); ``stall_upload`` holds an OpenAI file
upload's response (a client killed then never created its batch). Each API lists its batches, newest first,
with its own paging (OpenAI ``after``, Anthropic ``after_id``, Gemini ``pageToken``).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Answer = Callable[[str, Mapping[str, Any]], tuple[int, dict[str, Any] | None]]
#: the most requests one batch may hold, per API (OpenAI: 50,000; Anthropic: 100,000)
LIMITS = {"openai": 50_000, "anthropic": 100_000, "gemini": 100_000}


@dataclass
class FakeBatch:
    api: str
    id: str
    requests: list[tuple[str, dict[str, Any]]]  # (custom_id, request body)
    created: float
    latency: float
    outcome: str
    input_file_id: str = ""
    endpoint: str = ""
    metadata: dict[str, Any] | None = None
    cancelled_at: float | None = None
    results: list[dict[str, Any]] | None = None  # result lines once ended (kind malformed: an unreadable line)
    output_file_id: str | None = None
    error_file_id: str | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def ended(self, now: float) -> bool:
        return self.cancelled_at is not None or now >= self.created + self.latency

    def progress(self, now: float) -> int:
        """Requests done so far (linear in time until the batch ends)."""
        if self.ended(now):
            return len(self.requests)
        share = (now - self.created) / self.latency if self.latency > 0 else 1.0
        return min(len(self.requests), int(share * len(self.requests)))


class BatchDesk:
    """The batch endpoints of one fake server (``fake.batches``)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.latency = 0.0
        self.outcomes: list[str] = []  # how the next batches end, one per batch (then: completed)
        self.limits = dict(LIMITS)
        self.received = 0
        self.resubmitted = 0
        self.created: list[tuple[str, str, int]] = []
        self.batches: dict[str, FakeBatch] = {}
        self.files: dict[str, tuple[str, bytes]] = {}  # id -> (filename, content)
        self.stall_create = 0.0
        self.stall_upload = 0.0  # OpenAI: hold a file upload's response, before any batch is created of it
        self._answered: set[str] = set()  # digests of request bodies answered successfully
        self._held: set[str] = set()  # digests of request bodies in an accepted batch not expired or cancelled
        self._ids = itertools.count(1)

    def add_routes(self, router: web.UrlDispatcher, prefix: Mapping[str, str]) -> None:
        openai, anthropic = prefix["openai"], prefix["anthropic"]
        router.add_post(f"{openai}/files", self._file_upload)
        router.add_get(f"{openai}/files/{{id}}", self._file_get)
        router.add_get(f"{openai}/files/{{id}}/content", self._file_content)
        router.add_post(f"{openai}/batches", self._openai_create)
        router.add_get(f"{openai}/batches", self._openai_list)
        router.add_get(f"{openai}/batches/{{id}}", self._openai_get)
        router.add_post(f"{openai}/batches/{{id}}/cancel", self._openai_cancel)
        gemini = prefix["gemini"]
        router.add_get(f"{gemini}/batches", self._gemini_list)
        router.add_get(f"{gemini}/batches/{{id}}", self._gemini_get)
        router.add_post(f"{gemini}/batches/{{id}}", self._gemini_cancel)  # batches/{id}:cancel
        router.add_post(f"{anthropic}/v1/messages/batches", self._anthropic_create)
        router.add_get(f"{anthropic}/v1/messages/batches", self._anthropic_list)
        router.add_get(f"{anthropic}/v1/messages/batches/{{id}}", self._anthropic_get)
        router.add_get(f"{anthropic}/v1/messages/batches/{{id}}/results", self._anthropic_results)
        router.add_post(f"{anthropic}/v1/messages/batches/{{id}}/cancel", self._anthropic_cancel)

    # ------------------------------------------------------------------------------------- shared

    def _accept(self, api: str, requests: list[tuple[str, dict[str, Any]]], **extra: Any) -> FakeBatch:
        outcome = self.outcomes.pop(0) if self.outcomes else "completed"
        prefix = {"openai": "batch_fake", "anthropic": "msgbatch_fake"}.get(api, "fake")
        batch = FakeBatch(api, f"{prefix}{next(self._ids)}", requests, time.time(), self.latency, outcome, **extra)
        self.received += len(requests)
        digests = [_digest(body) for _, body in requests]
        self.resubmitted += sum(1 for d in digests if d in self._answered or d in self._held)
        self._held.update(digests)
        self.batches[batch.id] = batch
        self.created.append((api, batch.id, len(requests)))
        return batch

    def _finish(self, batch: FakeBatch, now: float) -> None:
        """Answer every request of an ended batch once (expired and cancelled ones answer none)."""
        if batch.results is not None or not batch.ended(now):
            return
        lines: list[dict[str, Any]] = []
        answered = batch.outcome == "completed" and batch.cancelled_at is None
        if not answered:  # never answered: sending these again is no second payment
            self._held -= {_digest(body) for _, body in batch.requests}
        counts = {"succeeded": 0, "errored": 0, "expired": 0, "canceled": 0}
        for custom_id, body in batch.requests:
            if not answered:
                kind = "expired" if batch.outcome == "expired" else "canceled"
                counts[kind] += 1
                lines.append({"custom_id": custom_id, "kind": kind})
                continue
            status, payload = self.answer(batch.api, body)
            if payload is None:
                counts["succeeded"] += 1  # the provider counts it answered; its line cannot be read
                lines.append({"custom_id": custom_id, "kind": "malformed"})
                continue
            ok = status == 200
            if not ok:
                self._held.discard(_digest(body))
            counts["succeeded" if ok else "errored"] += 1
            if ok:
                self._answered.add(_digest(body))
            lines.append({"custom_id": custom_id, "kind": "succeeded" if ok else "errored", "status": status,
                          "body": payload})
        batch.results, batch.counts = lines, counts

    async def stall(self) -> None:
        """Hold a create call's response (the batch is accepted already) for ``stall_create`` seconds."""
        if self.stall_create > 0:
            await asyncio.sleep(self.stall_create)

    def listed(self, api: str, after: str | None, limit: int) -> tuple[list[FakeBatch], bool]:
        """One page of ``api``'s batches, newest first, after the batch ``after``; whether more follow."""
        now = time.time()
        newest = [b for b in reversed(self.batches.values()) if b.api == api]
        for batch in newest:
            self._finish(batch, now)
        ids = [b.id for b in newest]
        start = ids.index(after) + 1 if after in ids else 0
        page = newest[start:start + max(1, min(limit, 100))]
        return page, start + len(page) < len(newest)

    def _batch(self, request: web.Request, api: str) -> FakeBatch:
        batch = self.batches.get(request.match_info["id"])
        if batch is None or batch.api != api:
            raise web.HTTPNotFound(text=json.dumps({"error": {"message": "No batch found", "type": "not_found"}}),
                                   content_type="application/json")
        self._finish(batch, time.time())
        return batch

    # ------------------------------------------------------------------------------------- OpenAI

    async def _file_upload(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        upload = form.get("file")
        if not isinstance(upload, web.FileField):
            return _openai_error(400, "a file is required")
        file_id = f"file-fake{next(self._ids)}"
        self.files[file_id] = (upload.filename, upload.file.read())
        if self.stall_upload > 0:
            await asyncio.sleep(self.stall_upload)
        return web.json_response(self._file_object(file_id, str(form.get("purpose") or "batch")))

    def _file_object(self, file_id: str, purpose: str) -> dict[str, Any]:
        name, content = self.files[file_id]
        return {"id": file_id, "object": "file", "bytes": len(content), "created_at": int(time.time()),
                "filename": name, "purpose": purpose, "status": "processed"}

    async def _file_get(self, request: web.Request) -> web.StreamResponse:
        file_id = request.match_info["id"]
        if file_id not in self.files:
            return _openai_error(404, f"No such File object: {file_id}")
        return web.json_response(self._file_object(file_id, "batch"))

    async def _file_content(self, request: web.Request) -> web.StreamResponse:
        file_id = request.match_info["id"]
        if file_id not in self.files:
            return _openai_error(404, f"No such File object: {file_id}")
        return web.Response(body=self.files[file_id][1], content_type="application/octet-stream")

    async def _openai_create(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        file_id = str(body.get("input_file_id") or "")
        if file_id not in self.files:
            return _openai_error(400, f"input_file_id {file_id!r} is not an uploaded file")
        requests: list[tuple[str, dict[str, Any]]] = []
        for number, line in enumerate(self.files[file_id][1].decode().splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                requests.append((str(entry["custom_id"]), dict(entry["body"])))
            except (ValueError, KeyError, TypeError):
                return _openai_error(400, f"line {number} of the input file is not a batch request")
        if len(requests) > self.limits["openai"]:
            return _openai_error(400, f"a batch holds at most {self.limits['openai']} requests")
        batch = self._accept("openai", requests, input_file_id=file_id, endpoint=str(body.get("endpoint")),
                             metadata=body.get("metadata"))
        await self.stall()
        return web.json_response(self._openai_object(batch))

    async def _openai_list(self, request: web.Request) -> web.StreamResponse:
        page, more = self.listed("openai", request.query.get("after"), int(request.query.get("limit") or 20))
        data = [self._openai_object(b) for b in page]
        return web.json_response({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None, "has_more": more})

    def _openai_object(self, batch: FakeBatch) -> dict[str, Any]:
        now = time.time()
        status = "in_progress"
        if batch.results is not None:
            status = {"completed": "completed", "expired": "expired"}.get(batch.outcome, "cancelled")
            if batch.cancelled_at is not None:
                status = "cancelled"
            if batch.output_file_id is None and batch.error_file_id is None:
                self._openai_files(batch)
        done = batch.progress(now) if batch.results is None else batch.counts.get("succeeded", 0)
        failed = 0 if batch.results is None else len(batch.requests) - batch.counts.get("succeeded", 0)
        return {
            "id": batch.id, "object": "batch", "endpoint": batch.endpoint, "errors": None,
            "input_file_id": batch.input_file_id, "completion_window": "24h", "status": status,
            "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
            "created_at": int(batch.created), "in_progress_at": int(batch.created),
            "expires_at": int(batch.created + 86400), "completed_at": None if batch.results is None else int(now),
            "request_counts": {"total": len(batch.requests), "completed": done, "failed": failed},
            "metadata": batch.metadata,
        }

    def _openai_files(self, batch: FakeBatch) -> None:
        output: list[str] = []
        errors: list[str] = []
        for number, line in enumerate(batch.results or []):
            if line["kind"] == "malformed":
                output.append(f'{{"custom_id": "{line["custom_id"]}", "response": {{"status_code": 200, "body": ')
                continue
            row: dict[str, Any] = {"id": f"batch_req_fake{number}", "custom_id": line["custom_id"]}
            if line["kind"] == "succeeded":
                row.update(response={"status_code": 200, "request_id": f"req_{number}", "body": line["body"]},
                           error=None)
                output.append(json.dumps(row))
            elif line["kind"] == "errored":
                row.update(response={"status_code": line["status"], "request_id": f"req_{number}",
                                     "body": line["body"]}, error=None)
                errors.append(json.dumps(row))
            else:
                code = "batch_expired" if line["kind"] == "expired" else "batch_cancelled"
                row.update(response=None, error={"code": code, "message": f"This request was {line['kind']}."})
                errors.append(json.dumps(row))
        if output:
            batch.output_file_id = f"file-fake{next(self._ids)}"
            self.files[batch.output_file_id] = (f"{batch.id}_output.jsonl", ("\n".join(output) + "\n").encode())
        if errors:
            batch.error_file_id = f"file-fake{next(self._ids)}"
            self.files[batch.error_file_id] = (f"{batch.id}_error.jsonl", ("\n".join(errors) + "\n").encode())

    async def _openai_get(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self._openai_object(self._batch(request, "openai")))

    async def _openai_cancel(self, request: web.Request) -> web.StreamResponse:
        batch = self._batch(request, "openai")
        if batch.results is None:
            batch.cancelled_at = time.time()
            self._finish(batch, batch.cancelled_at)
        return web.json_response(self._openai_object(batch))

    # ------------------------------------------------------------------------------------- Anthropic

    async def _anthropic_create(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        raw = body.get("requests")
        if not isinstance(raw, list) or not raw:
            return _anthropic_error(400, "requests: a non-empty list is required")
        if len(raw) > self.limits["anthropic"]:
            return _anthropic_error(413, f"a batch holds at most {self.limits['anthropic']} requests")
        requests = [(str(r.get("custom_id")), dict(r.get("params") or {})) for r in raw if isinstance(r, dict)]
        batch = self._accept("anthropic", requests)
        await self.stall()
        return web.json_response(self._anthropic_object(batch))

    async def _anthropic_list(self, request: web.Request) -> web.StreamResponse:
        page, more = self.listed("anthropic", request.query.get("after_id"), int(request.query.get("limit") or 20))
        data = [self._anthropic_object(b) for b in page]
        return web.json_response({"data": data, "has_more": more, "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None})

    def _anthropic_object(self, batch: FakeBatch) -> dict[str, Any]:
        now = time.time()
        ended = batch.results is not None
        counts = {"processing": 0 if ended else len(batch.requests), "succeeded": 0, "errored": 0, "canceled": 0,
                  "expired": 0}
        if ended:
            counts.update(batch.counts)
        def stamp(t: float) -> str:
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
        return {
            "id": batch.id, "type": "message_batch", "processing_status": "ended" if ended else "in_progress",
            "request_counts": counts, "created_at": stamp(batch.created),
            "expires_at": stamp(batch.created + 86400), "ended_at": stamp(now) if ended else None,
            "cancel_initiated_at": None if batch.cancelled_at is None else stamp(batch.cancelled_at),
            "archived_at": None, "results_url": f"/v1/messages/batches/{batch.id}/results" if ended else None,
        }

    async def _anthropic_get(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self._anthropic_object(self._batch(request, "anthropic")))

    async def _anthropic_cancel(self, request: web.Request) -> web.StreamResponse:
        batch = self._batch(request, "anthropic")
        if batch.results is None:
            batch.cancelled_at = time.time()
            self._finish(batch, batch.cancelled_at)
        return web.json_response(self._anthropic_object(batch))

    async def _anthropic_results(self, request: web.Request) -> web.StreamResponse:
        batch = self._batch(request, "anthropic")
        if batch.results is None:
            return _anthropic_error(400, f"batch {batch.id} is still in progress")
        out: list[str] = []
        for line in batch.results:
            if line["kind"] == "malformed":
                out.append(f'{{"custom_id": "{line["custom_id"]}", "result": {{"type": "succeeded", "message": ')
            elif line["kind"] == "succeeded":
                out.append(json.dumps({"custom_id": line["custom_id"],
                                       "result": {"type": "succeeded", "message": line["body"]}}))
            elif line["kind"] == "errored":
                out.append(json.dumps({"custom_id": line["custom_id"],
                                       "result": {"type": "errored", "error": line["body"]}}))
            else:
                out.append(json.dumps({"custom_id": line["custom_id"], "result": {"type": line["kind"]}}))
        return web.Response(body=("\n".join(out) + "\n").encode(), content_type="application/binary")


    # ------------------------------------------------------------------------------------- Gemini

    async def gemini_create(self, request: web.Request, model: str) -> web.StreamResponse:
        """``POST models/{model}:batchGenerateContent`` with inlined requests (the fake server routes it here)."""
        body = await request.json()
        config = ((body.get("batch") or {}).get("inputConfig") or {})
        raw = ((config.get("requests") or {}).get("requests")) or []
        if not isinstance(raw, list) or not raw:
            return _gemini_error(400, "batch.inputConfig.requests.requests: a non-empty list is required")
        requests = [(str((r.get("metadata") or {}).get("key")), {**dict(r.get("request") or {}), "model": model})
                    for r in raw if isinstance(r, dict)]
        batch = self._accept("gemini", requests, endpoint=model, metadata=body.get("batch"))
        await self.stall()
        return web.json_response(self._gemini_object(batch))

    async def _gemini_list(self, request: web.Request) -> web.StreamResponse:
        token = request.query.get("pageToken")
        page, more = self.listed("gemini", token, int(request.query.get("pageSize") or 20))
        body: dict[str, Any] = {"operations": [self._gemini_object(b) for b in page]}
        if more:
            body["nextPageToken"] = page[-1].id
        return web.json_response(body)

    def _gemini_object(self, batch: FakeBatch) -> dict[str, Any]:
        ended = batch.results is not None
        state = "BATCH_STATE_RUNNING"
        if ended:
            state = {"completed": "BATCH_STATE_SUCCEEDED", "expired": "BATCH_STATE_EXPIRED"}.get(
                batch.outcome, "BATCH_STATE_CANCELLED")
            if batch.cancelled_at is not None:
                state = "BATCH_STATE_CANCELLED"
        done = batch.progress(time.time()) if not ended else len(batch.requests)
        failed = 0 if not ended else len(batch.requests) - batch.counts.get("succeeded", 0)
        metadata: dict[str, Any] = {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
            "name": f"batches/{batch.id}", "displayName": str((batch.metadata or {}).get("displayName") or batch.id),
            "model": f"models/{batch.endpoint}", "state": state,
            "createTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(batch.created)),
            "batchStats": {"requestCount": str(len(batch.requests)), "successfulRequestCount": str(done - failed),
                           "failedRequestCount": str(failed), "pendingRequestCount": str(len(batch.requests) - done)}}
        if ended:
            metadata["endTime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            responses = []
            for line in batch.results or []:
                key = {"key": line["custom_id"]}
                if line["kind"] == "succeeded":
                    responses.append({"response": line["body"], "metadata": key})
                elif line["kind"] == "errored":
                    error = (line["body"] or {}).get("error") or {}
                    responses.append({"error": {"code": line["status"], "message": error.get("message", "")},
                                      "metadata": key})
                elif line["kind"] == "malformed":
                    responses.append({"response": "{not json", "metadata": key})
            if state == "BATCH_STATE_SUCCEEDED":
                metadata["output"] = {"inlinedResponses": {"inlinedResponses": responses}}
        return {"name": f"batches/{batch.id}", "metadata": metadata, "done": ended}

    async def _gemini_get(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self._gemini_object(self._batch(request, "gemini")))

    async def _gemini_cancel(self, request: web.Request) -> web.StreamResponse:
        batch_id, _, method = request.match_info["id"].partition(":")
        batch = self.batches.get(batch_id)
        if method != "cancel" or batch is None or batch.api != "gemini":
            return _gemini_error(404, f"no batch {batch_id}")
        if batch.results is None:
            batch.cancelled_at = time.time()
            self._finish(batch, batch.cancelled_at)
        return web.json_response({})


def _digest(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _openai_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                        "code": None}}, status=status)


def _gemini_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"code": status, "message": message, "status": "INVALID_ARGUMENT"}},
                             status=status)


def _anthropic_error(status: int, message: str) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": "invalid_request_error", "message": message}},
                             status=status)
