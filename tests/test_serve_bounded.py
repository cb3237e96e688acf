"""``conclave serve`` over a long life: finished consultations' events leave memory once nobody watches them (and
are read from the journal after that), each event is encoded once for all its viewers, the list page comes from
the index, and the server's memory stays flat over many consultations started from its form."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from cli_helpers import clean_env
from test_engine_support import AGENT_MODELS, JUDGE_MODEL

from conclave.cli.commands.browse import free_port
from conclave.doors.web.app import csrf_token, make_app
from conclave.doors.web.feeds import Feeds
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.testing.fake_server import FakeProviderServer, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for
from conclave.testing.synthetic_events import consultation_id, synthetic_events

TOKEN = "t0ken-for-tests-only"


def _frames(text: str) -> list[dict[str, object]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: {}"]


async def test_finished_consultations_leave_memory_and_are_read_from_their_journal(conclave_env: Path) -> None:
    """100 consultations run through the feeds (as the form's consultations do) and the journal: at most the
    window's few stay in memory, one being watched stays until its viewer leaves, and a dropped one is served
    from its journal, the same records in the same order."""
    recorder = Recorder(conclave_env)
    feeds = Feeds(StoreLayout(conclave_env), keep_finished=3, keep_s=60.0)
    watched = consultation_id(0)
    viewer: asyncio.Task[list[bytes]] | None = None
    most = 0
    for n in range(100):
        events = synthetic_events(n)
        feed = feeds.feed_for(events[0].consultation_id)
        for event in events:
            recorder(event)
            feed(event)
            if n == 0 and viewer is None:  # someone opens the first consultation while it runs, and stays
                viewer = asyncio.create_task(_read_until_told(feeds, watched))
                await asyncio.sleep(0)
        feeds.finish(feed.consultation_id)  # its task ended (``conclave serve`` says so from the task's callback)
        most = max(most, feeds.retained_events())
    recorder.close()
    per_consultation = max(len(synthetic_events(n)) for n in range(100))
    assert watched in feeds.running  # still watched: kept
    assert len(feeds.running) <= 3 + 1 and most <= (3 + 1) * per_consultation
    assert viewer is not None
    feeds.running[watched].finish()  # (already finished: its viewer's stream has ended) — the viewer leaves
    await viewer
    feeds.prune()
    assert watched not in feeds.running and len(feeds.running) == 3

    client = TestClient(TestServer(make_app(conclave_env, TOKEN, feeds=feeds)))
    await client.start_server()
    try:
        replay = _frames(await (await client.get(f"/c/{watched}/events?token={TOKEN}")).text())
    finally:
        await client.close()
    journal = [json.loads(line) for line in
               StoreLayout(conclave_env).journal_path(watched).read_text().splitlines()]
    assert [(e["seq"], e["type"]) for e in replay] == [(r["seq"], r["type"]) for r in journal]


async def _read_until_told(feeds: Feeds, cid: str) -> list[bytes]:
    return [frame async for batch in feeds.follow(cid, -1) for frame in batch]


async def test_a_finished_consultation_is_dropped_after_the_window_s(conclave_env: Path) -> None:
    feeds = Feeds(StoreLayout(conclave_env), keep_finished=8, keep_s=0.05)
    events = synthetic_events(1)
    feed = feeds.feed_for(events[0].consultation_id)
    for event in events:
        feed(event)
    assert feeds.retained_events() == len(events)
    await asyncio.sleep(0.1)
    feeds.prune()
    assert feeds.retained_events() == 0 and not feeds.running


async def test_each_event_is_encoded_once_and_every_viewer_gets_the_same_bytes(conclave_env: Path) -> None:
    """Three viewers follow a consultation from its start and one joins after its end: each frame they are sent is
    the one bytes object made when the event was published (one encoding, whatever the number of viewers)."""
    feeds = Feeds(StoreLayout(conclave_env))
    events = synthetic_events(2)
    feed = feeds.feed_for(events[0].consultation_id)
    live = [asyncio.create_task(_read_until_told(feeds, feed.consultation_id)) for _ in range(3)]
    await asyncio.sleep(0)
    for event in events:
        feed(event)
        await asyncio.sleep(0)
    late = await _read_until_told(feeds, feed.consultation_id)
    seen = [*(await asyncio.gather(*live)), late]
    assert len(seen[0]) == len(events)
    for frames in seen[1:]:
        assert len(frames) == len(seen[0])
        assert all(a is b for a, b in zip(frames, seen[0], strict=True))
    assert all(a is b for a, (_, b) in zip(seen[0], feed.history, strict=True))


async def test_the_list_page_reads_the_index_not_the_journals(conclave_env: Path) -> None:
    """The list shows what the index holds even when the journals are gone: it never opens them."""
    recorder = Recorder(conclave_env)
    for n in range(30):
        for event in synthetic_events(n):
            recorder(event)
    recorder.close()
    for journal in StoreLayout(conclave_env).journal_dir.glob("*.jsonl"):
        journal.unlink()
    client = TestClient(TestServer(make_app(conclave_env, TOKEN)))
    await client.start_server()
    try:
        page = await (await client.get(f"/?token={TOKEN}")).text()
    finally:
        await client.close()
    assert page.count("<tr>") == 31 and f"/c/{consultation_id(29)}" in page


def test_a_bad_window_is_a_usage_error(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    for argv in (["--keep-finished", "-1"], ["--keep-seconds", "0"]):
        done = subprocess.run([sys.executable, "-m", "conclave", "serve", *argv], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and argv[0] in lines[0] and "Traceback" not in done.stderr


async def _until_up(session: aiohttp.ClientSession, base: str) -> None:
    for _ in range(600):
        try:
            async with session.get(f"{base}/") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError("conclave serve did not come up")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
async def test_serve_memory_stays_flat_over_many_consultations_from_its_form(tmp_path: Path) -> None:
    """A real ``conclave serve`` process runs 76 two-round consultations started from its form, each watched to its
    end: its memory after the last is within 6 MiB of what it was after the 16th (it grew ~0.19 MiB per such
    consultation, ~11 MiB over these 60, when every finished consultation's events were kept)."""
    async with FakeProviderServer() as fake:
        for model in (*AGENT_MODELS.values(), JUDGE_MODEL):
            fake.script(model, lambda request: Reply(json=instance_for(request.schema)))
        port = free_port()
        env = clean_env(tmp_path, {**FAKE_KEYS, "CONCLAVE_WEB_TOKEN": TOKEN})
        server = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "conclave", "serve", "--port", str(port), "--keep-finished", "2",
            *fake.overrides(), f"judge.model={JUDGE_MODEL}", "cost.auto_approve=true",
            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        try:
            async with aiohttp.ClientSession(headers=headers) as session:
                await _until_up(session, base)

                async def consult() -> None:
                    async with session.post(f"{base}/consult", allow_redirects=False, data={
                            "question": "Q?", "rounds": "2", "csrf": csrf_token(TOKEN)}) as started:
                        assert started.status == 303, await started.text()
                        cid = started.headers["Location"].removeprefix("/c/")
                    async with session.get(f"{base}/c/{cid}/events") as stream:
                        assert "event: end" in await stream.text()

                for _ in range(16):
                    await consult()
                warm = _rss_mib(server.pid)
                for _ in range(60):
                    await consult()
                grown = _rss_mib(server.pid) - warm
            assert grown <= 6, f"serve grew {grown:.1f} MiB over 60 consultations"
        finally:
            server.terminate()
            await server.wait()
