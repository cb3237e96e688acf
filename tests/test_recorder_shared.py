"""A recorder shared by many consultations (an evaluation runs every item's consultation in one process): a round's
end writes out only the journal of the consultation whose round ended."""

from __future__ import annotations

from pathlib import Path

from conclave.store.journal import read_journal
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder


def test_write_out_of_one_consultation_leaves_the_other_journals_buffered(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path, index=False)
    layout = StoreLayout(tmp_path)
    for cid in ("c-one", "c-two", "c-three"):
        recorder.record(cid, "round:artifact", {"round": 1, "text": cid})
    recorder.write_out("c-two")  # c-two's round ended
    recorder.wait_for_writes()
    on_disk = {cid: len(read_journal(layout.journal_path(cid)).records)
               if layout.journal_path(cid).exists() else 0 for cid in ("c-one", "c-two", "c-three")}
    assert on_disk == {"c-one": 0, "c-two": 1, "c-three": 0}
    recorder.write_out()  # no consultation named: every journal, as before
    recorder.wait_for_writes()
    assert all(len(read_journal(layout.journal_path(cid)).records) == 1 for cid in ("c-one", "c-three"))
    recorder.close()
