"""The live web view: token auth, rate limits, events over SSE replayed for late joiners and resumed after a
drop, answers streaming in while a round runs, consultations read from the journal, the form and its cost gate,
and ``live=true`` on the command line."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from cli_helpers import clean_env
from test_engine_support import AGENT_MODELS, BASE_OVERRIDES, JUDGE_MODEL, QUESTION, script_panel

from conclave.api import compose_settings
from conclave.config.guard import Door, Roots
from conclave.doors.web.app import RateLimits, make_app
from conclave.doors.web.feeds import Feeds
from conclave.doors.web.serving import LocalStarter
from conclave.engine.ids import new_consultation_id
from conclave.engine.run import Consultation
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.testing.fake_server import FakeProviderServer, RecordedRequest, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for
from conclave.testing.synthetic_events import consultation_id as synthetic_consultation_id
from conclave.testing.synthetic_events import synthetic_events

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
        assert first.status == 200 and f"conclave_token_{client.server.port}" in first.cookies
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
    recorder = Recorder(conclave_env)  # journal and index, as a consultation of the command line writes them
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


def _hidden(page: str, name: str) -> str:
    match = re.search(rf"name={name} value='([^']*)'", page)
    assert match, f"no hidden {name} field in the page"
    return match.group(1)


def _form_starter(fake: FakeProviderServer, home: Path, recorder: Recorder, *operator: str) -> LocalStarter:
    """The form's starter, with the fake's endpoints as the server's own overrides (as ``conclave serve`` gets
    them on its command line)."""
    door = Door("the web form", Roots.of(cwd=home), (*fake.overrides(), f"judge.model={JUDGE_MODEL}", *operator))
    return LocalStarter(Feeds(StoreLayout(home)), recorder, door)


async def test_the_form_starts_a_consultation_and_the_cost_gate_asks_in_the_page(
    fake_provider_server: FakeProviderServer, conclave_env: Path
) -> None:
    fake = fake_provider_server
    script_panel(fake)
    recorder = Recorder(conclave_env, index=False)
    starter = _form_starter(fake, conclave_env, recorder, "cost.always_allow_under=0")
    client = await _client(conclave_env, feeds=starter.feeds, starter=starter.starter())
    try:
        page = await (await client.get(f"/?token={TOKEN}")).text()  # sets this port's cookie
        csrf = _hidden(page, "csrf")
        assert "<select name=panel>" in page and "<option value='openai_only'>" in page
        assert "<option value='explore'>" in page and "name=overrides" not in page
        refused = await client.post("/consult", data={"question": QUESTION, "rounds": "1", "csrf": csrf},
                                    allow_redirects=False)
        text = await refused.text()
        assert refused.status == 200 and "Cost gate:" in text and "Approve the estimate and start" in text
        assert re.search(r"the estimated cost \$\d+\.\d{4} is over cost\.always_allow_under", text)
        assert not fake.requests  # nothing was spent
        approval = _hidden(text, "approval")
        approved = await client.post("/approve", allow_redirects=False, data={"approval": approval, "csrf": csrf})
        assert approved.status == 303
        cid = approved.headers["Location"].removeprefix("/c/")
        await asyncio.gather(*starter.tasks)
        assert any(e["type"] == "consultation:completed" and e["data"]["status"] == "complete"
                   for e in await _events(client, cid))
        again = await client.post("/approve", allow_redirects=False, data={"approval": approval, "csrf": csrf})
        assert again.status == 400 and "expired or was used" in await again.text()
        bad = await client.post("/consult", data={"question": QUESTION, "mode": "banana", "csrf": csrf})
        assert bad.status == 400 and "mode: &#x27;banana&#x27; is not one of" in await bad.text()
    finally:
        recorder.close()
        await client.close()


async def test_the_form_takes_only_what_a_person_picks_and_refuses_other_origins(
    fake_provider_server: FakeProviderServer, conclave_env: Path
) -> None:
    """The review's CSRF exploit, by hand: the start form from another origin, or without the page's CSRF token,
    or with endpoint, key, context and approval fields, starts nothing and sends nothing."""
    fake = fake_provider_server
    script_panel(fake)
    outside = conclave_env.parent / "outside.txt"
    outside.write_text("a local file that is not the panel's business")
    recorder = Recorder(conclave_env, index=False)
    starter = _form_starter(fake, conclave_env, recorder)
    client = await _client(conclave_env, feeds=starter.feeds, starter=starter.starter())
    try:
        csrf = _hidden(await (await client.get(f"/?token={TOKEN}")).text(), "csrf")
        form = {"question": QUESTION, "rounds": "1", "csrf": csrf}
        port = client.server.port
        refused = {
            "another port's page": await client.post("/consult", data=form, headers={
                "Origin": f"http://127.0.0.1:{port + 1}", "Sec-Fetch-Site": "same-site"}),
            "a cross-site page": await client.post("/consult", data=form, headers={"Sec-Fetch-Site": "cross-site"}),
            "an opaque origin": await client.post("/consult", data=form, headers={"Origin": "null"}),
            "no CSRF token": await client.post("/consult", data={**form, "csrf": ""}),
            "a rebound host name": await client.post("/consult", data=form, headers={"Host": f"evil.test:{port}"}),
            "a cross-site stream": await client.get("/c/x/events", headers={"Sec-Fetch-Site": "same-site",
                                                                            "Sec-Fetch-Mode": "cors"}),
        }
        for what, response in refused.items():
            assert response.status == 403, what
        # same origin and a good token, but fields no person picks on the page: they are not read
        sneaky = await client.post("/consult", allow_redirects=False, data={
            **form, "overrides": "providers.openai.base_url=http://127.0.0.1:9/v1\nproviders.openai.send_key=always",
            "approve": "yes", "home": "/tmp"})
        assert sneaky.status == 303
        # and a picked value outside what the page offers is refused by the guard
        traversal = await client.post("/consult", data={**form, "panel": "../../../../tmp/evil"})
        assert traversal.status == 400 and "is not one of" in await traversal.text()
        context = await client.post("/consult", data={**form, "context": str(outside)})
        assert context.status == 400 and "outside the allowed roots" in await context.text()
        await asyncio.gather(*starter.tasks)
        journals = list(StoreLayout(conclave_env).journal_dir.glob("*.jsonl"))
        assert len(journals) == 1  # the one same-origin start
        assert "127.0.0.1:9/" not in journals[0].read_text() and fake.requests
    finally:
        recorder.close()
        await client.close()


async def test_an_idle_stream_stays_open_until_the_consultation_ends(
    fake_provider_server: FakeProviderServer, conclave_env: Path
) -> None:
    """Events 0.6 s apart on a stream whose heartbeat is every 0.05 s: the stream stays open (pinging) and ends
    only with the consultation — not with a premature ``end`` while it goes on."""
    fake = fake_provider_server
    for model in (*AGENT_MODELS.values(), JUDGE_MODEL):
        fake.script(model, lambda request: Reply(json=instance_for(request.schema), latency=0.6))
    recorder = Recorder(conclave_env, index=False)
    starter = _form_starter(fake, conclave_env, recorder, "cost.auto_approve=true")
    client = await _client(conclave_env, feeds=starter.feeds, starter=starter.starter(), heartbeat_s=0.05)
    try:
        csrf = _hidden(await (await client.get(f"/?token={TOKEN}")).text(), "csrf")
        started = await client.post("/consult", allow_redirects=False,
                                    data={"question": QUESTION, "rounds": "2", "csrf": csrf})
        cid = started.headers["Location"].removeprefix("/c/")
        pings, events = 0, []
        async with client.get(f"/c/{cid}/events") as response:
            async for raw in response.content:
                line = raw.decode().rstrip("\n")
                pings += line == ": ping"
                if line.startswith("data: ") and line != "data: {}":
                    events.append(json.loads(line[6:])["type"])
        assert pings >= 5
        assert events[-1] == "consultation:completed"
    finally:
        await asyncio.gather(*starter.tasks)
        recorder.close()
        await client.close()


async def test_the_list_comes_from_the_index_and_a_finished_consultation_links_its_report(
    conclave_env: Path
) -> None:
    """1,000 recorded consultations: the list page answers from the index within 0.2 s; a bad id is a 404 (no
    traceback); the report page is the formatted HTML report."""
    recorder = Recorder(conclave_env)
    for n in range(1000):
        for event in synthetic_events(n):
            recorder(event)
    recorder.close()
    client = await _client(conclave_env)
    try:
        await client.get(f"/?token={TOKEN}")
        timings = []
        for _ in range(5):
            began = time.perf_counter()
            listing = await client.get("/")
            timings.append(time.perf_counter() - began)
            text = await listing.text()
        assert listing.status == 200 and text.count("<tr>") == 101  # the header row and the newest 100
        assert min(timings) <= 0.2, timings
        cid = synthetic_consultation_id(999)
        assert f"/c/{cid}" in text
        page = await (await client.get(f"/c/{cid}")).text()
        assert f"/c/{cid}/report" in page
        report = await client.get(f"/c/{cid}/report")
        assert report.status == 200 and "<h2" in await report.text()
        for bad in ("..%2F..%2Fetc", "not-an-id", "c" * 300):
            assert (await client.get(f"/c/{bad}")).status == 404
    finally:
        await client.close()


async def test_the_report_of_a_consultation_not_yet_journaled_is_a_404(conclave_env: Path) -> None:
    feeds = Feeds(StoreLayout(conclave_env))
    cid = new_consultation_id()
    feeds.feed_for(cid)  # started from the form a moment ago: running here, nothing journaled yet
    client = await _client(conclave_env, feeds=feeds)
    try:
        report = await client.get(f"/c/{cid}/report?token={TOKEN}")
        assert report.status == 404 and "no report yet" in await report.text()
    finally:
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
