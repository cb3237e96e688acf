"""The live web view: token auth, rate limits, events over SSE replayed for late joiners and resumed after a
drop, answers streaming in while a round runs, consultations read from the journal, the form and its cost gate,
and ``live=true`` on the command line."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from cli_helpers import clean_env
from test_engine_support import AGENT_MODELS, BASE_OVERRIDES, JUDGE_MODEL, QUESTION, script_panel

from conclave.api import compose_settings
from conclave.engine.runner import Consultation
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.testing.fake_server import FakeProviderServer, RecordedRequest, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for
from conclave.web.app import RateLimits, make_app
from conclave.web.feeds import Feeds
from conclave.web.server import LocalStarter

TOKEN = "t0ken-for-tests-only"
CLI = [sys.executable, "-m", "conclave"]


async def _client(home: Path, **kw: Any) -> TestClient:
    client = TestClient(TestServer(make_app(home, TOKEN, **kw)))
    await client.start_server()
    return client


async def _events(client: TestClient, cid: str, *, after: int | None = None, stop_at: int | None = None
                  ) -> list[dict[str, Any]]:
    """Read an event stream to its end (or until ``stop_at`` events): each record as sent."""
    headers = {"Last-Event-ID": str(after)} if after is not None else {}
    out: list[dict[str, Any]] = []
    async with client.get(f"/c/{cid}/events?token={TOKEN}", headers=headers) as response:
        assert response.status == 200 and response.headers["Content-Type"].startswith("text/event-stream")
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("data: ") and line != "data: {}":
                out.append(json.loads(line[6:]))
                if stop_at is not None and len(out) >= stop_at:
                    break
    return out


async def test_every_route_needs_the_token(tmp_path: Path) -> None:
    client = await _client(tmp_path)
    try:
        for path in ("/", "/c/x", "/c/x/events"):
            assert (await client.get(path)).status == 401
            assert (await client.get(path + "?token=wrong")).status == 401
        first = await client.get(f"/?token={TOKEN}")
        assert first.status == 200 and "conclave_token" in first.cookies
        assert (await client.get("/")).status == 200  # the cookie carries it from now on
        bearer = TestClient(TestServer(make_app(tmp_path, TOKEN)))
        await bearer.start_server()
        try:
            assert (await bearer.get("/", headers={"Authorization": f"Bearer {TOKEN}"})).status == 200
        finally:
            await bearer.close()
    finally:
        await client.close()


async def test_each_client_is_rate_limited(tmp_path: Path) -> None:
    client = await _client(tmp_path, limits=RateLimits(burst=3, rate=0.01))
    try:
        statuses = [(await client.get(f"/?token={TOKEN}")).status for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        limited = await client.get(f"/?token={TOKEN}")
        assert limited.status == 429 and int(limited.headers["Retry-After"]) >= 1
    finally:
        await client.close()


def _slow_panel(fake: FakeProviderServer, latency: float) -> None:
    for model in (*AGENT_MODELS.values(), JUDGE_MODEL):
        fake.script(model, lambda r: Reply(json=instance_for(r.schema), latency=latency))


async def test_a_running_consultation_is_watched_live_and_late_joiners_get_everything(
    fake_provider_server: FakeProviderServer, conclave_env: Path
) -> None:
    fake = fake_provider_server
    _slow_panel(fake, 0.3)
    settings = compose_settings(QUESTION, [*fake.overrides(), *BASE_OVERRIDES, "rounds=2"])
    feeds = Feeds(StoreLayout(conclave_env))
    recorder = Recorder(conclave_env, index=False)
    consultation = Consultation(settings, recorder=recorder, stream=True)
    consultation.bus.subscribe(feeds.feed_for(consultation.id))
    client = await _client(conclave_env, feeds=feeds)
    try:
        task = asyncio.create_task(consultation.run())
        early = await _events(client, consultation.id, stop_at=12)  # joined while round 1 is running
        assert not task.done()
        types = [e["type"] for e in early]
        assert "round:started" in types and "consultation:completed" not in types
        assert "agent:chunk" in types  # an answer streaming in before its round ended
        chunk = next(e for e in early if e["type"] == "agent:chunk")
        assert chunk["data"]["round_number"] == 1 and chunk["data"]["text"]
        await task
        everything = await _events(client, consultation.id)  # a late joiner
        kept = [e for e in everything if e["type"] != "agent:chunk"]
        assert [e["seq"] for e in kept] == list(range(len(kept)))  # every journaled event, in order, once
        assert kept[0]["type"] == "consultation:started" and kept[-1]["type"] == "consultation:completed"
        resumed = await _events(client, consultation.id, after=kept[5]["seq"])  # reconnect after event 5
        assert [e["seq"] for e in resumed] == [e["seq"] for e in kept[6:]]
    finally:
        recorder.close()
        await client.close()


async def test_a_consultation_of_another_process_is_read_from_its_journal(
    fake_provider_server: FakeProviderServer, conclave_env: Path
) -> None:
    fake = fake_provider_server
    script_panel(fake)
    recorder = Recorder(conclave_env, index=False)
    settings = compose_settings(QUESTION, [*fake.overrides(), *BASE_OVERRIDES, "rounds=2"])
    consultation = Consultation(settings, recorder=recorder)
    await consultation.run()
    recorder.close()
    client = await _client(conclave_env)
    try:
        replay = await _events(client, consultation.id)
        journal = [json.loads(line) for line in
                   StoreLayout(conclave_env).journal_path(consultation.id).read_text().splitlines()]
        assert [(e["seq"], e["type"]) for e in replay] == [(r["seq"], r["type"]) for r in journal]
        page = await client.get(f"/c/{consultation.id}?token={TOKEN}")
        assert page.status == 200 and "EventSource" in await page.text()
        listing = await (await client.get(f"/?token={TOKEN}")).text()
        assert QUESTION in listing and "complete" in listing
        assert (await client.get(f"/c/nope?token={TOKEN}")).status == 404
    finally:
        await client.close()


async def test_the_form_starts_a_consultation_and_the_cost_gate_asks_in_the_page(
    fake_provider_server: FakeProviderServer, conclave_env: Path
) -> None:
    fake = fake_provider_server
    script_panel(fake)
    feeds = Feeds(StoreLayout(conclave_env))
    recorder = Recorder(conclave_env, index=False)
    starter = LocalStarter(feeds, recorder)
    client = await _client(conclave_env, feeds=feeds, starter=starter)
    overrides = "\n".join([*fake.overrides(), f"judge.model={JUDGE_MODEL}", "rounds=1", "cost.always_allow_under=0"])
    try:
        refused = await client.post(f"/consult?token={TOKEN}", data={"question": QUESTION, "overrides": overrides},
                                    allow_redirects=False)
        text = await refused.text()
        assert refused.status == 200 and "Cost gate:" in text and "Approve the estimate and start" in text
        assert re.search(r"the estimated cost \$\d+\.\d{4} is over cost\.always_allow_under", text)
        assert not fake.requests  # nothing was spent
        approved = await client.post(f"/consult?token={TOKEN}", allow_redirects=False,
                                     data={"question": QUESTION, "overrides": overrides, "approve": "yes"})
        assert approved.status == 303
        cid = approved.headers["Location"].removeprefix("/c/")
        await asyncio.gather(*starter.tasks)
        assert any(e["type"] == "consultation:completed" and e["data"]["status"] == "complete"
                   for e in await _events(client, cid))
        bad = await client.post(f"/consult?token={TOKEN}", data={"question": QUESTION, "overrides": "mode=banana"})
        assert bad.status == 400 and "mode: &#x27;banana&#x27; is not one of" in await bad.text()
    finally:
        recorder.close()
        await client.close()


@pytest.mark.slow
async def test_live_true_prints_where_to_watch_and_serves_the_consultation(tmp_path: Path) -> None:
    async with FakeProviderServer() as fake:
        def slow(request: RecordedRequest) -> Reply:
            return Reply(json=instance_for(request.schema), latency=0.5)

        for model in (*AGENT_MODELS.values(), JUDGE_MODEL):
            fake.script(model, slow)
        env = clean_env(tmp_path, FAKE_KEYS) | {"CONCLAVE_WEB_TOKEN": TOKEN}
        process = await asyncio.create_subprocess_exec(
            *CLI, QUESTION, *fake.overrides(), *BASE_OVERRIDES, "rounds=2", "live=true", env=env, cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert process.stderr is not None
        url = None
        while url is None:
            line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
            assert line, "conclave ended without printing the live URL"
            match = re.search(r"watch it live at (http://127\.0\.0\.1:\d+/c/\S+)", line)
            url = match.group(1) if match else None
        import aiohttp

        async with aiohttp.ClientSession() as session:
            async with session.get(url) as page:
                assert page.status == 200 and "EventSource" in await page.text()
            async with session.get(url.replace("?token=", "/events?token=")) as events:
                first = (await events.content.readline()).decode()
                assert first.startswith("id: 0") or first.startswith("data: ")
        _, err = await process.communicate()
        assert process.returncode == 0, err.decode()
