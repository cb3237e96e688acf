"""``conclave mcp`` on the 2026-07-28 revision with the official 2.x client: consultations as tasks (the
``io.modelcontextprotocol/tasks`` extension), cancel and resume, a client that leaves mid-task, cost approval on
every path (input_required, elicitation, neither), and protocol errors for bad task ids, malformed params and
revisions the server does not speak. The fake provider server counts every request: nothing is paid before
approval."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, ElicitResult, Request, RequestParams, Result
from test_mcp import http_server, journal_records, mcp_session, round_of, slow_replies, text_of

from conclave import events as ev
from conclave.eval import run_store as store
from conclave.store.journal import read_journal
from conclave.store.paths import StoreLayout
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer

MODERN = "2026-07-28"


def all_journal_records(home: Path) -> list[dict[str, Any]]:
    return [r for path in StoreLayout(home).journal_dir.glob("*.jsonl") for r in read_journal(path).records]
TASKS = "io.modelcontextprotocol/tasks"
QUESTION = "Should we shard the database?"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


class TaskParams(RequestParams):
    task_id: str


class TaskGet(Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams


class TaskResult(Request[TaskParams, Literal["tasks/result"]]):
    method: Literal["tasks/result"] = "tasks/result"
    params: TaskParams


class TaskCancel(Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams


class TaskInfo(Result):
    task_id: str
    status: str
    status_message: str | None = None
    progress: float = 0.0
    total: float | None = None


class TaskAnswer(Result):
    result_type: Literal["task"] = "task"
    task: TaskInfo


class Tasks(ClientExtension):
    """The client side of the Tasks extension: declares it, and finishes a task answer by fetching its result."""

    identifier = TASKS

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskAnswer, resolve=self.resolve)]

    async def resolve(self, answer: TaskAnswer, ctx: ClaimContext) -> CallToolResult:
        return await ctx.session.send_request(TaskResult(params=TaskParams(task_id=answer.task.task_id)),
                                              CallToolResult)


async def start_task(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[TaskInfo, float]:
    started = time.perf_counter()
    answer = await client.session.call_tool(tool, arguments, allow_claimed=True)
    elapsed = time.perf_counter() - started
    assert isinstance(answer, TaskAnswer), answer
    return answer.task, elapsed


async def get(client: Client, task_id: str) -> TaskInfo:
    return await client.session.send_request(TaskGet(params=TaskParams(task_id=task_id)), TaskInfo)


async def result_of(client: Client, task_id: str) -> CallToolResult:
    return await client.session.send_request(TaskResult(params=TaskParams(task_id=task_id)), CallToolResult)


async def poll_until(client: Client, task_id: str, done: Any, seen: list[tuple[float, TaskInfo]] | None = None,
                     every: float = 0.1, limit: float = 120) -> TaskInfo:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        info = await get(client, task_id)
        if seen is not None:
            seen.append((time.time(), info))
        if done(info):
            return info
        await asyncio.sleep(every)
    raise AssertionError(f"task {task_id} never reached the state asked for")


async def test_a_consultation_is_a_task_with_fresh_status_and_a_result(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    slow_replies(fake_provider_server, 0.3)
    seen: list[tuple[float, TaskInfo]] = []
    async with mcp_session(home, fake_provider_server, mode=MODERN, extensions=[Tasks()]) as client:
        assert client.protocol_version == MODERN
        await client.list_tools()  # the server has started (a 2026 client sends no handshake to wait for)
        # the first consultation of a process also loads and caches its configs and schemas (about 1 s here)
        warm, _ = await start_task(client, "conclave_consult", {"question": "Warm up?", "max_cost": 100,
                                                                "rounds": 1})
        await result_of(client, warm.task_id)
        task, elapsed = await start_task(client, "conclave_consult", {"question": QUESTION, "max_cost": 100,
                                                                      "rounds": 4})
        final = await poll_until(client, task.task_id, lambda i: i.status != "working", seen, every=0.05)
        result = await result_of(client, task.task_id)
    assert elapsed <= 1.0, elapsed  # time from the tool call to a returned task id
    assert task.status == "working" and task.task_id.startswith("c-")
    assert final.status == "completed", final
    assert not result.is_error and result.structured_content is not None
    assert result.structured_content["consultation_id"] == task.task_id
    assert result.structured_content["status"] == "complete"
    # freshness: each round's end shows in the status within 2 s of its journal record
    records = [r for r in all_journal_records(home) if r["consultation_id"] == task.task_id]
    for record in (r for r in records if r["type"] == ev.ROUND_COMPLETED):
        number = record["data"]["round_number"]
        first = next(t for t, info in seen if info.progress >= number)
        assert first - record["ts"] <= 2.0, (number, first - record["ts"])
    messages = [info.status_message or "" for _, info in seen]
    assert any(m.startswith("round 2 · synthesis") for m in messages) and seen[-1][1].total == 4.0


async def test_a_task_answers_transparently_through_the_client_extension_over_http(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    async with http_server(home, fake_provider_server) as (url, token):
        authorized = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                        timeout=httpx2.Timeout(30, read=300))
        async with authorized, Client(streamable_http_client(url, http_client=authorized), mode=MODERN,
                                      extensions=[Tasks()]) as client:
            await client.list_tools()
            task, _ = await start_task(client, "conclave_consult", {"question": QUESTION, "max_cost": 100,
                                                                    "rounds": 2})
            result = await client.call_tool("conclave_consult", {"question": "Again?", "max_cost": 100,
                                                                 "rounds": 1})
            first = await result_of(client, task.task_id)
    assert task.status == "working"
    assert not result.is_error and result.structured_content["status"] == "complete"
    assert not first.is_error and first.structured_content["completed_rounds"] == 2


async def test_a_cancelled_task_stops_like_ctrl_c_and_resumes_without_paying_again(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    fake = fake_provider_server
    slow_replies(fake, 0.6)
    async with mcp_session(home, fake, mode=MODERN, extensions=[Tasks()]) as client:
        task, _ = await start_task(client, "conclave_consult", {"question": QUESTION, "max_cost": 100})
        await poll_until(client, task.task_id, lambda i: (i.status_message or "").startswith("round 3 · cross_exam"))
        await asyncio.sleep(0.3)
        cancelled = await client.session.send_request(TaskCancel(params=TaskParams(task_id=task.task_id)), TaskInfo)
        after = await get(client, task.task_id)
        stopped = await result_of(client, task.task_id)
        asked_before = len(fake.requests)
        again, _ = await start_task(client, "conclave_resume", {"id": task.task_id})
        resumed = await result_of(client, again.task_id)
        asked_after = Counter(round_of(r) for r in fake.requests[asked_before:])
    assert cancelled.status == "cancelled" and after.status == "cancelled"
    assert stopped.is_error and "conclave_resume" in text_of(stopped)
    assert again.task_id == task.task_id  # the task id is the consultation's
    assert not resumed.is_error and resumed.structured_content["status"] == "complete"
    assert asked_after[1] == 0 and asked_after[2] == 0 and asked_after[3] > 0, asked_after
    records = journal_records(home)
    assert [r["data"]["reason"] for r in records if r["type"] == ev.ROUND_INTERRUPTED] == ["cancelled"]


async def test_a_client_that_leaves_mid_task_leaves_an_intact_journal_that_resumes(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    fake = fake_provider_server
    slow_replies(fake, 0.6)
    async with mcp_session(home, fake, mode=MODERN, extensions=[Tasks()]) as client:
        task, _ = await start_task(client, "conclave_consult", {"question": QUESTION, "max_cost": 100})
        await poll_until(client, task.task_id, lambda i: (i.status_message or "").startswith("round 2 · synthesis"))
    # the client closed stdin: the server stopped; a new one answers for the task from the journal
    async with mcp_session(home, fake, mode=MODERN, extensions=[Tasks()]) as client:
        verified = await client.call_tool("conclave_verify", {"id": task.task_id})
        before = await get(client, task.task_id)
        again, _ = await start_task(client, "conclave_resume", {"id": task.task_id})
        resumed = await result_of(client, again.task_id)
        after = await get(client, task.task_id)
    assert verified.structured_content["ok"] is True, text_of(verified)
    # saved as partial when the server stopped it, interrupted when it was killed first: resumable either way
    assert before.status == "failed" and before.status_message in ("finished: partial", "consultation interrupted")
    assert not resumed.is_error and resumed.structured_content["status"] == "complete"
    assert after.status == "completed"
    assert [r["data"]["round_number"] for r in journal_records(home)
            if r["type"] == ev.ROUND_COMPLETED][:1] == [1]


async def test_bad_task_ids_and_malformed_params_are_protocol_errors_naming_the_problem(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    async with mcp_session(home, fake_provider_server, mode=MODERN, extensions=[Tasks()]) as client:
        with pytest.raises(MCPError, match="taskId: unknown task 'c-nope'"):
            await get(client, "c-nope")
        with pytest.raises(MCPError, match=r"taskId: unknown task '\.\./\.\./etc/passwd'"):
            await result_of(client, "../../etc/passwd")
        with pytest.raises(MCPError, match="unknown task"):
            await client.session.send_request(TaskCancel(params=TaskParams(task_id="c-0")), TaskInfo)
        with pytest.raises(MCPError) as malformed:
            await client.session.send_request(TaskGet(params=TaskParams(task_id="")), TaskInfo)
    assert malformed.value.error.code == -32602  # INVALID_PARAMS
    assert fake_provider_server.requests == []


async def test_a_revision_the_server_does_not_speak_is_refused_naming_it(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    async with http_server(home, fake_provider_server) as (url, token):
        headers = {"accept": "application/json, text/event-stream", "authorization": f"Bearer {token}",
                   "mcp-protocol-version": "2099-01-01", "mcp-method": "tools/list"}
        request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2099-01-01",
            "io.modelcontextprotocol/clientInfo": {"name": "probe", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {}}}}
        async with httpx2.AsyncClient() as plain:
            answer = await plain.post(url, json=request, headers=headers)
    assert answer.status_code >= 400 or "error" in answer.text, answer.text
    assert "2099-01-01" in answer.text, answer.text


# ----------------------------------------------------------------------------------------- cost approval


def over_threshold() -> tuple[str, ...]:
    return ("cost.always_allow_under=0",)


@pytest.mark.parametrize("mode", ["legacy", MODERN])
@pytest.mark.parametrize("answer", ["accept", "decline"])
async def test_an_estimate_over_the_threshold_is_asked_and_nothing_is_spent_before_approval(
    home: Path, fake_provider_server: FakeProviderServer, mode: str, answer: str
) -> None:
    """legacy: elicitation mid-call; 2026-07-28: an input_required result the client answers and retries with."""
    asked: list[tuple[str, int]] = []

    async def approve(context: Any, params: Any) -> ElicitResult:
        asked.append((params.message, len(fake_provider_server.requests)))
        return ElicitResult(action="accept", content={"approve": True}) if answer == "accept" \
            else ElicitResult(action="decline")

    async with mcp_session(home, fake_provider_server, server_overrides=over_threshold(), mode=mode,
                           elicitation_callback=approve) as client:
        result = await client.call_tool("conclave_consult", {"question": "Costly?", "rounds": 1})
    assert len(asked) == 1 and "estimated cost $" in asked[0][0]
    assert asked[0][1] == 0  # nothing was asked of a provider before the approval
    if answer == "accept":
        assert not result.is_error, text_of(result)
        assert result.structured_content["status"] == "complete"
    else:
        assert result.is_error and "nothing was spent" in text_of(result)
        assert fake_provider_server.requests == []  # declined: 0 paid calls


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_without_elicitation_the_estimate_comes_back_with_how_to_approve(
    home: Path, fake_provider_server: FakeProviderServer, mode: str
) -> None:
    async with mcp_session(home, fake_provider_server, server_overrides=over_threshold(), mode=mode) as client:
        result = await client.call_tool("conclave_consult", {"question": "Costly?"})
    assert result.is_error and "nothing was spent" in text_of(result)
    assert "estimated cost $" in text_of(result) and "call again with max_cost: " in text_of(result)
    assert fake_provider_server.requests == []


@pytest.mark.parametrize("answer", ["accept", "decline"])
async def test_a_task_that_needs_approval_asks_before_it_becomes_a_task(
    home: Path, fake_provider_server: FakeProviderServer, answer: str
) -> None:
    asked: list[int] = []

    async def approve(context: Any, params: Any) -> ElicitResult:
        asked.append(len(fake_provider_server.requests))
        if answer == "accept":
            return ElicitResult(action="accept", content={"approve": True})
        return ElicitResult(action="decline")

    async with mcp_session(home, fake_provider_server, server_overrides=over_threshold(), mode=MODERN,
                           elicitation_callback=approve, extensions=[Tasks()]) as client:
        result = await client.call_tool("conclave_consult", {"question": "Costly?", "rounds": 1})
    assert asked == [0]
    if answer == "accept":
        assert not result.is_error and result.structured_content["status"] == "complete"
    else:
        assert result.is_error and fake_provider_server.requests == []



# ----------------------------------------------------------------------------------------- evaluations

#: every agent on the fake's gpt-4o (told apart by persona), the judge on gpt-4.1: as tests/test_eval_cli.py
EVAL_PANEL = ("agents.security.provider=openai", "agents.security.model=gpt-4o",
              "agents.pragmatist.provider=openai", "agents.pragmatist.model=gpt-4o", "judge.model=gpt-4.1")
EVAL_NAMES = ("Security Expert", "Systems Architect", "Pragmatic Engineer")


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_an_evaluation_runs_from_mcp_as_a_task_or_a_blocking_call(
    home: Path, fake_provider_server: FakeProviderServer, mode: str
) -> None:
    AnswerPanel({name: 1.0 for name in EVAL_NAMES}).install(fake_provider_server)
    arguments = {"set": "arithmetic", "n": 3, "rounds": 2, "max_cost": 100}
    async with mcp_session(home, fake_provider_server, mode=mode, server_overrides=EVAL_PANEL,
                           extensions=[Tasks()]) as client:
        if mode == MODERN:
            task, _ = await start_task(client, "conclave_eval", arguments)
            assert task.task_id.startswith("ev-")
            result = await result_of(client, task.task_id)
        else:
            result = await client.call_tool("conclave_eval", arguments)
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None and result.structured_content["ok"] is True
    assert text_of(result).startswith("# Evaluation ev-")
    assert "| round-1 majority vote | 3/3 = 100.0% |" in text_of(result)


BATCH_LINE = re.compile(r"conclave eval: batch (batch_fake\d+) \(openai, round 1\): (\w+) (\d+)/(\d+) done, "
                        r"(\d+) failed")


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_a_batched_evaluation_shows_each_batchs_progress_in_the_task_status_or_notifications(
    home: Path, fake_provider_server: FakeProviderServer, mode: str
) -> None:
    fake = fake_provider_server
    AnswerPanel({name: 1.0 for name in EVAL_NAMES}).install(fake)
    fake.batches.latency = 3.5  # long enough for several polls to see the counts grow
    arguments = {"set": "arithmetic", "n": 3, "rounds": 2, "max_cost": 100, "batch": "true", "batch_poll_s": 1}
    said: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        said.append(message or "")

    async with mcp_session(home, fake, mode=mode, extensions=[Tasks()],
                           server_overrides=(*EVAL_PANEL, "selective.enabled=false")) as client:
        if mode == MODERN:
            task, _ = await start_task(client, "conclave_eval", arguments)
            seen: list[tuple[float, TaskInfo]] = []
            await poll_until(client, task.task_id, lambda i: i.status != "working", seen=seen, every=0.05)
            said = [info.status_message or "" for _, info in seen]
            result = await result_of(client, task.task_id)
        else:
            result = await client.call_tool("conclave_eval", arguments, progress_callback=on_progress)
    assert not result.is_error, text_of(result)
    first = fake.batches.created[0][1]  # round 1 of the 3 items: 9 requests, one batch
    shown = [m.groups() for m in map(BATCH_LINE.search, said) if m and m.group(1) == first]
    assert shown, said
    assert {(provider_id, total) for provider_id, _, _, total, _ in shown} == {(first, "9")}
    assert shown[-1][1:] == ("completed", "9", "9", "0")  # its end, with the counts
    assert any(status == "in_progress" and int(done) < 9 for _, status, done, _, _ in shown)  # and on the way


async def test_an_evaluation_set_must_be_registered_or_under_the_allowed_roots(
    tmp_path: Path, home: Path, fake_provider_server: FakeProviderServer
) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_text('{"question": "1+1?", "answer": "2"}\n')
    calls: list[dict[str, Any]] = [{"set": str(outside)}, {"set": "gym:../../evil"}, {"set": "../outside.jsonl"},
             {"panel": "../../evil"}, {"run_id": "../../etc"}, {"n": 0}]
    async with mcp_session(home, fake_provider_server, mode=MODERN, extensions=[Tasks()]) as client:
        results = [await client.call_tool("conclave_eval", call) for call in calls]
    texts = [text_of(r) for r in results]
    assert all(r.is_error for r in results), texts
    assert "set: " in texts[0] and "is outside the allowed roots" in texts[0]
    assert "is not a reasoning-gym task name" in texts[1] and "outside the allowed roots" in texts[2]
    assert "panel: '../../evil' is not a panel name" in texts[3] and "run_id: '../../etc'" in texts[4]
    assert texts[5].startswith("n: 0 is not allowed")
    assert fake_provider_server.requests == []


async def test_a_cancelled_evaluation_task_stops_like_ctrl_c_and_resumes_by_run_id(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    AnswerPanel({name: 1.0 for name in EVAL_NAMES}, latency=0.4).install(fake_provider_server)
    async with mcp_session(home, fake_provider_server, mode=MODERN, server_overrides=EVAL_PANEL,
                           extensions=[Tasks()]) as client:
        task, _ = await start_task(client, "conclave_eval", {"set": "arithmetic", "n": 8, "rounds": 2,
                                                             "max_cost": 100})
        await poll_until(client, task.task_id, lambda i: len(fake_provider_server.requests) >= 6)
        cancelled = await client.session.send_request(TaskCancel(params=TaskParams(task_id=task.task_id)), TaskInfo)
        stopped = await result_of(client, task.task_id)
        asked_before = len(fake_provider_server.requests)
        run = store.read_run(home, task.task_id)
        resumed = await client.call_tool("conclave_eval", {"run_id": task.task_id})
    assert cancelled.status == "cancelled" and stopped.is_error
    assert run.get("status") != "complete", run.get("status")
    assert not resumed.is_error, text_of(resumed)
    assert resumed.structured_content is not None and resumed.structured_content["run_id"] == task.task_id
    assert store.read_run(home, task.task_id)["status"] == "complete"
    assert len(fake_provider_server.requests) > asked_before


async def test_over_http_a_task_outlives_the_client_that_started_it(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    """The task is the server's, not the connection's: a client that leaves mid-task (2026: no session to end)
    finds it running, then finished, from a new connection."""
    slow_replies(fake_provider_server, 0.4)

    def connect(token: str, url: str) -> tuple[httpx2.AsyncClient, Client]:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=300))
        return http, Client(streamable_http_client(url, http_client=http), mode=MODERN, extensions=[Tasks()])

    async with http_server(home, fake_provider_server) as (url, token):
        http, client = connect(token, url)
        async with http, client:
            task, _ = await start_task(client, "conclave_consult", {"question": QUESTION, "max_cost": 100,
                                                                    "rounds": 4})
            await poll_until(client, task.task_id,
                             lambda i: (i.status_message or "").startswith("round 2 · synthesis"))
        http, client = connect(token, url)
        async with http, client:
            running = await get(client, task.task_id)
            result = await result_of(client, task.task_id)
            verified = await client.call_tool("conclave_verify", {"id": task.task_id})
    assert running.status in ("working", "completed")
    assert not result.is_error and result.structured_content["status"] == "complete"
    assert result.structured_content["completed_rounds"] == 4
    assert verified.structured_content is not None and verified.structured_content["ok"] is True
