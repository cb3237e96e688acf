"""``conclave mcp``: the MCP server started as a subprocess and driven by the official MCP SDK client (mcp 2.x), over
stdio and Streamable HTTP, against the fake provider server, for both protocol eras: the 2025 revisions (``legacy``:
the initialize handshake) and 2026-07-28 (stateless, no handshake)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import re
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from cli_helpers import clean_env
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitResult, Implementation, TextResourceContents
from pypdf import PdfReader

from conclave import events as ev
from conclave.store.journal import read_journal
from conclave.store.paths import StoreLayout
from conclave.store.sqlite_index import connect
from conclave.testing.fake_server import FakeProviderServer, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for

HEARTBEAT_S = 0.15
TOOLS = {"conclave_consult", "conclave_continue", "conclave_resume", "conclave_sessions", "conclave_show",
         "conclave_stats", "conclave_verify", "conclave_export_record", "conclave_eval"}
ROUND_TITLE = re.compile(r"^Round (\d)")
CLIENT = Implementation(name="test-agent", version="1.0")
#: the client's connect modes: the 2025 handshake (it negotiates 2025-11-25) and the 2026-07-28 stateless core
ERAS = ("legacy", "2026-07-28")


def round_of(request: Any) -> int | None:
    """Which round a provider request belongs to, from the title of the artifact schema it carries."""
    match = ROUND_TITLE.match(str((request.schema or {}).get("title", "")))
    return int(match.group(1)) if match else None


def slow_replies(fake: FakeProviderServer, latency: float) -> None:
    for model in ("gpt-4o", "claude-sonnet-4-5", "gemini-2.5-pro"):
        fake.script(model, lambda request: Reply(json=instance_for(request.schema), latency=latency))


def journal_records(home: Path) -> list[dict[str, Any]]:
    paths = list(StoreLayout(home).journal_dir.glob("*.jsonl"))
    assert len(paths) == 1, f"expected one journal under {home}, found {len(paths)}"
    return read_journal(paths[0]).records


@contextlib.asynccontextmanager
async def mcp_session(home: Path, fake: FakeProviderServer, *, cwd: Path | None = None,
                      server_overrides: tuple[str, ...] = (), mode: str = "legacy",
                      **client_options: Any) -> AsyncIterator[Client]:
    """The official client connected to ``conclave mcp`` over stdio (``mode``: legacy = the 2025 handshake, or
    2026-07-28); the fake's endpoints (and ``server_overrides``) are the server's own overrides."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "conclave", "mcp", "--heartbeat", str(HEARTBEAT_S), *fake.overrides(), *server_overrides],
        env=clean_env(home, FAKE_KEYS), cwd=str(cwd or home),
    )
    with (home / "mcp-server.stderr").open("w") as errlog:
        async with Client(stdio_client(params, errlog=errlog), client_info=CLIENT, mode=mode,
                          **client_options) as client:
            yield client


async def consult_then_cancel(session: Client, started: str, settle_s: float = 0.0) -> None:
    """Start a consultation, cancel its tool call once progress says ``started`` (after ``settle_s``): the client
    abandons the request, which sends the server ``notifications/cancelled``."""
    reached = asyncio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if message == started:
            reached.set()

    call = asyncio.create_task(session.call_tool(
        "conclave_consult", {"question": "Should we shard the database?", "max_cost": 100},
        progress_callback=on_progress))
    await asyncio.wait_for(reached.wait(), 60)
    await asyncio.sleep(settle_s)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


