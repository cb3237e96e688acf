"""``conclave browse``: a real Datasette on 127.0.0.1 serving the index with conclave's metadata."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest
import yaml

from conclave.store.recorder import Recorder
from conclave.testing.synthetic_events import synthetic_events

CANNED = {"costliest_consultations", "dissent_by_agent", "early_terminations_by_threshold", "provider_failures",
          "savings_by_filter_limits", "spending_per_day", "spending_per_provider", "confidence_distribution",
          "early_termination_savings", "filter_savings", "recent_consultations", "debate_quality",
          "verification_pass_rate", "exit_reasons", "groupthink"}
# over evaluation runs (this index has none; tests/test_eval_cli.py serves one that does)
EVAL_CANNED = {"eval_runs_overview", "eval_accuracy_vs_cost", "eval_sweep_by_value", "eval_lost_answers"}
# queries that take a parameter (a consultation id): tests/test_followup.py asks `thread` of a real thread
PARAMETERISED = {"thread"}


def metadata() -> dict[str, Any]:
    text = (resources.files("conclave.store") / "datasette_metadata.yaml").read_text()
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``conclave browse --port 0 --no-open`` over 30 recorded consultations; yields the database URL."""
    home = tmp_path_factory.mktemp("home")
    recorder = Recorder(home)
    for n in range(30):
        for event in synthetic_events(n):
            recorder(event)
    recorder.close()
    server = subprocess.Popen([sys.executable, "-m", "conclave", "browse", "--port", "0", "--no-open"],
                              env={"CONCLAVE_HOME": str(home), "PATH": "/usr/bin:/bin"},
                              stderr=subprocess.PIPE, text=True)
    try:
        url = None
        deadline = time.monotonic() + 60
        assert server.stderr is not None
        while url is None and time.monotonic() < deadline:
            line = server.stderr.readline()
            if not line and server.poll() is not None:
                pytest.fail(f"conclave browse exited with {server.returncode}")
            match = re.search(r"at (http://127\.0\.0\.1:\d+/index) ", line)
            url = match.group(1) if match else None
        assert url is not None, "no URL on stderr"
        yield url
    finally:
        server.terminate()
        server.wait(timeout=20)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def test_serves_table_rows_as_an_array(served: str) -> None:
    rows = get(f"{served}/consultations.json?_shape=array&_size=5")
    assert isinstance(rows, list) and len(rows) == 5
    assert {"id", "question", "total_cost", "confidence"} <= set(rows[0])
    # metadata sort order: newest first
    assert rows[0]["started_at"] > rows[-1]["started_at"]


def test_facets_come_from_the_metadata(served: str) -> None:
    data = get(f"{served}/consultations.json?_size=0")
    assert {"mode", "status"} <= set(data["facet_results"])  # the facets an index counts (m004, m032)
    modes = {r["value"]: r["count"] for r in data["facet_results"]["mode"]["results"]}
    assert modes and sum(modes.values()) == data["filtered_table_rows_count"]


def test_every_canned_query_answers(served: str) -> None:
    queries = metadata()["databases"]["index"]["queries"]
    assert set(queries) == CANNED | EVAL_CANNED | PARAMETERISED
    for name in set(queries) - PARAMETERISED:
        rows = get(f"{served}/{name}.json?_shape=array")
        assert isinstance(rows, list) and (rows or name in EVAL_CANNED), name
    costliest = get(f"{served}/costliest_consultations.json?_shape=array")
    assert [r["cost"] for r in costliest] == sorted((r["cost"] for r in costliest), reverse=True)


def test_titles_and_column_help_are_served(served: str) -> None:
    served_metadata = get(served.rsplit("/", 1)[0] + "/-/metadata.json")
    tables = served_metadata["databases"]["index"]["tables"]
    assert tables["calls"]["title"] == "Provider calls"
    assert "hedge" in tables["calls"]["columns"]


def test_search_finds_questions(served: str) -> None:
    rows = get(f"{served}/consultations.json?_search=kubernetes&_shape=array")
    assert rows and all("Kubernetes" in r["question"] for r in rows)
