"""conclave's Datasette plugin on consultations the engine ran against the fake provider server: every canned query
agrees with the journal, the consultation page tells the debate, cells render artifacts, and the index opens on
what a user wants. Datasette runs in-process (``Datasette(...).client``) with the plugin loaded from its entry
point, exactly as a plain ``datasette index.db`` loads it."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from views_support import VERDICT, Debates

from conclave.store.journal import read_records
from conclave.store.paths import StoreLayout


@pytest.fixture(scope="module")
def journals(debates: Debates) -> dict[str, list[dict[str, Any]]]:
    layout = StoreLayout(debates.home)
    return {cid: read_records(layout.journal_path(cid)) for cid in layout.journal_ids()}


def datasette_for(home: Path) -> Any:
    from datasette.app import Datasette

    return Datasette([str(StoreLayout(home).index_path)])


def get(home: Path, path: str) -> Any:
    async def fetch() -> Any:
        return await datasette_for(home).client.get(path)

    return asyncio.run(fetch())


def rows(home: Path, query: str) -> list[dict[str, Any]]:
    response = get(home, f"/index/{query}.json?_shape=array")
    assert response.status_code == 200, response.text
    result: list[dict[str, Any]] = response.json()
    return result


def of(records: list[dict[str, Any]], type_: str) -> list[Mapping[str, Any]]:
    return [r["data"] for r in records if r["type"] == type_]


def final(records: list[dict[str, Any]]) -> Mapping[str, Any]:
    return of(records, "consultation:completed")[-1]["result"]


def started_day(records: list[dict[str, Any]]) -> str:
    return str(final(records)["created_at"])[:10]


# ------------------------------------------------------------------------------------------------ canned queries
# One check per canned query, each recomputing the answer from the journals (the source of truth).


def check_dissent_by_agent(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    expected: dict[str, Counter[str]] = defaultdict(Counter)
    for records in journals.values():
        for d in final(records)["dissent"]:
            expected[d["agent"]][d["severity"]] += 1
    got = {r["agent"]: r for r in rows(home, "dissent_by_agent")}
    assert set(got) == set(expected)
    for agent, counts in expected.items():
        assert (got[agent]["high"], got[agent]["medium"], got[agent]["low"]) == (
            counts["high"], counts["medium"], counts["low"])
        assert got[agent]["dissents"] == sum(counts.values())
    assert sum(r["high"] + r["medium"] + r["low"] for r in got.values()) == sum(r["dissents"] for r in got.values())


def _attempt_cost(records: list[dict[str, Any]]) -> float:
    return sum(a["cost"] or 0 for a in of(records, "provider:attempt"))


def check_costliest_consultations(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    got = rows(home, "costliest_consultations")
    expected = sorted(journals, key=lambda c: _attempt_cost(journals[c]), reverse=True)
    assert [r["id"] for r in got] == expected
    for r in got:
        assert r["cost"] == pytest.approx(_attempt_cost(journals[r["id"]]), abs=1e-4)
        assert r["calls"] == len(of(journals[r["id"]], "provider:attempt"))


def check_early_terminations_by_threshold(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    decided = [d for records in journals.values() for d in of(records, "early_termination:decided")]
    got = rows(home, "early_terminations_by_threshold")
    assert sum(r["offered"] for r in got) == sum(bool(d["offered"]) for d in decided)
    assert sum(r["accepted"] for r in got) == sum(bool(d["accepted"]) for d in decided) == 1
    assert sum(r["cost_saved"] for r in got) == pytest.approx(
        sum(d["estimated_cost_saved"] for d in decided if d["accepted"]), abs=1e-4)


def check_provider_failures(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    failed = [a for records in journals.values() for a in of(records, "provider:attempt")
              if a["outcome"] not in ("ok", "cancelled")]
    got = rows(home, "provider_failures")
    assert [(r["provider"], r["model"], r["outcome"], r["status"], r["failures"]) for r in got] == [
        ("openai", "gpt-4o", "rate_limited", 429, 1)]
    assert len(failed) == 1


def _filter_saved(journals: dict[str, list[dict[str, Any]]]) -> dict[tuple[str, int], int]:
    saved: dict[tuple[str, int], int] = defaultdict(int)
    for records in journals.values():
        for f in of(records, "filter:applied"):
            saved[(f["filter"], f["round_number"])] += f["tokens_before"] - f["tokens_after"]
    return saved


def check_savings_by_filter_limits(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    got = rows(home, "savings_by_filter_limits")
    total: dict[tuple[str, int], int] = defaultdict(int)
    for r in got:
        total[(r["filter"], r["round_number"])] += r["tokens_saved"]
    assert dict(total) == dict(_filter_saved(journals))
    assert any(r["tokens_saved"] > 0 for r in got)  # the five consensus points were cut to three


def check_filter_savings(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    got = {(r["filter"], r["round_number"]): r["tokens_saved"] for r in rows(home, "filter_savings")}
    assert got == dict(_filter_saved(journals))


def check_spending_per_day(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    expected: dict[str, float] = defaultdict(float)
    for records in journals.values():
        expected[started_day(records)] += _attempt_cost(records)
    got = {r["day"]: r["cost"] for r in rows(home, "spending_per_day")}
    assert got.keys() == expected.keys()
    for day, cost in expected.items():
        assert got[day] == pytest.approx(cost, abs=1e-6)


def check_spending_per_provider(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    cost: dict[str, float] = defaultdict(float)
    calls: Counter[str] = Counter()
    for records in journals.values():
        for a in of(records, "provider:attempt"):
            cost[a["provider"]] += a["cost"] or 0
            calls[a["provider"]] += 1
    got = {r["provider"]: r for r in rows(home, "spending_per_provider")}
    assert set(got) == {"openai", "anthropic", "gemini"} == set(cost)
    for provider, r in got.items():
        assert r["calls"] == calls[provider] and r["cost"] == pytest.approx(cost[provider], abs=1e-6)
    assert got["openai"]["failed"] == 1


def check_confidence_distribution(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    expected = Counter(min(int(final(r)["confidence"] * 10), 9) / 10 for r in journals.values())
    got = {r["bucket"]: r["consultations"] for r in rows(home, "confidence_distribution")}
    assert got == dict(expected)


def check_early_termination_savings(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    accepted = [(started_day(r), d) for r in journals.values() for d in of(r, "early_termination:decided")
                if d["accepted"]]
    got = rows(home, "early_termination_savings")
    assert [(r["day"], r["stopped_early"]) for r in got] == [(accepted[0][0], 1)]
    assert got[0]["cost_saved"] == pytest.approx(accepted[0][1]["estimated_cost_saved"], abs=1e-6)
    assert got[0]["rounds_skipped"] == accepted[0][1]["rounds_skipped"] == 2


def check_recent_consultations(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    got = rows(home, "recent_consultations")
    expected = sorted(journals, key=lambda c: final(journals[c])["created_at"], reverse=True)
    assert [r["id"] for r in got] == expected
    assert {r["id"]: r["confidence"] for r in got} == {c: final(r)["confidence"] for c, r in journals.items()}


def check_debate_quality(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    got = {r["id"]: r for r in rows(home, "debate_quality")}
    expected = {c: (final(r).get("quality") or {}).get("metrics") or {} for c, r in journals.items()}
    with_figures = {c for c, m in expected.items() if m.get("label_adoption") is not None}
    assert with_figures and with_figures <= set(got)
    for cid in with_figures:
        figures = expected[cid]
        assert got[cid]["label_adoption"] == pytest.approx(figures["label_adoption"])
        assert got[cid]["ungrounded_statements"] == figures.get("ungrounded_statements")


def check_verification_pass_rate(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    answered: Counter[str] = Counter()
    passed: Counter[str] = Counter()
    for records in journals.values():
        for d in of(records, "quality:checks"):
            for v in d.get("verification") or []:
                if v.get("passed") is not None:
                    answered[v["question_id"]] += 1
                    passed[v["question_id"]] += bool(v["passed"])
    got_answered: Counter[str] = Counter()
    got_passed: Counter[str] = Counter()
    for r in rows(home, "verification_pass_rate"):
        got_answered[r["question_id"]] += r["answered"]
        got_passed[r["question_id"]] += r["passed"]
    assert answered and got_answered == answered and got_passed == passed


def check_exit_reasons(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    ended = [final(r).get("exit") or {} for r in journals.values()]
    expected = Counter(e["reason"] for e in ended if e.get("reason"))
    got = {r["exit_reason"]: r for r in rows(home, "exit_reasons")}
    assert expected and {k: r["consultations"] for k, r in got.items()} == dict(expected)
    for reason, r in got.items():
        played = [e["rounds_played"] for e in ended if e.get("reason") == reason]
        assert r["avg_rounds"] == pytest.approx(sum(played) / len(played), abs=0.01)
    sent = sum((final(r).get("context") or {}).get("tokens") or 0 for r in journals.values())
    assert sum(r["context_tokens"] or 0 for r in got.values()) == sent


def check_groupthink(home: Path, journals: dict[str, list[dict[str, Any]]]) -> None:
    got = {r["id"]: r for r in rows(home, "groupthink")}
    assert set(got) == set(journals)  # every consultation of these journals ran the detectors
    for cid, records in journals.items():
        fired = Counter(d["detector"] for d in of(records, "groupthink:check") if d["fired"])
        row = got[cid]
        assert (row["early_convergence"], row["stagnation"]) == (fired["early_convergence"], fired["stagnation"])
        assert row["objection_rounds"] == len(of(records, "groupthink:objection"))
        assert row["escalated"] == int(bool(final(records).get("escalated")))
        assert row["stage"] == final(records)["quality"]["groupthink"]["stage"]


# over evaluation runs: checked against eval runs in tests/test_eval_cli.py (these journals hold none)
EVAL_QUERIES = {"eval_runs_overview", "eval_accuracy_vs_cost", "eval_sweep_by_value", "eval_lost_answers"}

# over a thread of follow-up questions: checked in tests/test_followup.py (these journals hold none)
FOLLOW_UP_QUERIES = {"thread"}

CHECKS = {name[len("check_"):]: fn for name, fn in dict(globals()).items() if name.startswith("check_")}


def test_every_canned_query_has_a_check() -> None:
    from conclave.datasette_plugin import _metadata_template

    assert set(_metadata_template()["databases"]["index"]["queries"]) == set(CHECKS) | EVAL_QUERIES | FOLLOW_UP_QUERIES


@pytest.mark.parametrize("query", sorted(CHECKS))
def test_canned_query_agrees_with_the_journal(query: str, debates: Debates,
                                              journals: dict[str, list[dict[str, Any]]]) -> None:
    CHECKS[query](debates.home, journals)


def test_dissent_by_agent_counts_the_schema_severities(debates: Debates,
                                                      journals: dict[str, list[dict[str, Any]]]) -> None:
    # the judge dissents as "Agent C" (medium) and "Agent A" (high); the index names the agents behind the labels
    name_of = {label: name for name, label in final(journals[debates.converge])["judge_labels"].items()}
    by_agent = {r["agent"]: r for r in rows(debates.home, "dissent_by_agent")}
    assert {d["severity"] for d in VERDICT["dissent"]} == {"medium", "high"}
    assert by_agent[name_of["Agent C"]]["medium"] == 1 and by_agent[name_of["Agent A"]]["high"] == 1


# ------------------------------------------------------------------------------------------------ pages


def test_consultation_page_reads_like_a_transcript(debates: Debates) -> None:
    response = get(debates.home, f"/-/conclave/{debates.converge}")
    assert response.status_code == 200
    page = response.text
    for heading in ("Verdict (confidence 82%)", "Dissent", "Realized panel", "Round 1 · Independent positions",
                    "Round 2 · Synthesis", "Round 3 · Cross-examination", "How the agents moved", "Cost"):
        assert f">{heading}" in page, heading
    assert page.index(">Dissent<") < page.index(">Realized panel<")  # dissent above the fold
    assert "Event-source the invoice aggregate first" in page
    assert "Auditability of every billing change comes first" in page  # the synthesis
    assert "A database trigger closes most of that gap" in page  # a rebuttal
    assert "anthropic/claude-sonnet-4-5" in page and re.search(r"converge/round1@v\d", page)  # models, prompt versions
    assert re.search(r"<td>openai</td><td class=\"cv-num\">\d+</td><td class=\"cv-num\">1</td>", page)  # a failure
    assert f'href="/-/conclave/{debates.converge}/journal.json"' in page
    assert "<script" not in page.split("<body", 1)[1].split("</footer>")[0].split('class="cv-report"', 1)[1]


def test_journal_link_serves_the_raw_records(debates: Debates, journals: dict[str, list[dict[str, Any]]]) -> None:
    response = get(debates.home, f"/-/conclave/{debates.converge}/journal.json")
    assert response.json() == journals[debates.converge]


def test_consultation_page_without_a_journal_is_rebuilt_from_the_index(debates: Debates, tmp_path: Path) -> None:
    index = tmp_path / "copy.db"
    index.write_bytes(StoreLayout(debates.home).index_path.read_bytes())

    async def fetch() -> Any:
        from datasette.app import Datasette

        return await Datasette([str(index)]).client.get(f"/-/conclave/{debates.converge}")

    page = asyncio.run(fetch()).text
    assert "rebuilt from the index tables, which keep each artifact's gist: the full texts are in the journal" in page
    assert "Round 2 · Synthesis" in page and "Event-source the invoice aggregate first" in page  # the verdict
    assert "A database trigger closes most of that gap" not in page  # a rebuttal's text is only in the journal


def test_unknown_consultation_is_a_404(debates: Debates) -> None:
    assert get(debates.home, "/-/conclave/c-nope").status_code == 404


def test_artifact_cells_are_rendered_not_blobs(debates: Debates) -> None:
    page = get(debates.home, f"/index/artifacts?consultation_id={debates.converge}&artifact_type=synthesis").text
    assert "5 consensus points, 1 tensions" in page
    assert "&#34;consensus_points&#34;" not in page and '"consensus_points"' not in page
    # the index keeps the gist; "Read it" opens the transcript, which reads the full text from the journal
    assert "Start with the invoice aggregate" not in page
    link = f'href="/-/conclave/{debates.converge}" title="The full text, from the journal">Read it</a>'
    assert link in page
    assert "Start with the invoice aggregate" in get(debates.home, f"/-/conclave/{debates.converge}").text


def test_consultations_table_opens_on_about_ten_columns(debates: Debates) -> None:
    page = get(debates.home, "/index/consultations").text
    columns = re.findall(r'<th [^>]*data-column="([a-z_]+)"', page)
    assert columns == ["id", "started_at", "status", "mode", "question", "confidence", "dissent_count",
                       "total_cost", "total_tokens", "duration_s"]
    every = re.findall(r'<th [^>]*data-column="([a-z_]+)"', get(debates.home, "/index/consultations?_all=1").text)
    assert len(every) > 40
    facets = get(debates.home, "/index/consultations.json?_size=0").json()["facet_results"]
    assert {"mode", "status", "judge_provider", "judge_model"} <= set(facets)


def test_internal_tables_are_hidden_and_consultations_come_first(debates: Debates) -> None:
    tables = {t["name"]: t for t in get(debates.home, "/index.json").json()["tables"]}
    for internal in ("_sqlite_migrations", "consultation_daily", "provider_daily", "consultations_fts"):
        assert tables[internal]["hidden"], internal
    assert not tables["consultations"]["hidden"]
    home_page = get(debates.home, "/").text
    panel = home_page.index('class="cv-panel')
    assert home_page.index('href="/index/consultations"', panel) < home_page.index("</div>", panel)


def test_sql_box_starts_on_a_useful_query(debates: Debates) -> None:
    page = get(debates.home, "/index").text
    assert "from consultations\\norder by started_at desc" in page


def test_dashboard_draws_every_chart_without_scripts(debates: Debates) -> None:
    page = get(debates.home, "/-/conclave").text
    for title in ("Spending per day", "Spending per provider", "Verdict confidence", "Early-termination savings",
                  "Tokens saved by artifact filtering"):
        assert f"<title>{title}" in page, title
    assert page.count("<rect ") >= 5
    for cid in (debates.converge, debates.early, debates.explore):
        assert f'href="/-/conclave/{cid}"' in page
    assert not re.search(r"<script[^>]+src=\"https?:", page)


def test_the_plugin_leaves_other_databases_alone(tmp_path: Path) -> None:
    import sqlite3

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("create table consultations (id text primary key, question text)")
    from datasette.app import Datasette

    async def fetch() -> tuple[Any, Any]:
        ds = Datasette([str(other)])
        return (await ds.client.get("/-/metadata.json")).json(), (await ds.client.get("/other")).text

    metadata, page = asyncio.run(fetch())
    assert metadata == {}
    assert "/-/conclave/conclave.css" not in page


def test_a_plain_datasette_process_loads_the_plugin(debates: Debates) -> None:
    index = str(StoreLayout(debates.home).index_path)
    out = subprocess.run([sys.executable, "-m", "datasette", index, "--get", "/-/plugins.json"],
                         capture_output=True, text=True, check=True).stdout
    # Datasette names an installed plugin by its distribution (conclave-council; an editable install made before
    # the rename may still say conclave): the one that provides the `datasette` entry point named conclave
    provider = next(ep for ep in entry_points(group="datasette") if ep.name == "conclave").dist
    assert provider is not None and provider.name in {p["name"] for p in json.loads(out)}
    page = subprocess.run([sys.executable, "-m", "datasette", index, "--get", f"/-/conclave/{debates.converge}"],
                          capture_output=True, text=True, check=True).stdout
    assert "Round 3 · Cross-examination" in page


def test_a_killed_consultation_reads_interrupted_and_a_written_one_running(tmp_path: Path) -> None:
    """The index calls both ``running``; the dashboard and the consultation page tell them apart as ``logs list``
    does: by whether a process still writes the journal."""
    from conclave import events as ev
    from conclave.store.heads import HeadsLog
    from conclave.store.journal import JournalWriter
    from conclave.store.recorder import Recorder
    from conclave.store.redact import Redactor
    from conclave.testing.synthetic_events import synthetic_events

    events = synthetic_events(3)
    recorder = Recorder(tmp_path)
    for event in events[: next(i for i, e in enumerate(events)
                               if e.type == ev.ROUND_STARTED and e.data["round_number"] == 2) + 1]:
        recorder(event)
    recorder.close()  # and no end record: the process was killed
    cid = events[0].consultation_id
    row = re.compile(rf'href="/-/conclave/{cid}">.*?</td>.*?</td><td>(\w+)</td>')

    def shown() -> tuple[str, bool]:
        found = row.search(get(tmp_path, "/-/conclave").text)
        assert found is not None
        return found.group(1), "Interrupted." in get(tmp_path, f"/-/conclave/{cid}").text

    assert shown() == ("interrupted", True)
    layout = StoreLayout(tmp_path)
    live = JournalWriter(layout.journal_path(cid), cid, HeadsLog(layout.heads_path), Redactor([]))
    try:
        assert shown() == ("running", False)
    finally:
        live.close()


def test_every_table_page_canned_query_and_the_dashboard_answer_200(debates: Debates) -> None:
    # Issue 28: the calls page sorted by started_at, a column it did not show, and answered 500 (KeyError) as soon
    # as it had a next page (a page of one row here, as a home of any size has more calls than one page holds).
    listing = get(debates.home, "/index.json").json()
    tables = [f"/index/{t['name']}" for t in listing["tables"] if not t["hidden"]]
    paths = ["/-/conclave", *tables, *(f"{table}?_size=1" for table in tables)]
    paths += [f"/index/{q['name']}" for q in listing["queries"]]
    assert "/index/calls" in paths and len(paths) > 30
    failed = {path: get(debates.home, path).status_code for path in paths}
    assert {path: status for path, status in failed.items() if status != 200} == {}


def test_calls_page_shows_the_column_it_sorts_by_newest_first(debates: Debates) -> None:
    page = get(debates.home, "/index/calls?_size=2")
    assert page.status_code == 200, page.text[-300:]
    columns = re.findall(r'<th [^>]*data-column="([a-z_]+)"', page.text)
    assert "started_at" in columns
    shown = get(debates.home, "/index/calls.json?_shape=array&_col=started_at").json()
    starts = [row["started_at"] for row in shown]
    assert starts and starts == sorted(starts, reverse=True)
