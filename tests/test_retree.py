"""tools/retree.py, the scripted tree rename, on a miniature tree that others edited after the script was written."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text), encoding="utf-8")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def _retree(root: Path) -> str:
    done = subprocess.run([sys.executable, str(REPO / "tools" / "retree.py")], cwd=root, capture_output=True,
                          text=True, check=True)
    return done.stdout


def test_retree_moves_modules_and_rewrites_old_references_in_files_it_has_never_seen(tmp_path: Path) -> None:
    # A miniature conclave with old paths, plus a module "someone else added" that imports them every way there is.
    _write(tmp_path, {
        "conclave/__init__.py": "",
        "conclave/config.py": "class Settings:\n    pass\n",
        "conclave/task.py": "VALUE = 1\n",
        "conclave/cli.py": """\
            from . import task
            from .config import Settings

            SUBCOMMANDS = {"stats": "conclave.commands.stats"}


            def run() -> int:
                return task.VALUE if Settings else 0
            """,
        "conclave/commands/__init__.py": "",
        "conclave/commands/stats.py": "from ..store.stats import figures\n",
        "conclave/store/__init__.py": "",
        "conclave/store/stats.py": "def figures() -> int:\n    return 2\n",
        "conclave/engine/__init__.py": "",
        "conclave/engine/cost.py": "def estimate() -> int:\n    return 3\n",
        "conclave/engine/runner.py": """\
            from ..config import Settings
            from .cost import estimate

            RESULT = (Settings, estimate())
            """,
        "conclave/engine/added_later.py": """\
            from conclave import cli
            from conclave.engine import cost, runner
            from conclave.store.stats import figures

            TARGET = "conclave.engine.runner.RESULT"
            TOTAL = cli.run() + cost.estimate() + figures() + len(runner.RESULT)
            """,
        "docs/page.md": "Start at `conclave/engine/runner.py` and [settings](../conclave/config.py).\n",
        "pyproject.toml": """\
            [project.scripts]
            conclave = "conclave.cli:run"

            [tool.setuptools]
            packages = [
                "conclave",
                "conclave.commands",
                "conclave.engine",
                "conclave.store",
            ]
            """,
    })
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")

    _retree(tmp_path)

    for old in ("conclave/cli.py", "conclave/config.py", "conclave/engine/runner.py", "conclave/commands"):
        assert not (tmp_path / old).exists()
    added = (tmp_path / "conclave/engine/added_later.py").read_text()
    assert "from conclave.cli import main as cli" in added
    assert "from conclave.engine import run as runner" in added
    assert "from conclave.engine.cost import estimate as cost" in added
    assert "from conclave.store.period_stats import figures" in added
    assert '"conclave.engine.run.RESULT"' in added
    assert '"conclave.cli.commands.stats"' in (tmp_path / "conclave/cli/main.py").read_text()
    assert (tmp_path / "docs/page.md").read_text() == (
        "Start at `conclave/engine/run.py` and [settings](../conclave/config/settings.py).\n")
    pyproject = (tmp_path / "pyproject.toml").read_text()
    assert 'conclave = "conclave.cli.main:run"' in pyproject
    assert '"conclave.cli.commands",' in pyproject and '"conclave.commands",' not in pyproject

    # the moved tree imports and runs: relative imports were re-resolved from each file's new place
    check = "import conclave.engine.added_later as m, conclave.cli.commands.stats; print(m.TOTAL)"
    ran = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True)
    assert (ran.returncode, ran.stdout.strip()) == (0, "8"), ran.stderr

    # a second run changes nothing
    _git(tmp_path, "add", "-A")
    assert _retree(tmp_path).splitlines()[-1] == "0 files moved, 0 Python files rewritten"
    assert _git(tmp_path, "diff", "--name-only") == ""
