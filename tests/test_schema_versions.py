"""Journals written while artifacts were at format 1.0 (before claims, references and the synthesis' coverage
were required), and answer-mode journals written at 1.1 before answer mode carried those lists, still verify,
index, render and resume with the current code.

The events come from ``fixtures/journals/converge_schema_1_0.events.jsonl`` (recorded by the 1.0 engine) and
``fixtures/journals/answer_schema_1_1_no_claims.events.jsonl`` (recorded by the engine whose answer mode had no
claims), and are written through the recorder, which chains and heads them as any run does."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from test_engine_support import AGENT_MODELS, requests_with, texts

from conclave.artifacts import schema_registry as artifacts
from conclave.engine.run import Consultation
from conclave.store.journal import read_records
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.resume_points import load_resume_point
from conclave.store.sqlite_index import rebuild
from conclave.store.verify import verify_store
from conclave.testing.fake_server import FakeProviderServer

FIXTURE = Path(__file__).parent / "fixtures" / "journals" / "converge_schema_1_0.events.jsonl"
ANSWER_FIXTURE = FIXTURE.with_name("answer_schema_1_1_no_claims.events.jsonl")


def replay(home: Path, fake: FakeProviderServer | None = None,
           stop: Callable[[dict[str, Any]], bool] = lambda record: False, fixture: Path = FIXTURE) -> str:
    """Write the recorded events into ``home``'s journal (up to and including the first one ``stop`` accepts),
    the recorded home and providers pointed at ``home`` and ``fake``; returns the consultation id."""
    text = fixture.read_text(encoding="utf-8").replace("{CONCLAVE_HOME}", str(home))
    if fake is not None:
        for name, entry in fake.providers_config().items():
            text = text.replace("{FAKE_BASE_URL:" + name + "}", entry["base_url"])
    recorder = Recorder(home, index=False)
    cid = ""
    for line in text.splitlines():
        record = json.loads(line)
        cid = record["consultation_id"]
        recorder.record(cid, record["type"], record["data"], record["ts"])
        if stop(record):
            break
    recorder.close()
    return cid


def _version_1_0(records: list[dict[str, Any]]) -> list[str]:
    return [r["data"]["artifact"].get("schema_version") for r in records if r["type"] == "consultation:round_artifact"
            and "schema_version" in r["data"]["artifact"]]


def test_a_1_0_journal_verifies_indexes_and_renders(tmp_path: Path) -> None:
    from conclave.render.journal_view import result_from_records
    from conclave.render.markdown import render_markdown

    cid = replay(tmp_path)
    layout = StoreLayout(tmp_path)
    records = read_records(layout.journal_path(cid))
    assert set(_version_1_0(records)) == {"1.0"}
    assert verify_store(layout).ok
    assert rebuild(layout).consultations == 1
    with sqlite3.connect(layout.index_path) as db:
        status, violations = db.execute("select status, rule_violations from consultations where id = ?",
                                        (cid,)).fetchone()
        claims = db.execute("select claim_id, agent from claims where consultation_id = ?", (cid,)).fetchall()
        rounds = db.execute("select count(*) from artifacts where consultation_id = ?", (cid,)).fetchone()[0]
    assert status == "complete" and violations is not None
    assert ("C1", "architect") in claims and rounds == 9
    report = render_markdown(result_from_records(records))
    assert "## Verdict" in report and "## Debate quality" in report and "## Round 2 · Synthesis" in report


async def test_a_1_0_journal_killed_after_round_2_resumes_with_the_current_format(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    from conclave.render.markdown import render_markdown

    fake = fake_provider_server
    cid = replay(conclave_env, fake, stop=lambda r: r["type"] == "state:transition"
                 and r["data"].get("reason") == "round 2 complete")
    layout = StoreLayout(conclave_env)
    point = load_resume_point(layout, cid)
    assert point.restored_rounds == [1, 2]
    recorder = Recorder(conclave_env)
    consultation = Consultation(point.settings, recorder=recorder, resume_from=point.resume_from,
                                consultation_id=cid, first_seq=point.next_seq)
    result = await consultation.run()
    recorder.close()
    assert result.status == "complete" and result.completed_rounds == 4
    assert not requests_with(fake, "independent") and not requests_with(fake, "synthesis")  # nothing paid twice
    # the restored 1.0 synthesis was read as the current format: filtered, validated and shown to round 3
    assert result.artifacts.round_2 is not None
    assert result.artifacts.round_2["schema_version"] == artifacts.current_version()
    assert artifacts.validate("synthesis", result.artifacts.round_2) == []
    assert "=== DEBATE STATE ===" in texts(requests_with(fake, "cross_exam_reply", AGENT_MODELS["architect"])[0])
    records = read_records(layout.journal_path(cid))
    assert "1.0" in _version_1_0(records) and artifacts.current_version() in _version_1_0(records)
    assert verify_store(layout).ok  # the journal, old records and new, still verifies
    assert rebuild(layout).consultations == 1
    assert "## Verdict" in render_markdown(result.as_dict())


# ------------------------------------------------------------------------------------ answer mode before its claims


def _after_round_2(record: dict[str, Any]) -> bool:
    return record["type"] == "state:transition" and record["data"].get("reason") == "round 2 complete"


def test_an_answer_journal_from_before_its_claims_verifies_indexes_and_renders(tmp_path: Path) -> None:
    from conclave.render.journal_view import result_from_records
    from conclave.render.markdown import render_markdown

    cid = replay(tmp_path, fixture=ANSWER_FIXTURE)
    layout = StoreLayout(tmp_path)
    records = read_records(layout.journal_path(cid))
    stored = [r["data"]["artifact"] for r in records if r["type"] == "consultation:round_artifact"]
    assert stored and not any("claims" in a or "evidence_claims" in a for a in stored)  # what the old engine wrote
    assert verify_store(layout).ok
    assert rebuild(layout).consultations == 1
    with sqlite3.connect(layout.index_path) as db:
        status, strategy = db.execute("select status, strategy from consultations where id = ?", (cid,)).fetchone()
        rounds = db.execute("select count(*) from artifacts where consultation_id = ?", (cid,)).fetchone()[0]
    assert (status, strategy, rounds) == ("complete", "answer", 9)
    report = render_markdown(result_from_records(records))
    assert "## Verdict" in report and "-27" in report and "## Debate quality" in report


async def test_an_answer_journal_from_before_its_claims_resumes_with_claims_and_the_state(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    from conclave.testing.answer_panel import AnswerPanel

    fake = fake_provider_server
    AnswerPanel({"Security Expert": 1.0, "Systems Architect": 1.0, "Pragmatic Engineer": 0.0}).install(fake)
    cid = replay(conclave_env, fake, stop=_after_round_2, fixture=ANSWER_FIXTURE)
    layout = StoreLayout(conclave_env)
    point = load_resume_point(layout, cid)
    assert point.restored_rounds == [1, 2]
    recorder = Recorder(conclave_env)
    result = await Consultation(point.settings, recorder=recorder, resume_from=point.resume_from,
                                consultation_id=cid, first_seq=point.next_seq).run()
    recorder.close()
    assert result.status == "complete" and result.strategy == "answer"
    assert result.verdict is not None and result.verdict["final_answer"] == "-27"
    assert not requests_with(fake, "independent_answer") and not requests_with(fake, "synthesis_answer")
    # the restored synthesis reads as the current answer format, with its coverage lists empty
    assert result.artifacts.round_2 is not None
    assert artifacts.validate("synthesis_answer", result.artifacts.round_2) == []
    assert result.artifacts.round_2["partial_coverage"] == []
    # the resumed rounds ran the current prompts: the labelling rules and the (empty) DEBATE STATE
    shown = texts(requests_with(fake, "cross_exam_reply_answer")[0])
    assert "=== EPISTEMIC LABELING ===" in shown and "=== DEBATE STATE ===" in shown
    assert verify_store(layout).ok and rebuild(layout).consultations == 1


def test_a_1_1_answer_artifact_without_claims_reads_as_naming_none_and_a_converge_one_does_not() -> None:
    fixtures = Path(__file__).parent / "fixtures" / "artifacts"
    strip = ("claims", "references", "uncertainties", "partial_coverage", "unique_insights", "blind_spots",
             "verification", "evidence_claims", "claim_ids")

    def old(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: old(v) for k, v in value.items() if k not in strip}
        return [old(v) for v in value] if isinstance(value, list) else value

    for name in ("independent_answer", "synthesis_answer", "cross_exam_reply_answer", "verdict_answer"):
        legacy = old(json.loads((fixtures / f"{name}.valid.json").read_text(encoding="utf-8")))
        assert artifacts.validate(name, legacy) != []  # the current format requires the lists
        assert artifacts.validate(name, artifacts.upgrade(name, legacy)) == [], name
    converge = old(json.loads((fixtures / "independent.valid.claims.json").read_text(encoding="utf-8")))
    assert artifacts.upgrade("independent", converge) is converge  # 1.1 converge artifacts always had them