async def test_lists_every_tool_with_schemas_and_the_resource_templates(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    async with mcp_session(home, fake_provider_server) as session:
        tools = (await session.list_tools()).tools
        templates = (await session.list_resource_templates()).resource_templates
    assert {t.name for t in tools} == TOOLS
    for tool in tools:
        assert tool.description and tool.output_schema, tool.name
        undescribed = [name for name, prop in tool.input_schema["properties"].items() if not prop.get("description")]
        assert undescribed == [], (tool.name, undescribed)
    # the tools that only read the store say so (a client may call them without asking); consult/resume spend
    read_only = {t.name for t in tools if t.annotations and t.annotations.read_only_hint
                 and t.annotations.open_world_hint is False}
    assert read_only == TOOLS - {"conclave_consult", "conclave_continue", "conclave_resume", "conclave_eval"}
    consult = next(t for t in tools if t.name == "conclave_consult")
    assert consult.output_schema is not None
    verdict = consult.output_schema["properties"]["verdict"]
    assert {s.get("title") for s in verdict["anyOf"]} >= {"Round 4 · Verdict (converge)"}
    assert {t.uri_template for t in templates} == {"conclave://consultations/{id}",
                                                  "conclave://consultations/{id}/rounds/{n}"}


@pytest.mark.parametrize("mode", ERAS)
async def test_a_consultation_reports_progress_and_returns_the_verdict(
    home: Path, fake_provider_server: FakeProviderServer, mode: str
) -> None:
    fake = fake_provider_server
    slow_replies(fake, 0.4)  # longer than the heartbeat interval: heartbeats go out while agents think
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with mcp_session(home, fake, mode=mode) as session:
        assert session.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        result = await session.call_tool("conclave_consult", {"question": "Should we shard the database?",
                                                              "max_cost": 100, "rounds": 4},
                                         progress_callback=on_progress)
        listed = {str(r.uri) for r in (await session.list_resources()).resources}
        cid = result.structured_content["consultation_id"]
        contents = (await session.read_resource(f"conclave://consultations/{cid}/rounds/1")).contents[0]
        assert isinstance(contents, TextResourceContents)
        round_1 = json.loads(contents.text)

    assert not result.is_error, text_of(result)
    data = result.structured_content
    assert data["status"] == "complete" and data["completed_rounds"] == 4
    assert data["verdict"]["artifact_type"] == "verdict"
    assert data["recommendation"] == data["verdict"]["recommendation"]
    assert data["recommendation"] in text_of(result)  # the Markdown report
    messages = [m or "" for _, _, m in seen]
    assert "round 1 · independent started" in messages and "round 4 · verdict completed in" in " ".join(messages)
    assert sum(m.startswith("round 1: ") and "✓" in m for m in messages) == 3  # each agent's answer
    assert any(m.startswith("working: ") for m in messages)  # heartbeats
    values = [v for v, _, _ in seen]
    assert values == sorted(values) and len(set(values)) == len(values)  # strictly increasing
    assert seen[-1][1] == 4.0
    assert f"conclave://consultations/{cid}" in listed
    assert len(round_1["runs"][0]["artifacts"]) == 3 and len(round_1["runs"][0]["calls"]) == 3


async def test_progress_is_sent_only_when_the_client_asks_for_it(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    notifications: list[Any] = []

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/progress":
            notifications.append(message)

    async with mcp_session(home, fake_provider_server, message_handler=on_message) as session:
        result = await session.call_tool("conclave_consult", {"question": "Quick check?", "rounds": 1,
                                                              "max_cost": 100})
    assert not result.is_error and result.structured_content["completed_rounds"] == 1
    assert notifications == []


async def test_mcp_runs_are_journaled_and_indexed_with_their_origin(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    async with mcp_session(home, fake_provider_server) as session:
        result = await session.call_tool("conclave_consult", {"question": "Where from?", "rounds": 1,
                                                              "max_cost": 100})
        listed = await session.call_tool("conclave_sessions", {"limit": 5})
    cid = result.structured_content["consultation_id"]
    started = next(r for r in journal_records(home) if r["type"] == ev.CONSULTATION_STARTED)
    assert started["data"]["origin"] == "mcp" and started["data"]["client"] == {"name": "test-agent", "version": "1.0"}
    db = connect(StoreLayout(home).index_path)
    row = db.conn.execute("select origin, client_name, status from consultations where id = ?", [cid]).fetchone()
    db.close()
    assert row == ("mcp", "test-agent", "complete")
    assert [s["id"] for s in listed.structured_content["sessions"]] == [cid]
    assert listed.structured_content["sessions"][0]["origin"] == "mcp"


async def test_a_cancelled_consultation_keeps_its_rounds_and_resumes_without_paying_for_them_again(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    fake = fake_provider_server
    slow_replies(fake, 0.6)
    async with mcp_session(home, fake) as session:
        await consult_then_cancel(session, "round 3 · cross_exam started", settle_s=0.3)  # round 3 in flight
        asked_before = len(fake.requests)
        resumed = await session.call_tool("conclave_resume", {})
        asked_after = Counter(round_of(r) for r in fake.requests[asked_before:])

    assert not resumed.is_error, text_of(resumed)
    assert resumed.structured_content["status"] == "complete"
    assert asked_after[1] == 0 and asked_after[2] == 0, asked_after  # completed rounds: not asked, not billed
    assert asked_after[3] > 0 and asked_after[4] > 0, asked_after
    records = journal_records(home)
    interrupted = [r["data"] for r in records if r["type"] == ev.ROUND_INTERRUPTED]
    assert [(d["round_number"], d["reason"]) for d in interrupted] == [(3, "cancelled")]
    first_end = next(r for r in records if r["type"] == ev.CONSULTATION_COMPLETED)
    assert first_end["data"]["status"] == "partial"
    marker = next(r for r in records if r["type"] == ev.CONSULTATION_RESUMED)
    assert marker["data"]["restored_rounds"] == [1, 2]
    attempts = [r["data"] for r in records if r["type"] == ev.PROVIDER_ATTEMPT]
    assert resumed.structured_content["cost"]["actual"] == pytest.approx(sum(a["cost"] or 0 for a in attempts),
                                                                         abs=2e-6)


async def test_a_bad_override_is_a_tool_error_naming_the_key_and_the_allowed_values(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    async with mcp_session(home, fake_provider_server) as session:
        bad_mode = await session.call_tool("conclave_consult", {"question": "Q?", "overrides": ["mode=nope"]})
        bad_rounds = await session.call_tool("conclave_consult", {"question": "Q?", "overrides": ["rounds=7"]})
        endpoint = await session.call_tool("conclave_consult", {
            "question": "Q?", "overrides": ["providers.openai.base_url=http://attacker.example"]})
        env_read = await session.call_tool("conclave_consult", {
            "question": "Q?", "overrides": ["judge.model=${oc.env:OPENAI_API_KEY}"]})
    assert bad_mode.is_error and "mode: 'nope' is not one of: adversarial, answer, converge, devils_advocate, explore" in text_of(bad_mode)
    assert bad_rounds.is_error and "rounds:" in text_of(bad_rounds)
    assert "Traceback" not in text_of(bad_mode) + text_of(bad_rounds)
    assert endpoint.is_error and "providers.openai.base_url: cannot be set from an MCP client" in text_of(endpoint)
    assert env_read.is_error and "override 1: interpolations" in text_of(env_read)
    assert FAKE_KEYS["OPENAI_API_KEY"] not in text_of(env_read)
    assert fake_provider_server.requests == []


async def test_named_arguments_cannot_load_a_file_by_path_or_read_the_environment(
    tmp_path: Path, home: Path, fake_provider_server: FakeProviderServer
) -> None:
    """The review's exploits over the official client: a ``# @package _global_`` file in the client's workspace loaded
    as a panel, mode or persona by path; ``${oc.env:…}`` in panel, mode and the judge's provider. None composes, no
    provider is asked, and no error carries the key."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "evil.yaml").write_text(
        "# @package _global_\nproviders:\n  evil:\n    api: openai\n    base_url: http://127.0.0.1:9/v1\n"
        "    send_key: always\n    api_key_env: [OPENAI_API_KEY]\n")
    evil = "../" * 12 + str(workspace / "evil")[1:]
    key = FAKE_KEYS["OPENAI_API_KEY"]
    calls: list[dict[str, Any]] = [
        {"panel": evil}, {"mode": evil}, {"overrides": [f"agents={evil}"]},
        {"overrides": [f"persona@personas.security={evil}"]},
        {"panel": "${oc.env:OPENAI_API_KEY}"}, {"mode": "${oc.env:OPENAI_API_KEY}"},
        {"judge": "${oc.env:OPENAI_API_KEY}/gpt-4o"}, {"judge": "openai/${oc.env:OPENAI_API_KEY}"},
        {"overrides": ["cost.auto_approve=true"]},
    ]
    async with mcp_session(home, fake_provider_server, cwd=workspace) as session:
        results = [await session.call_tool("conclave_consult", {"question": "Q?", "max_cost": 100, **call})
                   for call in calls]
    for call, result in zip(calls, results, strict=True):
        text = text_of(result)
        assert result.is_error, call
        assert key not in text and "Traceback" not in text and "\n" not in text.strip(), (call, text)
    assert "agents: '" in text_of(results[0]) and "is not one of: " in text_of(results[0])
    assert "interpolations" in text_of(results[4])
    assert "cost.auto_approve: cannot be set from an MCP client" in text_of(results[-1])
    assert fake_provider_server.requests == []
    assert not list(StoreLayout(home).journal_dir.glob("*.jsonl"))


async def test_file_context_must_stay_under_the_allowed_roots(
    tmp_path: Path, home: Path, fake_provider_server: FakeProviderServer
) -> None:
    project, outside = tmp_path / "project", tmp_path / "outside"
    project.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("not for the panel")
    (project / "escape.txt").symlink_to(outside / "secret.txt")
    async with mcp_session(home, fake_provider_server, cwd=project) as session:
        direct = await session.call_tool("conclave_consult", {
            "question": "Q?", "context": [str(outside / "secret.txt")], "max_cost": 100})
        via_link = await session.call_tool("conclave_consult", {
            "question": "Q?", "context": ["escape.txt"], "max_cost": 100})
        as_override = await session.call_tool("conclave_consult", {
            "question": "Q?", "overrides": [f"project={outside}"], "max_cost": 100})
    assert direct.is_error and f"{outside / 'secret.txt'} is outside the allowed roots" in text_of(direct)
    assert via_link.is_error and "escape.txt is a symlink that leads outside the allowed roots" in text_of(via_link)
    assert str(outside) not in text_of(via_link)  # where the link leads is not the client's business
    assert as_override.is_error and "project:" in text_of(as_override)
    assert fake_provider_server.requests == []


async def test_a_context_too_long_for_a_seat_is_a_tool_error_and_nothing_is_sent(
    tmp_path: Path, home: Path, fake_provider_server: FakeProviderServer
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "dump.txt").write_text(" q" * 300_000)  # 300,000 tokens: more than gpt-4o's 128,000
    async with mcp_session(home, fake_provider_server, cwd=project) as session:
        result = await session.call_tool("conclave_consult", {
            "question": "Q?", "context": ["dump.txt"],
            "max_cost": 100, "overrides": ["agents.security.provider=gemini",
                          "agents.security.model=gemini-2.5-flash", "judge.model=gpt-4.1"]})
    text = text_of(result)
    assert result.is_error and "prompt too long for agents.architect (openai/gpt-4o): " in text
    assert "context window of 128,000 tokens" in text and "Traceback" not in text
    assert fake_provider_server.requests == []
    assert not list(StoreLayout(home).journal_dir.glob("*.jsonl"))


async def test_everything_a_client_sends_is_scrubbed(
    tmp_path: Path, home: Path, fake_provider_server: FakeProviderServer
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    file_secret = "sk-proj-" + "A1b2C3d4" * 6
    inline_secret = "ghp_" + "Z9y8X7w6" * 5
    question_secret = "AKIA" + "ABCDEFGHIJKLMNOP"
    (project / "notes.txt").write_text(f"billing service notes\nOPENAI_API_KEY={file_secret}\n")
    async with mcp_session(home, fake_provider_server, cwd=project) as session:
        result = await session.call_tool("conclave_consult", {
            "question": f"Is key {question_secret} safe to log?", "rounds": 1,
            "context": ["notes.txt", f"deploy log:\ntoken {inline_secret}\n"],
            "max_cost": 100})
    assert not result.is_error, text_of(result)
    sent = json.dumps([r.json for r in fake_provider_server.requests])
    assert "billing service notes" in sent and "deploy log:" in sent
    for secret in (file_secret, inline_secret, question_secret):
        assert secret not in sent
    assert "[REDACTED" in sent


async def test_an_estimate_over_the_threshold_is_a_tool_error_saying_how_to_approve(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    async with mcp_session(home, fake_provider_server, server_overrides=("cost.always_allow_under=0",)) as session:
        result = await session.call_tool("conclave_consult", {"question": "Costly?"})
    text = text_of(result)
    assert result.is_error and "nothing was spent" in text
    assert re.search(r"estimated cost \$\d+\.\d{4}", text)
    assert re.search(r"call again with max_cost: \d+\.\d\d", text)
    assert fake_provider_server.requests == []


async def test_a_client_with_elicitation_is_asked_to_approve_the_estimate(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    asked: list[str] = []

    async def approve(context: Any, params: Any) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"approve": True})

    async with mcp_session(home, fake_provider_server, server_overrides=("cost.always_allow_under=0",),
                           elicitation_callback=approve) as session:
        result = await session.call_tool("conclave_consult", {"question": "Costly?", "rounds": 1})
    assert len(asked) == 1 and re.search(r"estimated cost \$\d+\.\d{4}", asked[0])
    assert not result.is_error and result.structured_content["status"] == "complete"


async def test_show_verify_stats_and_export_read_the_store(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    async with mcp_session(home, fake_provider_server) as session:
        done = await session.call_tool("conclave_consult", {"question": "Audit me?", "rounds": 2,
                                                            "max_cost": 100})
        cid = done.structured_content["consultation_id"]
        shown = await session.call_tool("conclave_show", {"id": cid[:10], "round": 2})
        verified = await session.call_tool("conclave_verify", {"id": cid})
        stats = await session.call_tool("conclave_stats", {"period": "week"})
        exported = {fmt: await session.call_tool("conclave_export_record", {"id": cid, "format": fmt})
                    for fmt in ("markdown", "html", "json", "pdf")}
        missing = await session.call_tool("conclave_show", {"id": "c-nope"})
    run = shown.structured_content["runs"][0]
    assert run["ended"] == "completed" and [a["artifact_type"] for a in run["artifacts"]] == ["synthesis"]
    assert run["calls"][0]["agent"] == "judge" and run["calls"][0]["cost"] is not None
    assert verified.structured_content["ok"] is True and verified.structured_content["journals"] == 1
    assert stats.structured_content["period"]["label"] == "last 7 days"
    assert stats.structured_content["consultations"] == 1 and stats.structured_content["by_status"] == {"complete": 1}
    record = exported["json"].structured_content["record"]
    records = journal_records(home)
    assert record["journal"]["head_hash"] == records[-1]["hash"] and record["journal"]["verified"] is True
    assert record["config_hash"] == records[0]["data"]["config_hash"]
    assert record["prompt_versions"] == records[0]["data"]["prompt_versions"]
    assert records[-1]["hash"] in text_of(exported["markdown"]) and "<h1>Audit record" in text_of(exported["html"])
    pdf = exported["pdf"].content[1].resource  # the PDF travels as an embedded blob: the same record, printed
    assert pdf.mime_type == "application/pdf" and pdf.uri.endswith(f"{cid}/record.pdf")
    document = PdfReader(io.BytesIO(base64.b64decode(pdf.blob)))
    assert len(document.pages) >= 1 and "Audit me?" in "".join(page.extract_text() for page in document.pages)
    assert missing.is_error and "no consultation 'c-nope'" in text_of(missing)


# ----------------------------------------------------------------------------------------- Streamable HTTP


@contextlib.asynccontextmanager
async def http_server(home: Path, fake: FakeProviderServer) -> AsyncIterator[tuple[str, str]]:
    """``conclave mcp --http --port 0`` (no token in the environment): yields (url, the token it printed)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", "mcp", "--http", "--port", "0", "--heartbeat", str(HEARTBEAT_S),
        *fake.overrides(), env=clean_env(home, FAKE_KEYS), cwd=home,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    token = url = None
    try:
        while url is None:
            line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
            assert line, "the server exited before listening"
            if "bearer token" in line:
                token = line.rsplit(" ", 1)[1].strip()
            found = re.search(r"listening on (http://\S+)", line)
            url = found.group(1) if found else None
        assert token is not None
        yield url, token
    finally:
        process.terminate()
        await process.wait()


@pytest.mark.parametrize("mode", ERAS)
async def test_streamable_http_needs_the_bearer_token_and_serves_consultations(
    home: Path, fake_provider_server: FakeProviderServer, mode: str
) -> None:
    async with http_server(home, fake_provider_server) as (url, token):
        assert url.startswith("http://127.0.0.1:")
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}}}
        headers = {"accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient() as plain:
            no_token = await plain.post(url, json=initialize, headers=headers)
            wrong = await plain.post(url, json=initialize, headers={**headers, "authorization": "Bearer " + "x" * 43})
            # a client of the 2025-06-18 revision is answered in it
            older = await plain.post(url, json=initialize, headers={**headers, "authorization": f"Bearer {token}"})
        assert no_token.status_code == 401 and wrong.status_code == 401
        assert older.status_code == 200 and '"protocolVersion":"2025-06-18"' in older.text.replace(" ", ""), older.text
        assert no_token.headers["www-authenticate"].startswith("Bearer")

        said: list[str] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            said.append(message or "")

        authorized = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                        timeout=httpx2.Timeout(30, read=300))
        async with authorized, Client(streamable_http_client(url, http_client=authorized),
                                      client_info=CLIENT, mode=mode) as session:
            assert session.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
            names = {t.name for t in (await session.list_tools()).tools}
            result = await session.call_tool("conclave_consult", {
                "question": "Over HTTP?", "rounds": 2, "max_cost": 100},
                progress_callback=on_progress)
    assert names == TOOLS
    assert not result.is_error and result.structured_content["status"] == "complete"
    assert "round 2 · synthesis started" in said
    assert token not in (home / "index.db").read_bytes().decode("latin-1")


def test_without_the_sdk_installed_the_command_says_which_extra_to_install(home: Path) -> None:
    import subprocess

    blocker = home / "blocker"
    blocker.mkdir()
    (blocker / "mcp.py").write_text("raise ImportError('blocked for this test')\n")
    env = clean_env(home, {"PYTHONPATH": str(blocker) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    done = subprocess.run([sys.executable, "-m", "conclave", "mcp"], capture_output=True, text=True, env=env,
                          cwd=home, timeout=60, input="")
    # the hint names this source tree: `pip install 'conclave[mcp]'` would fetch an unrelated project from the index
    checkout = Path(__file__).resolve().parent.parent
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == f"conclave mcp: the MCP server needs the mcp extra: pip install -e '{checkout}[mcp]'"


def test_a_bad_server_override_stops_the_server_at_start_with_one_line(home: Path) -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-m", "conclave", "mcp", "mode=nope"], capture_output=True, text=True,
                          env=clean_env(home, FAKE_KEYS), cwd=home, timeout=120, input="")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == ["conclave mcp: mode: 'nope' is not one of: adversarial, answer, converge, devils_advocate, explore"]


async def test_argument_errors_are_one_line_naming_the_argument_and_unknown_arguments_are_refused(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    async with mcp_session(home, fake_provider_server) as session:
        rounds = await session.call_tool("conclave_consult", {"question": "Q?", "rounds": 7})
        fmt = await session.call_tool("conclave_consult", {"question": "Q?", "format": "xml"})
        missing = await session.call_tool("conclave_consult", {})
        typo = await session.call_tool("conclave_consult", {"question": "Q?", "max_cots": 0.5})
        status = await session.call_tool("conclave_sessions", {"status": "bogus", "limit": 0})
        extra = await session.call_tool("conclave_stats", {"period": "week", "verbose": True})
        override = await session.call_tool("conclave_consult", {"question": "Q?", "overrides": ["mode=nope"]})
    answers = {"rounds": rounds, "fmt": fmt, "missing": missing, "typo": typo, "status": status, "extra": extra,
               "override": override}
    for name, answer in answers.items():
        text = text_of(answer)
        assert answer.is_error and len(text.splitlines()) == 1, (name, text)
        assert not text.startswith("Error executing tool"), (name, text)
        assert "pydantic" not in text and "http" not in text and "validation error" not in text, (name, text)
    assert text_of(rounds) == "rounds: 7 is not allowed; it should be less than or equal to 4"
    assert text_of(fmt) == "format: 'xml' is not allowed; it should be 'markdown', 'json' or 'both'"
    assert text_of(missing) == "question: required"
    assert text_of(typo).startswith("conclave_consult: unknown argument 'max_cots'; allowed: question, context,")
    assert "max_cost" in text_of(typo)
    assert text_of(status).count("is not allowed") == 2 and text_of(status).startswith("limit: 0")
    assert text_of(extra) == "conclave_stats: unknown argument 'verbose'; allowed: period"
    assert fake_provider_server.requests == []


async def test_the_server_reports_conclaves_version(home: Path, fake_provider_server: FakeProviderServer) -> None:
    from conclave import __version__

    params = StdioServerParameters(command=sys.executable, args=["-m", "conclave", "mcp"],
                                   env=clean_env(home, FAKE_KEYS), cwd=str(home))
    with (home / "mcp-server.stderr").open("w") as errlog:
        async with Client(stdio_client(params, errlog=errlog), mode="legacy") as session:
            info = session.server_info
    assert info is not None and (info.name, info.version) == ("conclave", __version__)


async def test_a_cancelled_consultation_is_listed_as_interrupted_and_resumable_at_once(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    fake = fake_provider_server
    slow_replies(fake, 0.6)
    async with mcp_session(home, fake) as session:
        await consult_then_cancel(session, "round 2 · synthesis started")
        # asked at once, while the server may still be saving the partial result
        listed = await session.call_tool("conclave_sessions", {"status": "interrupted"})
        resumed = await session.call_tool("conclave_resume", {"format": "json"})
    assert not listed.is_error, text_of(listed)
    [row] = listed.structured_content["sessions"]
    assert row["status"] == "partial" and row["question"] == "Should we shard the database?"
    assert not resumed.is_error, text_of(resumed)
    assert resumed.structured_content["consultation_id"] == row["id"]
    assert resumed.structured_content["status"] == "complete"


async def test_the_report_text_makes_model_html_and_script_links_inert(
    home: Path, fake_provider_server: FakeProviderServer
) -> None:
    hostile = "Ship it <script>alert(1)</script> <img src=x onerror=alert(2)> [docs](javascript:alert(3))"

    def reply(request: Any) -> Reply:
        answer = instance_for(request.schema)
        if "recommendation" in answer:
            answer["recommendation"] = hostile
        return Reply(json=answer)

    for model in ("gpt-4o", "claude-sonnet-4-5", "gemini-2.5-pro"):
        fake_provider_server.script(model, reply)
    async with mcp_session(home, fake_provider_server) as session:
        result = await session.call_tool("conclave_consult", {"question": "Q?", "rounds": 4,
                                                              "max_cost": 100})
    assert not result.is_error, text_of(result)
    assert result.structured_content["recommendation"] == hostile  # the data stays as the model wrote it
    text = text_of(result)
    assert "<script" not in text and "<img" not in text and "](javascript:" not in text
    assert "&lt;script>alert(1)&lt;/script> &lt;img src=x onerror=alert(2)> [docs](#unsafe-link-removed)" in text


@pytest.mark.parametrize("mode", ERAS)
async def test_the_prompts_fill_the_question_and_mode_of_a_consultation_that_runs(
    home: Path, fake_provider_server: FakeProviderServer, mode: str
) -> None:
    filled = {"decide_between_options": ({"options": "Postgres\nDynamoDB", "goal": "cheap ops"}, "converge",
                                         ["Postgres", "DynamoDB", "cheap ops"]),
              "review_this_diff": ({"diff": "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"},
                                   "adversarial", ["+a = 2"]),
              "stress_test_this_plan": ({"plan": "Migrate every service in one weekend."}, "devils_advocate",
                                        ["one weekend"])}
    async with mcp_session(home, fake_provider_server, mode=mode) as session:
        listed = {p.name: p for p in (await session.list_prompts()).prompts}
        runs = {}
        for name, (arguments, _, _) in filled.items():
            prompt = await session.get_prompt(name, arguments)
            text = prompt.messages[0].content.text  # type: ignore[union-attr]
            runs[name] = json.loads(text[text.index("{"):])
        asked_before = len(fake_provider_server.requests)
        result = await session.call_tool("conclave_consult", {**runs["stress_test_this_plan"], "rounds": 1,
                                                              "max_cost": 100})
    assert set(listed) == set(filled) and all(p.description and p.arguments for p in listed.values())
    for name, (_, mode_filled, quoted) in filled.items():
        assert runs[name]["mode"] == mode_filled
        assert all(q in runs[name]["question"] for q in quoted), (name, runs[name])
    assert not result.is_error, text_of(result)
    assert result.structured_content["mode"] == "devils_advocate"
    assert asked_before == 0 and len(fake_provider_server.requests) > 0  # a prompt alone asks no model
