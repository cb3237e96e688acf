"""Rename conclave's module tree so it reads as the data path (issue 30, item 2).

Run from anywhere inside the repository, on a clean work tree:

    python tools/retree.py            # move the files and rewrite every reference
    python tools/retree.py --dry-run  # print what would move and which files would change

It is a script, not a patch: it works on a tree whose files others have since edited, or added with imports of the
old paths. Re-running it is safe: moved files are skipped and already-rewritten references are left alone.

What it does:
1. ``git mv`` each file (or each file of a package) in ``MOVES`` that still sits at its old path;
   new packages get an ``__init__.py`` with a one-line docstring.
2. Rewrites, in conclave/, plugins/, tests/, bench/, docs/, conf/, .ci/, pyproject.toml and README.md:
   ``from ... import`` statements (absolute and relative, resolved against the file's old location and re-emitted
   against its new one; ``from pkg import module`` keeps its local name with ``as``), and every dotted module path
   (``conclave.engine.runner``, in code, strings such as mock targets and ``SUBCOMMANDS``, entry points, comments)
   and every file path (``conclave/web/page.py``, ``engine/runner.py``) in code and text.
3. Rebuilds pyproject.toml's ``[tool.setuptools] packages`` from the packages on disk, sorts the imports of the
   changed Python files with ``ruff check --select I --fix`` and names lines the longer paths pushed past 120.

A dev tool for one migration: it can be deleted once the lead has applied it on main.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

# Old path -> new path, relative to the repository root. A directory entry moves every file under it (including
# files added after this script was written); a file entry inside a moved directory overrides the directory's.
MOVES: dict[str, str] = {
    # argv: the command line, the Hydra app and its task, the zero-config panel, one module per subcommand
    "conclave/cli.py": "conclave/cli/main.py",
    "conclave/hydra_app.py": "conclave/cli/hydra_app.py",
    "conclave/task.py": "conclave/cli/task.py",
    "conclave/panel.py": "conclave/cli/panel.py",
    "conclave/commands": "conclave/cli/commands",
    # config: typed settings, the data home, the guard every outside value passes
    "conclave/config.py": "conclave/config/settings.py",
    "conclave/home.py": "conclave/config/home.py",
    "conclave/guard.py": "conclave/config/guard.py",
    # plugins: the manager (conclave/plugins.py would share its name with the `plugins` subcommand)
    "conclave/plugins.py": "conclave/plugin_manager.py",
    # plan and rounds: the engine; what a consultation may spend is one package
    "conclave/engine/runner.py": "conclave/engine/run.py",
    "conclave/engine/cost.py": "conclave/engine/cost/estimate.py",
    "conclave/engine/consent.py": "conclave/engine/cost/consent.py",
    "conclave/engine/limits.py": "conclave/engine/cost/limits.py",
    "conclave/engine/resume.py": "conclave/engine/restore.py",
    "conclave/engine/safety.py": "conclave/engine/safety_gate.py",
    # quality layers
    "conclave/quality/state.py": "conclave/quality/debate_state.py",
    "conclave/quality/safety.py": "conclave/quality/safety_rules.py",
    # artifacts: the schema registry and the filter contract
    "conclave/artifacts.py": "conclave/artifacts/schema_registry.py",
    "conclave/artifact_filter.py": "conclave/artifacts/artifact_filter.py",
    # journal and index
    "conclave/store/index.py": "conclave/store/sqlite_index.py",
    "conclave/store/resume.py": "conclave/store/resume_points.py",
    "conclave/store/stats.py": "conclave/store/period_stats.py",
    # helpers only tests and benchmarks use
    "conclave/store/synthetic.py": "conclave/testing/synthetic_events.py",
    # views and doors
    "conclave/render/charts.py": "conclave/render/bar_charts.py",
    "conclave/render/safety.py": "conclave/render/safety_report.py",
    "conclave/web": "conclave/doors/web",
    "conclave/web/server.py": "conclave/doors/web/serving.py",
    "conclave/mcp_server": "conclave/doors/mcp",
    "conclave/mcp_server/server.py": "conclave/doors/mcp/tools.py",
    "conclave/mcp_server/schemas.py": "conclave/doors/mcp/tool_models.py",
    # evaluation
    "conclave/eval/runner.py": "conclave/eval/evaluate.py",
    "conclave/eval/report.py": "conclave/eval/run_report.py",
    "conclave/eval/stats.py": "conclave/eval/significance.py",
    "conclave/eval/store.py": "conclave/eval/run_store.py",
}

# The docstring of each package this script creates.
NEW_PACKAGES: dict[str, str] = {
    "conclave/cli": "argv → a subcommand (commands/, one module each) or a Hydra-composed consultation (hydra_app,\n"
    "task, panel). ``main.run`` is the console script.",
    "conclave/config": "The composed configuration: typed settings, the data home, and the guard every outside value\n"
    "passes (MCP, web form, HTTP API).",
    "conclave/engine/cost": "What a consultation may spend: the estimate, the consent gate, and the pre-flight limits.",
    "conclave/artifacts": "Artifacts: the schema registry (loading, validation, recovery from a model's answer) and\n"
    "the filter contract later rounds see them through.",
    "conclave/doors": "Thin doors onto the engine and the store: the MCP server (mcp/) and the live web view (web/).",
}

SCOPE_DIRS = ["conclave", "plugins", "tests", "bench", "docs", "conf", ".ci"]
SCOPE_FILES = ["pyproject.toml", "README.md"]
TEXT_SUFFIXES = {".md", ".toml", ".yaml", ".yml", ".txt", ".cfg", ".ini", ".sh", ".html", ".rst", ".json"}
SKIP_FILES = {"tools/retree.py", "tests/test_retree.py"}  # they spell the old paths on purpose
SKIP_PARTS = {".venv", "__pycache__", "build", "dist", ".git", "node_modules"}
RELATIVE_MAX_LEVEL = 2  # a relative import that would need three dots is written absolute

DOTTED = re.compile(r"(?<![\w.])conclave(?:\.[A-Za-z_]\w*)+")
# a path starts at a word boundary, or after `../` (Markdown links), never in the middle of another path or URL
SLASHED = re.compile(r"(?<![\w.-])(?<!\w/)((?:[A-Za-z_]\w*/)+[A-Za-z_]\w*(?:\.py)?)")
FROM_HEAD = re.compile(r"^(from\s+)([.\w]+)(\s+import\b)")


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def module_of(rel: str) -> tuple[str, bool]:
    """The dotted module a repository path is imported as, and whether it is a package's ``__init__``."""
    parts = rel[: -len(".py")].split("/") if rel.endswith(".py") else rel.split("/")
    if parts[0] == "plugins":
        parts[0] = "conclave_plugins"
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts = parts[:-1]
    return ".".join(parts), is_pkg


