"""Issue 28: the index keeps each artifact's gist; the full texts stay in the journal (and the views read them
there). A real index written by the recorder, a real ``index rebuild``, and an index written before m023."""

from __future__ import annotations

import json
from pathlib import Path

from conclave import events as ev
from conclave.store.artifact_gist import ITEM_CHARS, KEPT_LISTS, ON_THE_ROW, TOP_CHARS, gist
from conclave.store.journal import read_records
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.sqlite_index import connect, rebuild
from conclave.testing.synthetic_events import synthetic_events

LONG = "a long paragraph of model text " * 40  # 1,240 characters


def _record_long_texts(home: Path) -> str:
    """One consultation whose artifacts carry long texts at every depth, and a verdict with a long dissent."""
    stream = synthetic_events(1)
    for event in stream:
        if event.type == ev.ROUND_ARTIFACT:
            artifact = event.data["artifact"]
            artifact["rationale"] = LONG
            artifact["consensus_points"] = [{"point": LONG, "confidence": 0.7, "evidence": [LONG, LONG]}] * 5
            artifact["key_points"] = [LONG] * 3
            if artifact.get("artifact_type") == "verdict" or event.data.get("artifact_type") == "verdict":
                artifact["dissent"] = [{"agent": "security", "concern": "too slow " * 20, "severity": "high"}]
    recorder = Recorder(home)
    for event in stream:
        recorder(event)
    recorder.close()
    return str(stream[0].consultation_id)


def _artifacts(home: Path) -> list[tuple[str, str]]:
    db = connect(StoreLayout(home).index_path)
    try:
        return db.conn.execute("select artifact_type, artifact from artifacts order by seq").fetchall()
    finally:
        db.close()


def _check_gists(rows: list[tuple[str, str]]) -> None:
    assert rows
    for _kind, text in rows:
        gist = json.loads(text)
        assert LONG not in text
        assert len(gist["rationale"]) == TOP_CHARS and gist["rationale"].endswith("…")
        assert len(gist["consensus_points"]) == 5  # counts stay right for the briefs
        assert gist["consensus_points"][0] == {"confidence": 0.7}  # an item's numbers; its texts are journaled
        assert gist["key_points"] == [LONG[: ITEM_CHARS - 1] + "…", "", ""]  # the first, which a brief names
        assert len(text) < 1_000


def test_the_index_keeps_the_gist_and_the_journal_the_full_text(tmp_path: Path) -> None:
    cid = _record_long_texts(tmp_path)
    rows = _artifacts(tmp_path)
    _check_gists(rows)
    journaled = [r["data"]["artifact"] for r in read_records(StoreLayout(tmp_path).journal_path(cid))
                 if r["type"] == ev.ROUND_ARTIFACT]
    assert journaled and all(a["rationale"] == LONG for a in journaled)
    # the dissent log still reads the verdict's dissent (a concern is clipped at 300 chars: this one is kept whole)
    db = connect(StoreLayout(tmp_path).index_path)
    try:
        dissent = db.conn.execute("select agent, concern, severity from dissent_log").fetchall()
    finally:
        db.close()
    assert dissent == [("security", "too slow " * 20, "high")] and len("too slow " * 20) < KEPT_LISTS["dissent"]
    rebuild(StoreLayout(tmp_path), workers=0)
    assert _artifacts(tmp_path) == rows


def test_m023_slims_an_index_written_before(tmp_path: Path) -> None:
    """An index of full artifacts (as written before m023) is slimmed when a process next connects."""
    cid = _record_long_texts(tmp_path)
    full = {r["seq"]: r["data"]["artifact"] for r in read_records(StoreLayout(tmp_path).journal_path(cid))
            if r["type"] == ev.ROUND_ARTIFACT}
    db = connect(StoreLayout(tmp_path).index_path)
    try:
        for seq, artifact in full.items():
            db.conn.execute("update artifacts set artifact = ? where consultation_id = ? and seq = ?",
                            [json.dumps(artifact, sort_keys=True, ensure_ascii=False), cid, seq])
        db.conn.execute("delete from _sqlite_migrations where name = 'm023_artifact_gist'")
        assert any(LONG in text for _k, text in db.conn.execute("select artifact_type, artifact from artifacts"))
    finally:
        db.close()
    _check_gists(_artifacts(tmp_path))


def test_the_gist_leaves_out_what_the_row_says(tmp_path: Path) -> None:
    """artifact_type, round_number, agent_id, schema_version and created_at (about 140 bytes of each gist) are the
    row's columns or read by no one; an index written before m026 has them cut on connect, the rest unchanged."""
    cid = _record_long_texts(tmp_path)
    journaled = {r["seq"]: r["data"]["artifact"] for r in read_records(StoreLayout(tmp_path).journal_path(cid))
                 if r["type"] == ev.ROUND_ARTIFACT}
    assert any(set(a) & ON_THE_ROW for a in journaled.values())
    rows = _artifacts(tmp_path)
    assert rows and not any(set(json.loads(text)) & ON_THE_ROW for _kind, text in rows)
    db = connect(StoreLayout(tmp_path).index_path)
    try:
        for seq, artifact in journaled.items():  # as m023 left them: the gist with the row's fields
            kept = gist({k: v for k, v in artifact.items() if k not in ON_THE_ROW})
            db.conn.execute("update artifacts set artifact = ? where consultation_id = ? and seq = ?",
                            [json.dumps({**kept, **{k: v for k, v in artifact.items() if k in ON_THE_ROW}},
                                        sort_keys=True, ensure_ascii=False), cid, seq])
        db.conn.execute("delete from _sqlite_migrations where name = 'm026_gist_without_row_fields'")
    finally:
        db.close()
    assert _artifacts(tmp_path) == rows
