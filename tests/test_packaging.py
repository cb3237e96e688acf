"""A non-editable wheel installed into a fresh venv finds conf/, schemas/ and the built-in plugins."""

from __future__ import annotations

import email.parser
import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


#: the distribution's name (the index's ``conclave``, ``conclave-cli`` and ``conclave-llm`` are other projects)
DISTRIBUTION = "conclave-council"


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conclave's wheel, built from this checkout."""
    work = tmp_path_factory.mktemp("wheel")
    dist = work / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(REPO)],
         cwd=work)
    [wheel] = dist.glob(f"{DISTRIBUTION.replace('-', '_')}-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed_wheel(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conclave's wheel installed (with its dependencies) into a brand-new venv; return that venv."""
    wheel = built_wheel
    work = tmp_path_factory.mktemp("venv")
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    _run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=work)
    return env_dir


@pytest.mark.slow
def test_the_wheel_is_named_conclave_council_and_carries_the_mit_license(built_wheel: Path) -> None:
    """The distribution name collides with no project on the public index; the import package and the command
    stay ``conclave``; the LICENSE file ships in the wheel and matches the declared license."""
    with zipfile.ZipFile(built_wheel) as wheel:
        names = wheel.namelist()
        [metadata_name] = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(wheel.read(metadata_name).decode())
        [license_name] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        license_text = wheel.read(license_name).decode()
        entry_points = wheel.read(metadata_name.replace("METADATA", "entry_points.txt")).decode()
    assert metadata["Name"] == DISTRIBUTION
    assert metadata["License-Expression"] == "MIT" and metadata["License-File"] == "LICENSE"
    assert license_text.startswith("MIT License") and "conclave contributors" in license_text
    assert license_text == (REPO / "LICENSE").read_text()
    assert "conclave/__init__.py" in names and "conclave = conclave.cli.main:run" in entry_points


def _outside_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONCLAVE_", "PYTHON"))}
    env["CONCLAVE_HOME"] = str(home)
    return env


@pytest.mark.slow
def test_wheel_ships_config_schemas_and_plugins(installed_wheel: Path, tmp_path: Path) -> None:
    env = _outside_env(tmp_path)
    conclave = str(installed_wheel / "bin" / "conclave")
    where = _run([str(installed_wheel / "bin" / "python"), "-c",
                  "import conclave, conclave.conf, conclave.schemas, conclave_plugins, conclave_plugins.local.model;"
                  "print(conclave.__file__); print(conclave.conf.__file__)"], cwd=tmp_path, env=env)
    assert all(str(installed_wheel) in line for line in where.splitlines()), where
    assert str(REPO) not in where

    composed = yaml.safe_load(_run([conclave, "--cfg", "job", "mode=explore"], cwd=tmp_path, env=env))
    assert composed["mode"]["strategy"] == "explore"
    assert composed["personas"]["security"]["name"] == "Security Expert"
    assert composed["providers"]["grok"]["base_url"] == "https://api.x.ai/v1"

    plugins = json.loads(_run([conclave, "plugins", "--json"], cwd=tmp_path, env=env))
    assert {"openai", "anthropic", "gemini", "strategies", "filters", "progress", "local"} <= {
        p["name"] for p in plugins
    }

    schemas = _run([conclave, "schemas", "list"], cwd=tmp_path, env=env)
    for name in ("independent", "synthesis", "cross_exam", "verdict", "verdict_explore"):
        assert name in schemas
    assert list(tmp_path.glob("outputs")) == []

    # prices and tiers are package data (conclave/data/), read from the installed wheel, not from this checkout
    data = _run([str(installed_wheel / "bin" / "python"), "-c",
                 "from importlib import resources; from conclave.providers.pricing import PriceTable;"
                 "from conclave.providers.tiers import Tiers;"
                 "print(resources.files('conclave').joinpath('data', 'tiers.yaml'));"
                 "print(PriceTable.load().price('openai', 'gpt-4o-mini').input); print(len(Tiers.load().tiers))"],
                cwd=tmp_path, env=env)
    where_data, mini_input, tiers = data.splitlines()
    assert str(installed_wheel) in where_data and str(REPO) not in where_data
    assert float(mini_input) > 0 and int(tiers) >= 2


def test_every_source_package_is_listed_for_the_wheel() -> None:
    """pyproject lists packages explicitly (conf/, schemas/, plugins/ are remapped); a forgotten one — in conclave/
    or a plugin package such as plugins/local/ — would be missing from the wheel while editable installs work."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in (REPO / "conclave").rglob("__init__.py")
    }
    on_disk |= {
        ".".join(("conclave_plugins", *init.parent.relative_to(REPO / "plugins").parts))
        for init in (REPO / "plugins").rglob("__init__.py")
    }
    on_disk |= {"conclave.conf", "conclave.schemas"}
    assert on_disk == listed


def test_help_lists_config_groups_but_not_the_price_data(tmp_path: Path) -> None:
    """tiers.yaml and pricing/ are data, not config groups: Hydra's search path no longer holds them."""
    env = {**os.environ, "CONCLAVE_HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "conclave", "--help"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "agents" in proc.stdout and "persona" in proc.stdout
    assert "pricing" not in proc.stdout and "tiers" not in proc.stdout
    assert not (REPO / "conf" / "pricing").exists() and not (REPO / "conf" / "tiers.yaml").exists()
