"""The shape of the source tree, computed with ast: the module graph is a DAG, imports sit at module top,
and no module reaches into the private names of the packages we depend on."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("conclave", "plugins")
MAX_IMPORTS_IN_FUNCTIONS = 120
GUARDED = frozenset({"hydra", "omegaconf", "pydantic", "asyncio", "threading", "atexit", "_imp", "pluggy",
                       "referencing", "jsonschema", "aiohttp", "sqlite_utils", "datasette", "mcp"})


def modules() -> dict[str, Path]:
    """Every module of the source tree by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def type_checking_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids.update(id(n) for n in ast.walk(node))
    return ids


def function_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes inside a function or method body."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            ids.update(id(n) for n in ast.walk(node) if n is not node)
    return ids


def imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    skip = type_checking_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in skip:
            yield node


def targets(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    """The dotted names an import statement loads (``from a import b`` loads ``a.b`` when that is a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = name.split(".")
        if path.name != "__init__.py":
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in imports(tree):
            for target in targets(name, path, node, known):
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_module_graph_has_no_cycles() -> None:
    """Counting imports inside functions too: a module never needs one that needs it back."""
    assert cycles(graph()) == []


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_sit_at_module_top() -> None:
    """Only optional heavy packages are imported inside functions, at the command that needs them."""
    inside: list[str] = []
    for name, path in modules().items():
        if not name.startswith("conclave"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        in_function = function_nodes(tree)
        inside += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in imports(tree) if id(n) in in_function]
    assert len(inside) <= MAX_IMPORTS_IN_FUNCTIONS, f"{len(inside)} imports inside functions: {inside[:20]} ..."


def private_uses(tree: ast.Module) -> list[str]:
    """``_``-prefixed names reached in a guarded package: imported from it, or read off a module bound to it."""
    bound: dict[str, str] = {}  # local name -> the guarded module it is bound to
    uses: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in GUARDED:
                    if any(p.startswith("_") for p in parts[1:]):
                        uses.append(alias.name)
                    bound[alias.asname or parts[0]] = (alias.asname and alias.name) or parts[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            parts = node.module.split(".")
            if parts[0] in GUARDED:
                if any(p.startswith("_") for p in parts[1:]):
                    uses.append(node.module)
                uses += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
                for alias in node.names:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in tree.body:  # a module-level object made by a guarded package: ``migrations = Migrations(...)``
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            root = node.value.func
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        bound[target.id] = f"{bound[root.id]}()"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                uses.append(".".join([bound[value.id], *reversed(chain)]))
    return uses


def test_no_private_names_of_other_packages() -> None:
    found = []
    for path in modules().values():
        found += [f"{path.relative_to(ROOT)}: {u}" for u in private_uses(ast.parse(path.read_text(encoding="utf-8")))]
    assert found == []


def test_the_private_name_check_sees_one() -> None:
    source = ("import threading\nimport atexit as ax\nfrom pydantic.plugin import _loader\nthreading._shutdown()\n"
              "ax._run_exitfuncs()\nfrom sqlite_utils import Migrations\nm = Migrations('x')\nm._record_applied()\n")
    assert sorted(private_uses(ast.parse(source))) == ["atexit._run_exitfuncs", "pydantic.plugin._loader",
                                                        "sqlite_utils.Migrations()._record_applied",
                                                        "threading._shutdown"]


def imported_at_start(*argv: str, home: Path) -> set[str]:
    """Every module a ``conclave`` process imports, read from ``python -X importtime``."""
    env = {**os.environ, "CONCLAVE_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "conclave", *argv], capture_output=True,
                          text=True, env=env, stdin=subprocess.DEVNULL, timeout=120)
    return {line.rpartition("|")[2].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


#: packages a command that calls no provider does not import: the schema validator (plugins register schemas from
#: conclave.artifacts.schema_refs; the engine validates) and the optional packages of single commands
NOT_AT_START = ("jsonschema", "json_repair", "sqlite_utils", "numpy", "weasyprint", "pypdf", "mcp", "datasette")


def test_commands_that_call_no_provider_do_not_import_the_http_client(tmp_path: Path) -> None:
    """--help and `plugins` load every plugin; provider plugins send through the pool's client, so aiohttp stays out;
    nor do they import the schema validator or any optional package."""
    for argv in (["--help"], ["plugins"]):
        loaded = imported_at_start(*argv, home=tmp_path)
        assert "conclave.cli.task" in loaded or "conclave.plugin_manager" in loaded  # the reading worked
        assert "aiohttp" not in loaded, argv
        assert "conclave.providers.transport" not in loaded, argv
        assert sorted(m for m in loaded if m.split(".")[0] in NOT_AT_START) == [], argv


def test_only_the_transport_speaks_http_among_providers_and_plugins() -> None:
    """aiohttp is imported by the provider transport alone (the doors and the fake server serve HTTP)."""
    importers, known = set(), modules()
    for name, path in known.items():
        for node in imports(ast.parse(path.read_text(encoding="utf-8"))):
            if any(loaded.split(".")[0] == "aiohttp" for loaded in targets(name, path, node, known)):
                importers.add(name)
    providers = {n for n in importers if not n.startswith(("conclave.doors.", "conclave.testing"))}
    assert providers == {"conclave.providers.transport"}


#: quality modules that still take the whole Session; a ratchet: this set only shrinks
WHOLE_SESSION_YET: set[str] = set()


def test_quality_layers_get_narrow_inputs_not_the_session() -> None:
    """quality/ imports no engine.session, not even for annotations: the runner hands a layer the values it uses."""
    takes_session = set()
    for name, path in modules().items():
        if name.startswith("conclave.quality."):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):  # TYPE_CHECKING imports included
                if isinstance(node, ast.ImportFrom) and node.module == "conclave.engine.session":
                    takes_session.add(name)
    assert takes_session <= WHOLE_SESSION_YET
    assert not {"conclave.quality.exit", "conclave.quality.objection", "conclave.quality.summarize"} & takes_session


def test_provider_key_names_and_schema_dialects_live_in_the_provider_plugins() -> None:
    """The core asks the plugin manager (``Provider.KEY_VARIABLES``, ``register_schema_dialects``); it names no
    provider's key variable and holds no provider's schema dialect."""
    core = [p for n, p in modules().items() if n.startswith(("conclave.store", "conclave.providers",
                                                              "conclave.artifacts", "conclave.engine"))]
    for path in core:
        text = path.read_text(encoding="utf-8")
        assert "_API_KEY" not in text and "def strict_variant" not in text, path
