"""What a conclave process remembers between runs to reach its first request sooner is never stale: the entry-point
listing follows the distributions on ``sys.path``, a parsed data file follows the file."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
from pathlib import Path

import pytest

from conclave import startup_cache


def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget this process's listing, as a new process would."""
    monkeypatch.setattr(startup_cache, "_listing", None)


def _plugin_dist(site: Path, entry_points: str) -> Path:
    info = site / "conclave_fake_plugin-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: conclave-fake-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    return info


def test_the_remembered_listing_is_what_importlib_metadata_finds(conclave_env: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh(monkeypatch)
    scanned = startup_cache.entry_points("conclave")
    expected = [(ep.name, ep.value, ep.dist.metadata["Name"] if ep.dist else None, ep.dist.version if ep.dist else None)
                for ep in importlib.metadata.entry_points(group="conclave")]
    assert [tuple(ep) for ep in scanned] == expected and expected
    _fresh(monkeypatch)
    monkeypatch.setattr(startup_cache, "_scan", lambda: pytest.fail("scanned again"))
    assert startup_cache.entry_points("conclave") == scanned  # read back, not scanned
    assert startup_cache.entry_points("conclave")[0].load() is not None


def test_a_distribution_added_or_changed_on_the_path_is_seen(conclave_env: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    _fresh(monkeypatch)
    assert "fake" not in [ep.name for ep in startup_cache.entry_points("conclave")]
    info = _plugin_dist(site, "[conclave]\nfake = conclave_fake_plugin\n")  # installed: a new entry in site
    _fresh(monkeypatch)
    assert [(ep.name, ep.value, ep.distribution, ep.version) for ep in startup_cache.entry_points("conclave")
            if ep.name.startswith("fake")] == [("fake", "conclave_fake_plugin", "conclave-fake-plugin", "1.0")]
    stamp = os.stat(site).st_mtime_ns
    (info / "entry_points.txt").write_text("[conclave]\nfake_renamed = conclave_fake_plugin.plugin:hooks\n")
    assert os.stat(site).st_mtime_ns == stamp  # edited in place: only the declaring file tells
    _fresh(monkeypatch)
    assert [ep.name for ep in startup_cache.entry_points("conclave") if ep.name.startswith("fake")] == ["fake_renamed"]


def test_a_parsed_file_is_parsed_again_only_when_it_changes(conclave_env: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "sheet.txt"
    path.write_text("a")
    calls: list[str] = []

    def parse(text: str) -> dict[str, object]:
        calls.append(text)
        return {"text": text, "taken": dt.date(2025, 6, 1)}

    first = startup_cache.parsed_file(path, parse)
    monkeypatch.setattr(startup_cache, "_files", None)  # a new process: read from the home's cache
    assert startup_cache.parsed_file(path, parse) == first == {"text": "a", "taken": dt.date(2025, 6, 1)}
    assert calls == ["a"]
    path.write_text("bb")
    assert startup_cache.parsed_file(path, parse)["text"] == "bb" and calls == ["a", "bb"]


def test_a_value_json_would_change_is_never_stored(conclave_env: Path, tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    path.write_text("x")
    calls: list[str] = []

    def parse(text: str) -> dict[int, str]:
        calls.append(text)
        return {1: text}  # JSON would read the key back as "1"

    assert startup_cache.parsed_file(path, parse) == {1: "x"}
    assert startup_cache.parsed_file(path, parse) == {1: "x"} and calls == ["x", "x"]


PYDANTIC_IN_A_FRESH_PROCESS = """
import json, sys
from conclave.startup_cache import skip_pydantic_plugin_scan
skip_pydantic_plugin_scan()
import pydantic

class Model(pydantic.BaseModel):
    n: int

loader = sys.modules["pydantic.plugin._loader"]
before = "importlib.metadata" in sys.modules
print(json.dumps({"metadata_imported": before, "plugins": list(loader.get_plugins()),
                  "validated": Model.model_validate({"n": "3"}).n,
                  "group": loader.PYDANTIC_ENTRY_POINT_GROUP,
                  "delegated": loader.entry_points.__module__}))
"""


def test_pydantic_builds_models_without_importing_its_plugin_scan_when_no_plugin_is_installed(
        conclave_env: Path) -> None:
    import json
    import subprocess
    import sys

    assert not importlib.metadata.entry_points(group="pydantic")  # else the scan would have something to find
    runs = [json.loads(subprocess.run(
        [sys.executable, "-c", PYDANTIC_IN_A_FRESH_PROCESS], capture_output=True, text=True, check=True,
        env={**os.environ, "CONCLAVE_HOME": str(conclave_env)}).stdout) for _ in range(2)]
    assert runs[0]["metadata_imported"]  # the first run scans, and remembers that no plugin is installed
    seen = runs[1]
    # importlib.metadata (with the email package) is what the real loader imports: ~15 ms of every start
    assert seen == {"metadata_imported": False, "plugins": [], "validated": 3, "group": "pydantic",
                    "delegated": "importlib.metadata"}  # a name the stand-in lacks comes from the real module
