"""A real out-of-tree plugin package, installed with pip, contributes a provider, a strategy, a filter and Hydra
config, all selectable from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_helpers import run_conclave

PLUGIN_SRC = Path(__file__).parent / "plugins" / "conclave_example_plugin"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pip-install the example plugin (a wheel built from its pyproject) into its own directory."""
    site = tmp_path_factory.mktemp("plugin-site")
    build = tmp_path_factory.mktemp("plugin-build")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site),
         str(PLUGIN_SRC)],
        capture_output=True, text=True, cwd=build, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert list(site.glob("conclave_example_plugin-0.3.0.dist-info"))
    return site


def _with_plugin(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(site)}


def test_plugin_is_listed_with_version_hooks_and_contributions(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_conclave("plugins", "--json", home=tmp_path, env=_with_plugin(plugin_site))
    assert proc.returncode == 0, proc.stderr
    example = {p["name"]: p for p in json.loads(proc.stdout)}["example"]
    assert example["version"] == "0.3.0"
    assert example["distribution"] == "conclave-example-plugin"
    assert example["hooks"] == ["register_config_paths", "register_filters", "register_price_sheets",
                                "register_providers", "register_strategies"]
    assert example["registered"] == {
        "providers": ["echo"], "strategies": ["devil", "gauntlet"], "filters": ["keep_all"],
        "config_paths": ["pkg://conclave_example_plugin.conf"], "price_sheets": ["echo"],
    }


def test_plugin_config_joins_the_groups(plugin_site: Path, tmp_path: Path) -> None:
    help_text = run_conclave("--help", home=tmp_path, env=_with_plugin(plugin_site)).stdout
    assert "mode: adversarial, answer, converge, devil, devils_advocate, explore, gauntlet" in help_text
    assert "agents: anthropic_only, default, echo_panel, gemini_only," in help_text
    proc = run_conclave("--cfg", "job", "mode=devil", "agents=echo_panel", "filtering.filter=keep_all",
                        home=tmp_path, env=_with_plugin(plugin_site))
    assert proc.returncode == 0, proc.stderr
    composed = yaml.safe_load(proc.stdout)
    assert composed["mode"] == {"strategy": "devil", "options": {"ferocity": 2}}
    assert composed["judge"] == {"provider": "echo", "model": "echo-judge"}
    assert {a["provider"] for a in composed["agents"].values()} == {"echo"}


def test_plugin_options_are_validated_like_the_rest(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_conclave("Q?", "mode=devil", "agents=echo_panel", "mode.options.ferocity=high",
                        home=tmp_path, env=_with_plugin(plugin_site))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "conclave: mode.options.ferocity: input should be a valid integer, unable to parse string as an integer "
        "(got 'high')"
    ]


def test_without_the_plugin_its_names_are_rejected(tmp_path: Path) -> None:
    proc = run_conclave("Q?", "mode=devil", "agents=default", home=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "conclave: mode: 'devil' is not one of: adversarial, answer, converge, devils_advocate, explore"
    proc = run_conclave("Q?", "filtering.filter=keep_all", "agents=default", home=tmp_path)
    assert proc.returncode == 2
    assert "filtering.filter: 'keep_all' is not a registered filter; allowed: top_n" in proc.stderr


# The echo panel agrees blindly by construction (every confidence 1, no source): the groupthink detectors would
# insert an objection round, so these runs keep them in shadow and the plan under test stays the strategy's own.
SHADOW = "quality.stage=shadow"


def test_consultation_runs_on_the_plugin_provider_strategy_and_filter(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_conclave(
        "Should the example plugin win?", "mode=devil", "agents=echo_panel", "filtering.filter=keep_all",
        "output.format=json", "cost.auto_approve=true", SHADOW, home=tmp_path, env=_with_plugin(plugin_site),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["strategy"] == "devil"
    assert result["status"] == "complete"
    assert result["completed_rounds"] == 4
    assert {a["actual_provider"] for a in result["agents"]} == {"echo"}
    assert result["prompt_versions"]["round_1"].startswith("devil/round1@v1")
    assert result["verdict"]["recommendation"]


def test_a_plugin_strategy_with_a_round_type_of_its_own_runs_from_the_cli(plugin_site: Path, tmp_path: Path) -> None:
    proc = run_conclave(
        "Should the example plugin win?", "mode=gauntlet", "agents=echo_panel", "output.format=json",
        "cost.auto_approve=true", SHADOW, home=tmp_path, env=_with_plugin(plugin_site),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "complete" and result["completed_rounds"] == 5
    assert [t["to"] for t in result["transitions"]][3:6] == ["SYNTHESIS", "REBUTTAL", "CROSS_EXAM"]
    assert result["prompt_versions"]["rebuttal"].startswith("gauntlet/rebuttal@v1")