def dotted_of(path: str) -> str:
    return path[: -len(".py")].replace("/", ".") if path.endswith(".py") else path.replace("/", ".")


class Renamer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.present: dict[str, str] = {}
        self.dotmap = {dotted_of(old): dotted_of(new) for old, new in MOVES.items()}
        olds, news = set(self.dotmap), set(self.dotmap.values())
        clash = sorted(n for n in news if n in olds)
        if clash:
            raise SystemExit(f"retree: a new path is also an old path (the rename would chain): {clash}")
        self.tracked = set(git(root, "ls-files", "-co", "--exclude-standard").splitlines())

    # -- the plan ---------------------------------------------------------------------------------------------
    def new_path(self, rel: str) -> str:
        best = ""
        for old in MOVES:
            if (rel == old or rel.startswith(old + "/")) and len(old) > len(best):
                best = old
        return MOVES[best] + rel[len(best):] if best else rel

    def plan(self) -> list[tuple[str, str]]:
        moves = []
        for rel in sorted(self.tracked):
            if not (self.root / rel).is_file():
                continue
            new = self.new_path(rel)
            if new != rel:
                if (self.root / new).exists():
                    raise SystemExit(f"retree: cannot move {rel}: {new} already exists (merge them by hand first)")
                moves.append((rel, new))
        return moves

    def mapname(self, name: str) -> str:
        """The new dotted name of an old one (a module, a package, or an attribute under them); others unchanged."""
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            prefix = ".".join(parts[:i])
            if prefix in self.dotmap:
                break
        else:
            return name
        # already new: `conclave.cli.main` starts with the old `conclave.cli` but names a module that is in the tree
        # and stays where it is
        for j in range(i + 1, len(parts) + 1):
            longer = ".".join(parts[:j])
            if longer in self.present and self.new_path(self.present[longer]) == self.present[longer]:
                return name
        return ".".join([self.dotmap[prefix], *parts[i:]])

    def mappath(self, path: str) -> str:
        """The new form of a path naming an old file or a file or folder under an old folder; others unchanged.

        ``engine/runner.py`` (no ``conclave/``) counts when it names a Python file; a folder must be spelled in full.
        """
        full = path if path.startswith("conclave/") else "conclave/" + path
        if full != path and not full.endswith(".py"):
            return path
        best = ""
        for old in MOVES:
            if (full == old or (not old.endswith(".py") and full.startswith(old + "/"))) and len(old) > len(best):
                best = old
        if not best:
            return path
        new = MOVES[best] + full[len(best):]
        return new if full == path else new[len("conclave/"):]

    # -- text -------------------------------------------------------------------------------------------------
    def rewrite_text(self, text: str) -> str:
        text = DOTTED.sub(lambda m: self.mapname(m.group(0)), text)
        return SLASHED.sub(lambda m: self.mappath(m.group(1)), text)

    # -- Python -----------------------------------------------------------------------------------------------
    def resolve(self, node: ast.ImportFrom, module: str, is_pkg: bool) -> str | None:
        if not node.level:
            return node.module
        parts = module.split(".") if is_pkg else module.split(".")[:-1]
        if node.level - 1 > len(parts) - 1:
            return None
        parts = parts[: len(parts) - (node.level - 1)]
        return ".".join(parts + ([node.module] if node.module else []))

    @staticmethod
    def relative(target: str, module: str, is_pkg: bool) -> str:
        package = module.split(".") if is_pkg else module.split(".")[:-1]
        tparts = target.split(".")
        common = 0
        while common < min(len(package), len(tparts)) and package[common] == tparts[common]:
            common += 1
        level = len(package) - common + 1
        if common == 0 or level > RELATIVE_MAX_LEVEL:
            return target
        return "." * level + ".".join(tparts[common:])

    def import_edit(self, node: ast.ImportFrom, segment: str, old: tuple[str, bool], new: tuple[str, bool],
                    indent: str) -> str | None:
        base = self.resolve(node, *old)
        if base is None or not (base == "conclave" or base.startswith("conclave.")):
            return None
        groups: OrderedDict[str, list[tuple[str, str | None]]] = OrderedDict()
        same_names = True
        for alias in node.names:
            full = f"{base}.{alias.name}"
            if alias.name != "*" and full in self.present:  # a module (not a name in one): it moves on its own
                parent, leaf = self.mapname(full).rsplit(".", 1)
                local = alias.asname or alias.name
                entry = (leaf, None if local == leaf else local)
            else:
                parent, entry = self.mapname(base), (alias.name, alias.asname)
            same_names &= entry == (alias.name, alias.asname)
            groups.setdefault(parent, []).append(entry)

        def head(target: str) -> str:
            return self.relative(target, *new) if node.level else target

        original_head = "." * node.level + (node.module or "")
        if len(groups) == 1 and same_names:
            target = head(next(iter(groups)))
            if target == original_head:
                return None
            return FROM_HEAD.sub(lambda m: m.group(1) + target + m.group(3), segment, count=1)
        lines = []
        for target, names in groups.items():
            listed = ", ".join(name if not asname else f"{name} as {asname}" for name, asname in names)
            line = f"from {head(target)} import {listed}"
            if len(indent) + len(line) > 120:
                inner = "".join(f"{indent}    {n if not a else f'{n} as {a}'},\n" for n, a in names)
                line = f"from {head(target)} import (\n{inner}{indent})"
            lines.append(line)
        return ("\n" + indent).join(lines)

    def rewrite_python(self, text: str, old: tuple[str, bool], new: tuple[str, bool]) -> str:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return self.rewrite_text(text)
        lines = text.splitlines(keepends=True)
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line))

        def offset(lineno: int, col: int) -> int:
            line = lines[lineno - 1]
            return starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", "replace"))

        spans = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                start = offset(node.lineno, node.col_offset)
                end = offset(node.end_lineno or node.lineno, node.end_col_offset or 0)
                indent = lines[node.lineno - 1][: len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())]
                spans.append((start, end, node, indent))
        spans.sort(key=lambda s: s[0])
        out, pos = [], 0
        for start, end, node, indent in spans:
            out.append(self.rewrite_text(text[pos:start]))
            segment = text[start:end]
            edited = self.import_edit(node, segment, old, new, indent)
            out.append(segment if edited is None else edited)
            pos = end
        out.append(self.rewrite_text(text[pos:]))
        return "".join(out)

    # -- run --------------------------------------------------------------------------------------------------
    def in_scope(self, rel: str) -> bool:
        parts = rel.split("/")
        if SKIP_PARTS.intersection(parts) or rel in SKIP_FILES:
            return False
        if rel in SCOPE_FILES:
            return True
        return parts[0] in SCOPE_DIRS and (rel.endswith(".py") or Path(rel).suffix in TEXT_SUFFIXES)

    def run(self, dry_run: bool) -> int:
        moves = self.plan()
        moved = dict(moves)
        # the modules in the tree as it is before this run moves anything (module -> file or package folder): an
        # import names these as they are, and the rewrite reads every file against this tree
        self.present = {}
        for rel in self.tracked:
            if rel.endswith(".py"):
                parts = rel.split("/")
                for i in range(1, len(parts)):
                    self.present.setdefault(module_of("/".join(parts[:i]))[0], "/".join(parts[:i]))
                self.present[module_of(rel)[0]] = rel

        for old, new in moves:
            print(f"move {old} -> {new}")
        if dry_run:
            changed = 0
            for rel in sorted(self.tracked):
                if self.in_scope(rel) and (self.root / rel).is_file():
                    text = (self.root / rel).read_text(encoding="utf-8")
                    if self.rewrite(rel, moved.get(rel, rel), text) != text:
                        print(f"rewrite {rel}")
                        changed += 1
            print(f"{len(moves)} files would move, {changed} would be rewritten")
            return 0

        originals = {rel: moved.get(rel, rel) for rel in self.tracked if (self.root / rel).is_file()}
        for old, new in moves:
            (self.root / new).parent.mkdir(parents=True, exist_ok=True)
            if old in set(git(self.root, "ls-files", old).splitlines()):
                git(self.root, "mv", old, new)
            else:
                (self.root / old).rename(self.root / new)
        for pkg, doc in NEW_PACKAGES.items():
            init = self.root / pkg / "__init__.py"
            if not init.exists():
                init.parent.mkdir(parents=True, exist_ok=True)
                init.write_text(f'"""{doc}"""\n', encoding="utf-8")
                git(self.root, "add", str(init.relative_to(self.root)))
        self.remove_empty_dirs([old for old, _ in moves])

        changed_py = []
        for old, new in sorted(originals.items()):
            if not self.in_scope(new):
                continue
            path = self.root / new
            text = path.read_text(encoding="utf-8")
            result = self.rewrite(old, new, text)
            if result != text:
                path.write_text(result, encoding="utf-8")
                if new.endswith(".py"):
                    changed_py.append(new)
        self.sort_imports(changed_py + [pkg + "/__init__.py" for pkg in NEW_PACKAGES])
        self.long_lines(changed_py)
        print(f"{len(moves)} files moved, {len(changed_py)} Python files rewritten")
        return 0

    def rewrite(self, old: str, new: str, text: str) -> str:
        if new.endswith(".py"):
            return self.rewrite_python(text, module_of(old), module_of(new))
        if new == "pyproject.toml":
            return self.rewrite_pyproject(text)
        return self.rewrite_text(text)

    def remove_empty_dirs(self, olds: list[str]) -> None:
        for parent in sorted({str(Path(o).parent) for o in olds}, key=len, reverse=True):
            path = self.root / parent
            while path != self.root and path.is_dir():
                pycache = path / "__pycache__"
                if pycache.is_dir() and all(p.name == "__pycache__" for p in path.iterdir()):
                    shutil.rmtree(pycache)  # a directory left with only bytecode would import as a namespace
                if any(path.iterdir()):
                    break
                path.rmdir()
                path = path.parent

    def rewrite_pyproject(self, text: str) -> str:
        """pyproject.toml rewritten, with ``[tool.setuptools] packages`` rebuilt from the packages on disk (a bare
        ``conclave.cli`` there names the new package, so the list is not text-rewritten)."""
        match = re.search(r"^packages = \[\n(.*?)^\]", text, re.S | re.M)
        if not match:
            return self.rewrite_text(text)
        on_disk = {
            module_of(str(p.parent.relative_to(self.root)))[0]
            for p in (self.root / "conclave").rglob("__init__.py")
            if not SKIP_PARTS.intersection(p.relative_to(self.root).parts)
        }
        names = []
        for name in re.findall(r'"([\w.]+)"', match.group(1)):
            remapped = f'"{name}" = "' in text  # package-dir entries: conclave.conf, conclave.schemas
            if name == "conclave" or not name.startswith("conclave.") or remapped or name in on_disk:
                names.append(name)
        at = names.index("conclave") + 1 if "conclave" in names else 0
        names[at:at] = sorted(on_disk - set(names))
        block = "".join(f'    "{name}",\n' for name in names)
        return self.rewrite_text(text[: match.start(1)]) + block + self.rewrite_text(text[match.end(1):])

    @staticmethod
    def ruff() -> str | None:
        found = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
        return found if Path(found).exists() else None

    def sort_imports(self, files: list[str]) -> None:
        files = [f for f in dict.fromkeys(files) if (self.root / f).exists()]
        ruff = self.ruff()
        if files and not ruff:
            print("retree: ruff not found; sort the imports of the rewritten files with `ruff check --select I --fix`")
        elif files and ruff:
            subprocess.run([ruff, "check", "--quiet", "--select", "I", "--fix", *files], cwd=self.root, check=False)

    def long_lines(self, files: list[str]) -> None:
        """Name the lines a longer path pushed past the line length (ruff's own settings and exemptions)."""
        ruff = self.ruff()
        if files and ruff:
            done = subprocess.run([ruff, "check", "--select", "E501", "--output-format", "concise", *files],
                                  cwd=self.root, capture_output=True, text=True, check=False)
            for line in done.stdout.splitlines():
                if "E501" in line:
                    print(f"retree: wrap by hand: {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan; change nothing")
    args = parser.parse_args(argv)
    root = Path(git(Path.cwd(), "rev-parse", "--show-toplevel").strip())
    return Renamer(root).run(args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
