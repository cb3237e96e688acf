"""A journal holding bytes that are not UTF-8 (a flipped bit, a copy through a broken tool) reads as ``json.loads``
reads it: msgspec raises UnicodeDecodeError there, not the DecodeError the fast path caught, so ``conclave index
rebuild`` ended in a traceback at the first such journal (json.loads reads UTF-8-encoded surrogates with
surrogatepass and refuses only the line that holds other invalid bytes). A line nested past Python's recursion
limit raised RecursionError out of both parsers; it is now a line that is not JSON, as ``logs verify`` reads it.
Real SQLite, the real CLI."""

from __future__ import annotations

import sys
from pathlib import Path

from cli_helpers import run_conclave
from test_rebuild_verify_scale import age_journals, mixed_home

from conclave.store.journal_file import parse_records, read_journal
from conclave.store.paths import StoreLayout

GOOD = b'{"seq": 1, "type": "x", "data": {"n": 1}}\n'
LINES = {
    "an invalid start byte": b'{"seq": 2, "data": {"s": "\xff"}}\n',
    "an overlong encoding": b'{"seq": 2, "data": {"s": "\xc0\xaf"}}\n',
    "a UTF-8-encoded surrogate": b'{"seq": 2, "data": {"s": "\xed\xa0\x80"}}\n',
    "a truncated sequence": b'{"seq": 2, "data": {"s": "\xe2\x82"}}\n',
    "nesting past the recursion limit": b'{"seq": 2, "data": ' + b"[" * (sys.getrecursionlimit() * 5)
                                        + b"]" * (sys.getrecursionlimit() * 5) + b"}\n",
}


def test_a_line_that_is_not_utf8_or_nests_too_deep_parses_as_json_loads_reads_it(tmp_path: Path) -> None:
    for what, line in LINES.items():
        journal = tmp_path / "c.jsonl"
        journal.write_bytes(GOOD + line + GOOD.replace(b'"seq": 1', b'"seq": 3'))
        expected = read_journal(journal).records  # json.loads line by line
        assert [r["seq"] for r in expected if "seq" in r] in ([1, 3], [1, 2, 3]), what
        assert repr(parse_records(journal.read_bytes(), journal)) == repr(expected), what


def test_index_rebuild_reads_a_home_with_a_journal_that_is_not_utf8(tmp_path: Path) -> None:
    mixed_home(tmp_path)
    age_journals(tmp_path)
    layout = StoreLayout(tmp_path)
    journal = sorted(layout.journal_dir.glob("c0*.jsonl"))[0]
    data = journal.read_bytes()
    assert data.count(b'"question":"') >= 1
    journal.write_bytes(data.replace(b'"question":"', b'"question":"\xff', 1))
    done = run_conclave("index", "rebuild", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "12 consultation(s)" in done.stderr, done.stderr
