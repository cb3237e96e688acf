"""Follow-up questions (``parent=ID``, ``conclave ask``): a new consultation linked to a finished one, whose panel
sees the parent's verdict, dissent and claims, recorded in the journal, the index, the result and the report.

CLI runs are subprocesses (``python -m conclave``) against the fake provider server; what the providers received
is read from the fake's recorded requests."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import clean_env
from datasette.app import Datasette
from test_engine_support import QUESTION, script_panel
from test_mcp import mcp_session, text_of
from test_web import TOKEN, _client, _form_starter, _hidden

from conclave import events as ev
from conclave.store.journal import read_records
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.testing.fake_server import FakeProviderServer, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for

CLI = [sys.executable, "-m", "conclave"]
VERDICT = "Shard by tenant id behind a routing table"
SECRET = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


async def conclave(home: Path, *args: str, stdin: bytes = b"") -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *CLI, *args, env=clean_env(home, FAKE_KEYS), cwd=home, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate(stdin)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def judge_says(fake: FakeProviderServer, recommendation: str) -> None:
    """The judge (gpt-4o) answers every artifact with a sample, its verdict recommending ``recommendation``."""
    def reply(request: Any) -> Reply:
        value = instance_for(request.schema)
        if isinstance(value, dict) and value.get("artifact_type") == "verdict":
            value["summary" if "summary" in value else "recommendation"] = recommendation  # explore: summary
        return Reply(json=value)
    fake.script("gpt-4o", reply)


def sent(requests: list[Any]) -> str:
    return "\n".join(json.dumps(r.json, ensure_ascii=False) for r in requests)


def started(home: Path, cid: str) -> dict[str, Any]:
    records = read_records(StoreLayout(home).journal_path(cid))
    return next(r for r in records if r["type"] == ev.CONSULTATION_STARTED)["data"]


async def ask_parent(home: Path, fake: FakeProviderServer, *extra: str) -> dict[str, Any]:
    code, out, err = await conclave(home, "Should we shard the database?", *fake.overrides(), "cost.auto_approve=true",
                                    "output.format=json", "rounds=4", *extra)
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


async def test_ask_keeps_the_panel_and_mode_and_shows_the_parent_verdict_and_claims(home: Path) -> None:
    async with FakeProviderServer() as fake:
        judge_says(fake, VERDICT)
        parent = await ask_parent(home, fake, "mode=explore", "agents.security.model=gpt-4o-mini")
        before = len(fake.requests)
        code, out, err = await conclave(home, "ask", "And what would it cost?", *fake.overrides(),
                                        "cost.auto_approve=true", "output.format=json", "rounds=2")
        assert code == 0, err
        follow_up = json.loads(out)
        asked = fake.requests[before:]
    assert follow_up["parent"] == parent["consultation_id"]
    assert follow_up["mode"] == "explore"  # the parent's mode, not the default converge
    assert [(a["name"], a["model"]) for a in follow_up["agents"]] == [(a["name"], a["model"]) for a in parent["agents"]]
    assert any(r.model == "gpt-4o-mini" for r in asked)  # the parent's changed seat answered again
    text = sent(asked)
    assert parent["recommendation"] == VERDICT
    assert f"EARLIER CONSULTATION {parent['consultation_id']}" in text
    assert f"Verdict (confidence {parent['confidence']:.0%}): {VERDICT}" in text
    claims = parent["quality"]["state"]["claims"]
    assert claims and all(f"{c['id']} [{c['label']}, {c['status']}]" in text for c in claims)
    assert parent["dissent"] and parent["dissent"][0]["concern"] in text
    # not the raw transcript: the parent's round-1 positions are not sent again
    positions = {a["position"] for a in parent["artifacts"]["round_1"].values()} - {VERDICT}
    assert positions and not any(f'"position": "{p}"' in text for p in positions)
    # linked in the journal's start record and the index
    assert started(home, follow_up["consultation_id"])["parent"] == parent["consultation_id"]
    with sqlite3.connect(StoreLayout(home).index_path) as db:
        rows = dict(db.execute("select id, parent_id from consultations").fetchall())
        plan = " ".join(str(r) for r in db.execute(
            "explain query plan select id from consultations where parent_id = 'x'").fetchall())
    assert follow_up["context_sources"][0]["path"] == f"consultation {parent['consultation_id']}"  # the report says it
    assert rows == {parent["consultation_id"]: None, follow_up["consultation_id"]: parent["consultation_id"]}
    assert "consultations_parent" in plan


async def test_an_override_changes_the_mode_of_a_follow_up(home: Path) -> None:
    async with FakeProviderServer() as fake:
        parent = await ask_parent(home, fake, "mode=explore")
        code, out, err = await conclave(home, "What about cost?", f"parent={parent['consultation_id'][:8]}",
                                        "mode=converge", *fake.overrides(), "cost.auto_approve=true",
                                        "output.format=json", "rounds=2")
    assert code == 0, err
    result = json.loads(out)
    assert result["mode"] == "converge" and result["parent"] == parent["consultation_id"]


async def test_cfg_job_with_a_parent_says_what_the_run_takes_from_it(home: Path) -> None:
    async with FakeProviderServer() as fake:
        parent = (await ask_parent(home, fake, "mode=explore", "agents.security.model=gpt-4o-mini"))["consultation_id"]
    code, out, err = await conclave(home, "And the cost?", "--cfg", "job", f"parent={parent[:10]}")
    assert code == 0, err
    yaml_text, note = out.rstrip("\n").rsplit("\n", 1)
    assert "strategy: converge" in yaml_text  # Hydra's composed config: not what the follow-up runs ...
    assert note.startswith(f"# parent={parent}: the run replaces the above with the parent's agents: ")
    assert "security (openai/gpt-4o-mini)" in note and note.endswith("mode: explore")  # ... this line says it
    code, out, err = await conclave(home, "And the cost?", "--cfg", "job", f"parent={parent}", "mode=converge",
                                    "agents=default")
    assert code == 0 and out.rstrip().endswith("the overrides choose the panel and mode, as shown above"), err
    code, out, err = await conclave(home, "And the cost?", "--cfg", "job", "parent=c-nosuchid")
    assert code == 0 and out.rstrip().splitlines()[-1] == (
        f"# parent: no consultation 'c-nosuchid' in {home}/journal "
        "(a run with this parent is refused)"), err


async def test_a_thread_of_three_shows_in_logs_show_show_and_datasettes_query(home: Path) -> None:
    async with FakeProviderServer() as fake:
        first = (await ask_parent(home, fake, "rounds=2"))["consultation_id"]
        ids = [first]
        for question in ("And the cost?", "And the risk?"):
            code, out, err = await conclave(home, "ask", ids[-1], question, *fake.overrides(),
                                            "cost.auto_approve=true", "output.format=json", "rounds=2")
            assert code == 0, err
            ids.append(json.loads(out)["consultation_id"])
        lone = (await ask_parent(home, fake, "rounds=2"))["consultation_id"]
    code, out, err = await conclave(home, "logs", "show", ids[1])
    assert code == 0, err
    thread = out.split("\nthread (3 consultations", 1)[1].splitlines()[1:]
    assert [line.split()[0] for line in thread] == ids
    assert [len(line) - len(line.lstrip()) for line in thread] == [2, 4, 6]  # indented by depth
    assert "← this one" in thread[1]
    code, out, err = await conclave(home, "show", ids[2])
    assert code == 0 and f"Follow-up of {ids[1]}" in out, err
    code, out, err = await conclave(home, "show", ids[2], "--format", "html")
    assert code == 0 and f"Follow-up of {ids[1]}" in out, err
    # Datasette's canned query "thread", from any consultation of the thread
    datasette = Datasette([str(StoreLayout(home).index_path)])
    for member in ids:
        response = await datasette.client.get(f"/index/thread.json?_shape=array&id={member}")
        assert response.status_code == 200, response.text
        assert [(r["depth"], r["id"], r["parent_id"]) for r in response.json()] == [
            (0, ids[0], None), (1, ids[1], ids[0]), (2, ids[2], ids[1])]
    # the consultation's page shows its thread: the ancestor and the follow-up linked, itself not
    page = (await datasette.client.get(f"/-/conclave/{ids[1]}")).text
    thread_html = page.split('id="thread"', 1)[1].split("</section>", 1)[0]
    assert "Follow-up thread (3 consultations)" in thread_html
    assert [i for i in ids if f'href="/-/conclave/{i}"' in thread_html] == [ids[0], ids[2]]
    assert thread_html.index(ids[0]) < thread_html.index(ids[1]) < thread_html.index(ids[2])
    assert "(this consultation)" in thread_html and "And the cost?" in thread_html
    assert 'id="thread"' not in (await datasette.client.get(f"/-/conclave/{lone}")).text


async def test_show_prompt_shows_the_parent_block(home: Path) -> None:
    async with FakeProviderServer() as fake:
        judge_says(fake, VERDICT)
        parent = (await ask_parent(home, fake))["consultation_id"]
    code, out, err = await conclave(home, "show-prompt", "1", "And the cost?", f"parent={parent}")
    assert code == 0, err
    assert f"EARLIER CONSULTATION {parent}" in out and "Verdict (confidence" in out and VERDICT in out


async def test_the_parent_context_is_scrubbed(home: Path) -> None:
    async with FakeProviderServer() as fake:
        judge_says(fake, f"Rotate the leaked token {SECRET} first")
        parent = (await ask_parent(home, fake))["consultation_id"]
        recorded = json.dumps(read_records(StoreLayout(home).journal_path(parent)))
        before = len(fake.requests)
        code, out, err = await conclave(home, "ask", "And then?", *fake.overrides(), "cost.auto_approve=true",
                                        "output.format=json", "rounds=2")
        assert code == 0, err
        asked = sent(fake.requests[before:])
    assert SECRET in recorded  # the parent's verdict holds it ...
    assert SECRET not in asked and "[REDACTED_GITHUB_TOKEN]" in asked  # ... the follow-up's panel never sees it
    assert json.loads(out)["scrub_report"]["total"] >= 1


async def test_the_cost_gate_refuses_a_follow_up_over_the_limit_with_nothing_spent(home: Path) -> None:
    async with FakeProviderServer() as fake:
        parent = (await ask_parent(home, fake))["consultation_id"]
        before = len(fake.requests)
        code, out, err = await conclave(home, "ask", parent, "And then?", *fake.overrides(),
                                        "cost.always_allow_under=0")
        asked = fake.requests[before:]
    assert code == 1 and out == ""
    assert "not started" in err and err.count("\n") == 1, err
    assert asked == []


@pytest.mark.parametrize("case", ["unknown", "ambiguous", "tampered", "unfinished"])
async def test_a_bad_parent_is_one_line_exit_2_and_nothing_spent(home: Path, case: str) -> None:
    async with FakeProviderServer() as fake:
        ids = [(await ask_parent(home, fake, "rounds=1"))["consultation_id"] for _ in range(2)]
        layout = StoreLayout(home)
        if case == "unfinished":  # refused by the cost gate: it ended aborted, without a verdict
            code, _, err = await conclave(home, "Q?", *fake.overrides(), "cost.always_allow_under=0")
            assert code == 1, err
            ids[0] = sorted(set(layout.journal_ids()) - set(ids))[0]
        ref, expected = {"unknown": ("c-nosuch", "parent: no consultation 'c-nosuch'"),
                         "ambiguous": ("c-", "parent: 'c-' is ambiguous"),
                         "tampered": (ids[0], f"parent: {ids[0]} fails `conclave logs verify`"),
                         "unfinished": (ids[0], f"parent: {ids[0]} has no verdict")}[case]
        path = layout.journal_path(ids[0])
        if case == "tampered":  # an edited record: the hash chain breaks
            path.write_text(path.read_text().replace("Should we shard", "Should we NOT shard", 1))
        before = len(fake.requests)
        journals = sorted(layout.journal_dir.glob("*.jsonl"))
        code, out, err = await conclave(home, "ask", ref, "And then?", *fake.overrides(), "cost.auto_approve=true")
        assert fake.requests[before:] == []
        assert sorted(layout.journal_dir.glob("*.jsonl")) == journals  # no journal started either
    assert code == 2 and out == ""
    assert err.startswith(f"conclave: {expected}") and err.count("\n") == 1 and "Traceback" not in err, err


async def test_a_killed_follow_up_resumes_as_a_follow_up(home: Path) -> None:
    async with FakeProviderServer() as fake:
        parent = (await ask_parent(home, fake))["consultation_id"]
        for model in ("gpt-4o", "claude-sonnet-4-5", "gemini-2.5-pro"):  # slow enough to be killed inside round 2
            fake.script(model, lambda request: Reply(json=instance_for(request.schema), latency=0.5))
        process = await asyncio.create_subprocess_exec(
            *CLI, "ask", parent, "And then?", *fake.overrides(), "cost.auto_approve=true", "rounds=4",
            env=clean_env(home, FAKE_KEYS), cwd=home,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        layout = StoreLayout(home)
        child = None
        for _ in range(3000):
            child = next((i for i in layout.journal_ids() if i != parent), None)
            records = read_records(layout.journal_path(child)) if child else []
            if any(r["type"] == ev.ROUND_STARTED and r["data"]["round_number"] == 2 for r in records):
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.25)
        process.kill()
        await process.wait()
        assert child is not None
        before = len(fake.requests)
        code, _, err = await conclave(home, "resume", child)
        resumed = fake.requests[before:]
    assert code == 0, err
    records = read_records(StoreLayout(home).journal_path(child))
    final = next(r for r in records if r["type"] == ev.CONSULTATION_COMPLETED)["data"]
    assert final["status"] == "complete" and final["result"]["parent"] == parent
    starts = [r["data"] for r in records if r["type"] == ev.CONSULTATION_STARTED]
    assert len(starts) == 2 and all(s["parent"] == parent for s in starts)
    assert resumed and f"EARLIER CONSULTATION {parent}" in sent(resumed)  # the resumed rounds still see it


async def test_the_live_views_follow_up_form_starts_a_follow_up_through_the_guarded_path(
    fake_provider_server: FakeProviderServer, conclave_env: Path
) -> None:
    fake = fake_provider_server
    script_panel(fake)
    recorder = Recorder(conclave_env, index=False)
    starter = _form_starter(fake, conclave_env, recorder, "cost.auto_approve=true")
    client = await _client(conclave_env, feeds=starter.feeds, starter=starter.starter())
    layout = StoreLayout(conclave_env)
    try:
        csrf = _hidden(await (await client.get(f"/?token={TOKEN}")).text(), "csrf")
        started_parent = await client.post("/consult", allow_redirects=False,
                                           data={"question": QUESTION, "rounds": "4", "mode": "explore", "csrf": csrf})
        assert started_parent.status == 303
        parent = started_parent.headers["Location"].removeprefix("/c/")
        await asyncio.gather(*starter.tasks)
        page = await (await client.get(f"/c/{parent}")).text()
        assert f"action='/c/{parent}/follow-up'" in page and _hidden(page, "csrf") == csrf
        port = client.server.port
        form = {"question": "And what would it cost?", "csrf": csrf}
        journals = set(layout.journal_ids())
        for headers, data in (({"Origin": f"http://127.0.0.1:{port + 1}"}, form),
                              ({"Sec-Fetch-Site": "cross-site"}, form), ({}, {**form, "csrf": "x"})):
            assert (await client.post(f"/c/{parent}/follow-up", data=data, headers=headers)).status == 403
        assert (await client.post(f"/c/{parent}/follow-up", data={**form, "question": " "})).status == 400
        assert (await client.post("/c/c-nosuch/follow-up", data=form)).status == 404
        assert set(layout.journal_ids()) == journals  # none of those started anything
        asked = await client.post(f"/c/{parent}/follow-up", data=form, allow_redirects=False)
        assert asked.status == 303
        child = asked.headers["Location"].removeprefix("/c/")
        await asyncio.gather(*starter.tasks)
    finally:
        recorder.close()
        await client.close()
    data = started(conclave_env, child)
    assert data["parent"] == parent and data["mode"] == "explore" and data["question"] == "And what would it cost?"


async def test_mcp_conclave_continue_asks_a_follow_up(home: Path, fake_provider_server: FakeProviderServer) -> None:
    fake = fake_provider_server
    judge_says(fake, VERDICT)
    parent = (await ask_parent(home, fake, "mode=explore"))["consultation_id"]
    before = len(fake.requests)
    async with mcp_session(home, fake) as session:
        result = await session.call_tool("conclave_continue", {
            "question": "And what would it cost?", "overrides": ["rounds=2"], "max_cost": 100, "format": "json"})
        bad = await session.call_tool("conclave_continue", {"id": "c-nosuch", "question": "Q?", "max_cost": 100})
    assert not result.is_error, text_of(result)
    data = json.loads(text_of(result))
    assert data["parent"] == parent and data["mode"] == "explore"
    assert VERDICT in sent(fake.requests[before:])
    assert bad.is_error and text_of(bad).startswith("parent: no consultation 'c-nosuch'")


async def test_a_parent_journal_the_system_cannot_read_is_one_line_exit_1(home: Path) -> None:
    async with FakeProviderServer() as fake:
        parent = (await ask_parent(home, fake, "rounds=1"))["consultation_id"]
        path = StoreLayout(home).journal_path(parent)
        path.unlink()
        path.mkdir()  # where the journal should be, something the system will not read as a file
        before = len(fake.requests)
        code, out, err = await conclave(home, "ask", parent, "And then?", *fake.overrides(),
                                        "cost.auto_approve=true")
        assert fake.requests[before:] == []
    assert code == 1 and out == ""
    assert err.startswith(f"conclave: parent: cannot read the journal of {parent}: ") and err.count("\n") == 1, err
