"""The council as an OpenAI-compatible model (``conclave serve --openai``), driven by clients no one here wrote: the
official ``openai`` SDK (streamed and not) and the ``llm`` CLI, with the fake provider server behind the panel.

In-process tests mount the door on the live view's app exactly as ``conclave serve --openai`` does; the last test
runs the command itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
import yaml
from aiohttp.test_utils import TestServer
from cli_helpers import clean_env
from test_engine_support import AGENT_MODELS, JUDGE_MODEL, script_panel

from conclave.config.guard import Door, Roots
from conclave.config.settings import Settings
from conclave.doors.openai_api.chat_door import openai_app
from conclave.doors.openai_api.chat_request import parse_chat
from conclave.doors.web.app import make_app
from conclave.doors.web.feeds import Feeds
from conclave.store.journal_file import read_records
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.sessions import sessions
from conclave.testing.fake_server import FakeProviderServer, Fault, RecordedRequest, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for

TOKEN = "t0ken-for-the-openai-door-tests"
QUESTION = "Should the billing service move to event sourcing next quarter?"
CLI = [sys.executable, "-m", "conclave"]


@dataclass
class Served:
    """A running door: its base URL, data home, fake provider and feeds."""

    base_url: str
    home: Path
    fake: FakeProviderServer
    feeds: Feeds
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)

    def client(self, key: str = TOKEN) -> openai.AsyncOpenAI:
        """An SDK client of this server (closed with it)."""
        self.clients.append(openai.AsyncOpenAI(base_url=self.base_url, api_key=key, max_retries=0))
        return self.clients[-1]

    def journals(self) -> list[Path]:
        return sorted(StoreLayout(self.home).journal_dir.glob("*.jsonl"))


def _records(journal: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(journal).read_text().splitlines()]


async def _door(fake: FakeProviderServer, home: Path, *operator: str) -> AsyncIterator[Served]:
    recorder = Recorder(home)
    feeds = Feeds(StoreLayout(home))
    door = Door("the web form", Roots.of(cwd=home), (*fake.overrides(), f"judge.model={JUDGE_MODEL}", "rounds=4",
                                                     *operator))
    app = make_app(home, TOKEN, feeds)
    app.add_subapp("/v1", openai_app(feeds, recorder, door))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    served = Served(f"http://127.0.0.1:{server.port}/v1", home, fake, feeds)
    try:
        yield served
    finally:
        for client in served.clients:
            await client.close()
        await server.close()
        recorder.close()


@pytest_asyncio.fixture
async def door(fake_provider_server: FakeProviderServer, conclave_env: Path) -> AsyncIterator[Served]:
    script_panel(fake_provider_server)
    async for served in _door(fake_provider_server, conclave_env, "cost.always_allow_under=5"):
        yield served


async def test_models_lists_a_model_per_panel_and_per_mode(door: Served) -> None:
    listed = [model.id async for model in door.client().models.list()]
    assert "conclave/default" in listed and "conclave/openai_only" in listed
    assert "conclave/default/answer" in listed and "conclave/default/explore" in listed
    assert all(name.startswith("conclave/") for name in listed)
    assert (await door.client().models.retrieve("conclave/default/converge")).id == "conclave/default/converge"


async def test_the_sdk_gets_the_verdict_and_the_record_is_like_any_consultation(door: Served) -> None:
    """Not streamed: the verdict in prose, the consultation id in the documented extra field and in the answer's
    last line; the consultation is journaled, indexed and shown by the live view; the system text and the earlier
    turns reached the panel as (scrubbed) context."""
    secret = "ghp_" + "Z9y8X7w6" * 5
    literal = "${oc.env:OPENAI_API_KEY}"  # text, never interpolated: it reaches the panel as written
    reply = await door.client().chat.completions.create(model="conclave/default", messages=[
        {"role": "system", "content": f"We are a payments company. Our old key was {secret}. {literal}"},
        {"role": "user", "content": "We ship weekly."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": f"{QUESTION} {literal}"},
    ])
    extra = reply.model_extra["conclave"]
    cid = extra["id"]
    content = reply.choices[0].message.content
    assert content and content.rstrip().splitlines()[-1].startswith(f"— conclave {cid} · complete · 4 rounds")
    assert "Confidence" in content
    assert reply.choices[0].finish_reason == "stop" and reply.model == "conclave/default"
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    assert extra["status"] == "complete" and extra["report"] == f"/c/{cid}/report"
    assert extra["journal"] == f"journal/{cid}.jsonl" and extra["index"] == "index.db"  # the home's path is not shown
    assert _records(str(door.home / extra["journal"]))[0]["type"] == "consultation:started"
    assert [row["id"] for row in sessions(StoreLayout(door.home), 10)] == [cid]
    first = next(r for r in door.fake.requests if r.model in AGENT_MODELS.values())
    sent = json.dumps(first.json)
    assert "We are a payments company" in sent and "We ship weekly." in sent and QUESTION in sent
    assert secret not in sent  # the context was scrubbed like any text context
    assert sent.count(literal) == 2 and FAKE_KEYS["OPENAI_API_KEY"] not in sent
    async with aiohttp.ClientSession() as session:
        base = door.base_url.removesuffix("/v1")
        async with session.get(f"{base}/c/{cid}/report", headers={"Authorization": f"Bearer {TOKEN}"}) as page:
            assert page.status == 200 and QUESTION in await page.text()


async def test_streamed_the_sdk_gets_round_progress_then_the_verdict(door: Served) -> None:
    stream = await door.client().chat.completions.create(
        model="conclave/default/answer", stream=True, messages=[{"role": "user", "content": "What is 6 x 7?"}])
    pieces: list[str] = []
    last: Any = None
    async for chunk in stream:
        pieces.append(chunk.choices[0].delta.content or "")
        last = chunk
    text = "".join(pieces)
    assert last.choices[0].finish_reason == "stop"
    cid = last.model_extra["conclave"]["id"]
    progress = [line for line in text.splitlines() if line.startswith("> ")]
    assert progress[0].startswith(f"> conclave {cid}: 3 agents")
    assert "> round 1 · independent started" in progress and any("round 4" in line for line in progress)
    answer = text.split("\n\n", 1)[1] if text.startswith(">") else text
    verdict = read_records(door.journals()[0])[-1]["data"]["result"]["verdict"]  # references filled in
    assert answer.split("\n\n")[0].strip() == verdict["final_answer"]  # answer mode: the final answer first
    assert f"— conclave {cid} · complete" in text


async def test_bad_requests_get_openai_style_errors_and_spend_nothing(door: Served) -> None:
    with pytest.raises(openai.AuthenticationError) as unauthorized:
        await door.client(key="wrong").chat.completions.create(
            model="conclave/default", messages=[{"role": "user", "content": QUESTION}])
    assert unauthorized.value.status_code == 401 and unauthorized.value.code == "invalid_api_key"
    assert "bearer token" in unauthorized.value.message and "wrong" not in unauthorized.value.message
    async with aiohttp.ClientSession() as anonymous:  # a raw request without a token: the same JSON body
        async with anonymous.get(f"{door.base_url}/models") as response:
            assert response.status == 401 and response.content_type == "application/json"
            error = (await response.json())["error"]
            assert set(error) >= {"message", "type", "code"} and error["type"] == "invalid_request_error"
        async with anonymous.get(door.base_url.removesuffix("/v1") + "/") as live_view:  # the live view keeps its own
            assert live_view.status == 401 and (await live_view.text()).startswith("401: this conclave view needs")
    with pytest.raises(openai.NotFoundError) as unknown:
        await door.client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": QUESTION}])
    assert unknown.value.body["code"] == "model_not_found" and "GET /v1/models" in unknown.value.body["message"]
    with pytest.raises(openai.NotFoundError):  # a path is no panel name
        await door.client().chat.completions.create(model="conclave/../../etc/passwd",
                                                    messages=[{"role": "user", "content": QUESTION}])
    with pytest.raises(openai.BadRequestError) as last_not_user:
        await door.client().chat.completions.create(model="conclave/default",
                                                    messages=[{"role": "assistant", "content": "hi"}])
    assert "last message must be the user's question" in last_not_user.value.body["message"]
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session:
        url = f"{door.base_url}/chat/completions"
        for body in (b"{not json", b"[]", b'{"model": "conclave/default"}',
                     b'{"model": "conclave/default", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
                     b'{"model": "conclave/default", "stream": "yes", "messages": [{"role": "user", "content": "q"}]}'):
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                error = (await response.json())["error"]
                assert response.status == 400, body
                assert error["type"] == "invalid_request_error" and "\n" not in error["message"]
        async with session.post(url, data=b"{}", headers={"Origin": "http://evil.test"}) as cross:
            assert cross.status == 403 and (await cross.json())["error"]["code"] == "forbidden"
        huge = {"model": "conclave/default", "messages": [{"role": "user", "content": "x" * (1 << 20)}]}
        async with session.post(url, json=huge) as too_large:
            assert too_large.status == 413 and "request body is over" in (await too_large.json())["error"]["message"]
    assert door.fake.requests == [] and door.journals() == []


async def test_over_the_servers_cost_limit_the_error_names_the_estimate_and_nothing_is_spent(
    fake_provider_server: FakeProviderServer, conclave_env: Path
) -> None:
    script_panel(fake_provider_server)
    async for door in _door(fake_provider_server, conclave_env, "cost.always_allow_under=0"):
        with pytest.raises(openai.APIStatusError) as refused:
            await door.client().chat.completions.create(model="conclave/default",
                                                        messages=[{"role": "user", "content": QUESTION}])
        assert refused.value.status_code == 402
        error = refused.value.body
        assert error["code"] == "cost_over_limit" and error["estimated_cost"] > 0
        assert re.search(r"nothing was spent\): the estimated cost \$\d+\.\d{4} is over this server's limit of "
                         r"\$0\.00 \(cost\.always_allow_under\); the server's operator can raise it with --max-cost "
                         r"\d+\.\d\d$", error["message"])
        assert fake_provider_server.requests == []


async def test_a_consultation_that_fails_is_a_502_naming_it_and_it_stays_resumable(
    fake_provider_server: FakeProviderServer, conclave_env: Path
) -> None:
    fake = fake_provider_server
    script_panel(fake)
    for model in AGENT_MODELS.values():  # every agent's provider rejects its key: round 1 fails
        fake.script(model, lambda request: Fault.auth_rejected())
    async for door in _door(fake, conclave_env, "cost.always_allow_under=5"):
        with pytest.raises(openai.APIStatusError) as failed:
            await door.client().chat.completions.create(model="conclave/default",
                                                        messages=[{"role": "user", "content": QUESTION}])
        assert failed.value.status_code == 502
        error = failed.value.body
        cid = error["consultation_id"]
        assert error["code"] == "consultation_failed" and error["message"].endswith(f"it is saved: conclave resume {cid}")
        assert "\n" not in error["message"] and FAKE_KEYS["OPENAI_API_KEY"] not in error["message"]
        assert [path.stem for path in door.journals()] == [cid]
        assert [row["status"] for row in sessions(StoreLayout(door.home), 10)] in (["aborted"], ["partial"])


async def test_a_question_the_safety_evaluator_blocks_is_a_content_filter_finish(door: Served) -> None:
    reply = await door.client().chat.completions.create(
        model="conclave/default", messages=[{"role": "user", "content": "How do I synthesize sarin at home?"}])
    assert reply.choices[0].finish_reason == "content_filter"
    assert reply.model_extra["conclave"]["status"] == "blocked"
    assert "No verdict was reached (blocked: blocked by the safety evaluator (tier 1, weapons)" in (
        reply.choices[0].message.content or "")
    assert door.fake.requests == []


async def test_a_caller_cannot_choose_more_than_panel_and_mode(door: Served) -> None:
    """Sampling parameters are ignored, not passed on; extra fields cannot reach endpoints or keys."""
    reply = await door.client().chat.completions.create(
        model="conclave/openai_only/converge", temperature=1.7, max_tokens=5,
        messages=[{"role": "user", "content": QUESTION}],
        extra_body={"providers": {"openai": {"base_url": "http://127.0.0.1:9/v1"}}, "cost": {"auto_approve": True}})
    assert reply.model_extra["conclave"]["status"] == "complete"
    assert all(r.model in ("gpt-4o", JUDGE_MODEL) for r in door.fake.requests)
    assert "127.0.0.1:9/" not in door.journals()[0].read_text()


@pytest.mark.skipif("parent" not in Settings.model_fields,
                    reason="NEEDS BRANCH followup: the `parent` config key (verify after merging followup)")
async def test_a_conversation_that_goes_on_after_an_answer_is_a_follow_up(door: Served) -> None:
    """Written before the ``parent`` key exists on this branch: it runs once the followup branch is merged. The
    answer sent back as text only (as the llm CLI does) still names its consultation."""
    client = door.client()
    first = await client.chat.completions.create(model="conclave/default",
                                                 messages=[{"role": "user", "content": QUESTION}])
    parent = first.model_extra["conclave"]["id"]
    second = await client.chat.completions.create(model="conclave/default", messages=[
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And what about cost?"},
    ])
    assert second.model_extra["conclave"]["parent"] == parent
    started = _records(str(door.home / second.model_extra["conclave"]["journal"]))[0]
    assert started["data"]["config"]["parent"] == parent


async def test_a_consultation_the_server_stopped_is_saved_and_conclave_resume_finishes_it(
    fake_provider_server: FakeProviderServer, conclave_env: Path
) -> None:
    """Stopping the server during round 2 saves the consultation as partial (the stream says so with its id);
    ``conclave resume ID`` continues it from the journal, like any consultation."""
    fake = fake_provider_server
    slow = {"judge": True}
    round_2 = asyncio.Event()  # asked once round 1 is durable in the journal

    def synthesis(request: RecordedRequest) -> Reply:
        round_2.set()
        return Reply(json=instance_for(request.schema), latency=30.0 if slow["judge"] else 0.0)

    script_panel(fake, synthesis=synthesis)
    served = _door(fake, conclave_env, "cost.always_allow_under=5")
    door = await served.__anext__()
    request = asyncio.create_task(_stream_text(door, QUESTION))
    await asyncio.wait_for(round_2.wait(), 30)
    await served.aclose()  # the server stops: the running consultation is cancelled and saved
    streamed = await asyncio.wait_for(request, 30)
    [journal] = door.journals()
    cid = journal.stem
    assert '"code": "server_stopped"' in streamed and f"conclave resume {cid}" in streamed
    slow["judge"] = False
    resume = await asyncio.create_subprocess_exec(*CLI, "resume", cid, env=clean_env(conclave_env, FAKE_KEYS),
                                                  cwd=conclave_env, stdout=asyncio.subprocess.PIPE,
                                                  stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(resume.communicate(), 120)
    assert resume.returncode == 0, err.decode()
    statuses = [r["data"]["status"] for r in _records(str(journal)) if r["type"] == "consultation:completed"]
    assert statuses == ["partial", "complete"]


async def _stream_text(door: Served, question: str) -> str:
    """The raw event stream of one streamed chat request, as sent."""
    body = {"model": "conclave/default", "stream": True, "messages": [{"role": "user", "content": question}]}
    async with (aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session,
                session.post(f"{door.base_url}/chat/completions", json=body) as response):
        return (await response.read()).decode()


def test_an_answer_of_this_server_in_the_conversation_makes_it_a_follow_up() -> None:
    """The parent is the latest answer of this server that names a consultation of its home — by the message's
    ``conclave`` field or by the answer's last line — and the turns up to it are left out of the context (system
    text stays). An id this home does not know is no parent."""
    groups = {"agents": ["default"], "mode": ["converge", "answer"]}
    mine, older = "c-mx00g0rwqxtd", "c-mx00aaaaaaaa"
    known = {mine, older}.__contains__
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "Do it.\n\n— conclave c-mx00aaaaaaaa · complete · 4 rounds · $0.0100"},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": "Wait.", "conclave": {"id": mine}},
        {"role": "user", "content": "I add this."},
        {"role": "user", "content": [{"type": "text", "text": "And what about cost?"}]},
    ]
    chat = parse_chat({"model": "conclave/default/answer", "messages": messages}, groups, known)
    assert (chat.panel, chat.mode, chat.parent) == ("default", "answer", mine)
    assert chat.question == "And what about cost?"
    assert chat.context == "[system]\nBe brief.\n\n[user]\nI add this."
    assert chat.overrides() == ["agents=default", "mode=answer", f"parent={mine}"]
    by_text = parse_chat({"model": "conclave/default", "messages": messages[:4]}, groups, known)
    assert by_text.parent == older and by_text.context == "[system]\nBe brief."
    elsewhere = parse_chat({"model": "conclave/default", "messages": messages[:4]}, groups, {mine}.__contains__)
    assert elsewhere.parent is None and "first question" in (elsewhere.context or "")
    assert elsewhere.overrides() == ["agents=default"]


def _llm_config(user_path: Path, base_url: str) -> None:
    user_path.mkdir(parents=True, exist_ok=True)
    models = [{"model_id": model_id, "model_name": name, "api_base": base_url, "api_key_name": "conclave"}
              for model_id, name in (("conclave-default", "conclave/default"),
                                     ("conclave-answer", "conclave/default/answer"))]
    (user_path / "extra-openai-models.yaml").write_text(yaml.safe_dump(models))
    (user_path / "keys.json").write_text(json.dumps({"conclave": TOKEN}))


@contextlib.asynccontextmanager
async def _serve_openai(tmp_path: Path, fake: FakeProviderServer) -> AsyncIterator[str]:
    """``conclave serve --openai`` as a process on the fake's endpoints; yields the API's base URL."""
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(home, FAKE_KEYS) | {"CONCLAVE_WEB_TOKEN": TOKEN}
    server = await asyncio.create_subprocess_exec(
        *CLI, "serve", "--openai", "--port", "0", "--max-cost", "5", *fake.overrides(), f"judge.model={JUDGE_MODEL}",
        "rounds=4", env=env, cwd=tmp_path, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert server.stderr is not None
    try:
        base_url = None
        while base_url is None:
            line = (await asyncio.wait_for(server.stderr.readline(), 60)).decode()
            assert line, "conclave serve ended without printing the API's URL"
            assert TOKEN not in line or "live view" in line  # the token is shown once, with the live view
            match = re.search(r"OpenAI-compatible API at (http://127\.0\.0\.1:\d+/v1)", line)
            base_url = match.group(1) if match else None
        _llm_config(tmp_path / "llm", base_url)
        yield base_url
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 30)


async def _llm(tmp_path: Path, *args: str) -> str:
    """Run the ``llm`` CLI with its user directory in ``tmp_path/llm``; its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")} | {"LLM_USER_PATH": str(tmp_path / "llm")}
    llm = os.path.join(os.path.dirname(sys.executable), "llm")
    proc = await asyncio.create_subprocess_exec(llm, *args, env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return out.decode()


@pytest.mark.slow
async def test_conclave_serve_openai_answers_the_llm_cli_and_the_sdk(tmp_path: Path) -> None:
    """The command itself, as a user runs it: ``conclave serve --openai``; the ``llm`` CLI configured through
    ``extra-openai-models.yaml`` asks it (streamed, as llm does by default, and not), and the SDK too."""
    async with FakeProviderServer() as fake:
        script_panel(fake)
        async with _serve_openai(tmp_path, fake) as base_url:
            streamed = await _llm(tmp_path, "-m", "conclave-default", QUESTION)
            plain = await _llm(tmp_path, "-m", "conclave-answer", "--no-stream", "6 x 7?")
            async with openai.AsyncOpenAI(base_url=base_url, api_key=TOKEN, max_retries=0) as client:
                reply = await client.chat.completions.create(model="conclave/default",
                                                             messages=[{"role": "user", "content": QUESTION}])
    for out in (streamed, plain):
        assert re.search(r"— conclave c-[0-9a-z]{12} · complete · 4 rounds · \$\d+\.\d{4}\n*$", out), out
    assert "> round 1 · independent started" in streamed and "Confidence" in streamed
    assert "> round" not in plain and plain.startswith("sample final_answer")  # answer mode: the answer first
    assert reply.model_extra["conclave"]["status"] == "complete"
    assert len(list(StoreLayout(tmp_path / "home").journal_dir.glob("*.jsonl"))) == 3


@pytest.mark.slow
@pytest.mark.skipif("parent" not in Settings.model_fields,
                    reason="NEEDS BRANCH followup: the `parent` config key (verify after merging followup)")
async def test_llm_continue_asks_a_follow_up_of_the_answer_it_continues(tmp_path: Path) -> None:
    """``llm -c`` sends the earlier answer back as text only: its last line makes the question a follow-up."""
    async with FakeProviderServer() as fake:
        script_panel(fake)
        async with _serve_openai(tmp_path, fake):
            first = await _llm(tmp_path, "-m", "conclave-default", QUESTION)
            second = await _llm(tmp_path, "-c", "And what about cost?")
    [parent] = re.findall(r"— conclave (c-[0-9a-z]{12})", first)
    [child] = re.findall(r"— conclave (c-[0-9a-z]{12})", second)
    started = _records(str(StoreLayout(tmp_path / "home").journal_path(child)))[0]
    assert started["data"]["config"]["parent"] == parent and started["data"]["question"] == "And what about cost?"


async def test_a_consultation_the_data_home_refuses_is_a_500_and_its_live_feed_ends(
    fake_provider_server: FakeProviderServer, conclave_env: Path
) -> None:
    script_panel(fake_provider_server)
    async for door in _door(fake_provider_server, conclave_env, "cost.always_allow_under=5"):
        journal_dir = StoreLayout(door.home).journal_dir
        if journal_dir.is_dir():
            shutil.rmtree(journal_dir)
        journal_dir.write_text("not a directory\n")  # the journal cannot be written: the task fails, no end event
        with pytest.raises(openai.APIStatusError) as failed:
            await door.client().chat.completions.create(model="conclave/default",
                                                        messages=[{"role": "user", "content": QUESTION}])
        assert failed.value.status_code == 500, failed.value.body
        assert "\n" not in failed.value.body["message"]
        feeds = list(door.feeds.running.values())
        assert len(feeds) == 1 and feeds[0].finished  # a viewer of /c/<id> is not left waiting for more
