"""``conclave show``, ``output.format=html`` and sweep labels, on consultations the engine ran against the fake
provider server (CLI tests run ``python -m conclave`` as a subprocess)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import pytest
from cli_helpers import run_conclave
from views_support import Debates

from conclave.store.journal import read_records
from conclave.store.paths import StoreLayout
from conclave.testing.fake_server import FakeProviderServer


def test_show_reprints_the_whole_debate(debates: Debates) -> None:
    others = [p.stem for p in (debates.home / "journal").glob("*.jsonl") if p.stem != debates.converge]
    prefix = next(debates.converge[:n] for n in range(3, len(debates.converge) + 1)
                  if not any(o.startswith(debates.converge[:n]) for o in others))  # ids share their time prefix
    done = run_conclave("show", prefix, home=debates.home)
    assert done.returncode == 0, done.stderr
    headings = [line for line in done.stdout.splitlines() if line.startswith("## ")]
    assert headings == ["## Verdict (confidence 82%)", "## Dissent", "## Realized panel",
                        "## Round 1 · Independent positions", "## Round 2 · Synthesis",
                        "## Round 3 · Cross-examination", "## How the agents moved (round 1 → round 3)",
                        "## Debate quality", "## Cost"]
    assert "| Round | Type | Calls |" in done.stdout  # cost by round, from the journal
    assert re.search(r"\| openai \| 6 \| 1 \| 0 \| 1 \|", done.stdout)  # 6 calls, 1 failed, 1 retry


def test_show_one_round(debates: Debates) -> None:
    done = run_conclave("show", debates.converge, "--round", "2", home=debates.home)
    assert done.returncode == 0, done.stderr
    assert "## Round 2 · Synthesis" in done.stdout
    assert "## Round 1" not in done.stdout and "## Verdict" not in done.stdout
    assert "Auditability of every billing change comes first" in done.stdout


def test_show_one_round_as_json(debates: Debates) -> None:
    done = run_conclave("show", debates.converge, "--round", "3", "--format", "json", home=debates.home)
    data = json.loads(done.stdout)
    assert data["round_number"] == 3
    assert sorted(a["schema"] for a in data["artifacts"]) == ["cross_exam", *["cross_exam_reply"] * 3]


def test_show_json_is_the_recorded_result(debates: Debates) -> None:
    done = run_conclave("show", debates.explore, "--format", "json", home=debates.home)
    records = read_records(StoreLayout(debates.home).journal_path(debates.explore))
    result = next(r for r in records if r["type"] == "consultation:completed")["data"]["result"]
    data = json.loads(done.stdout)
    assert data["@type"] == "conclave:Consultation"
    assert {k: v for k, v in data.items() if not k.startswith("@")} == result


def test_show_html_is_one_self_contained_file(debates: Debates, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    done = run_conclave("show", debates.converge, "--format", "html", "-o", str(out), home=debates.home)
    assert done.returncode == 0 and done.stdout == "" and str(out) in done.stderr
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page and "Round 3 · Cross-examination" in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing to fetch
    assert "<script" not in page and "<link" not in page


@pytest.mark.parametrize(("args", "message"), [
    (["--format", "yaml"], "conclave show: --format: 'yaml' is not one of markdown, json, html"),
    (["--round", "7"], "conclave show: --round: 7 is not a round of"),
])
def test_show_bad_input_is_one_line_and_exit_2(debates: Debates, args: list[str], message: str) -> None:
    done = run_conclave("show", debates.converge, *args, home=debates.home)
    assert done.returncode == 2
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_show_unknown_id_is_a_usage_error(debates: Debates) -> None:
    done = run_conclave("show", "c-nothere", home=debates.home)
    assert done.returncode == 2 and "no consultation 'c-nothere'" in done.stderr


def test_show_an_interrupted_consultation_says_how_to_resume(debates: Debates, tmp_path: Path) -> None:
    home = tmp_path / "home"
    journal = StoreLayout(home).journal_path(debates.converge)
    journal.parent.mkdir(parents=True)
    lines = StoreLayout(debates.home).journal_path(debates.converge).read_text().splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    cut = next(i for i, r in enumerate(records) if r["type"] == "round:started" and r["data"]["round_number"] == 3)
    journal.write_text("".join(lines[:cut]))
    done = run_conclave("show", debates.converge, home=home)
    assert done.returncode == 0, done.stderr
    assert "⏸ **Interrupted.**" in done.stdout and f"conclave resume {debates.converge}" in done.stdout
    assert "## Round 2 · Synthesis" in done.stdout and "## Round 3" not in done.stdout


async def _consult(fake: FakeProviderServer, home: Path, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(home), CONCLAVE_PROGRESS="0", CONCLAVE_SWEEP_DIR=str(home / "sweeps"))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", *args, "cost.auto_approve=true", *fake.overrides(),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=str(home), env=env)
    out, err = await asyncio.wait_for(process.communicate(), timeout=180)
    return process.returncode or 0, out.decode(), err.decode()


async def test_output_format_html_prints_one_document(fake_provider_server: FakeProviderServer,
                                                      conclave_env: Path) -> None:
    code, out, err = await _consult(fake_provider_server, conclave_env, "Is HTML ok?", "output.format=html")
    assert code == 0, err
    assert out.startswith("<!DOCTYPE html>") and out.rstrip().endswith("</html>") and out.count("<html") == 1
    assert "Round 1 · Independent positions" in out and "| Round |" not in out
    assert ">Round</th><th>Type</th>" in out  # cost by round: the CLI found the journal the run just wrote


async def test_a_sweep_labels_each_result_with_its_overrides(fake_provider_server: FakeProviderServer,
                                                            conclave_env: Path) -> None:
    code, out, err = await _consult(fake_provider_server, conclave_env, "-m", "Label me?", "rounds=1,2")
    assert code == 0, err
    labels = re.findall(r"^\*\*Sweep run:\*\* (.*)$", out, flags=re.M)
    assert labels == ["rounds=1", "rounds=2"]
    code, out, err = await _consult(fake_provider_server, conclave_env, "-m", "Label me?", "rounds=1,2",
                                    "output.format=json")
    decoder, docs, pos = json.JSONDecoder(), [], 0
    while pos < len(out.rstrip()):
        while out[pos].isspace():
            pos += 1
        doc, pos = decoder.raw_decode(out, pos)
        docs.append(doc)
    assert [d["sweep"] for d in docs] == [{"rounds": "1"}, {"rounds": "2"}]


async def test_a_single_run_has_no_sweep_label(fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    code, out, err = await _consult(fake_provider_server, conclave_env, "Alone?", "rounds=1", "output.format=json")
    assert code == 0, err
    assert "sweep" not in json.loads(out)
