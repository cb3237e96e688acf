"""argv → a subcommand, or a Hydra-composed consultation. Owns question quoting and exit codes.

Exit codes: 0 complete (also "complete, degraded"), 1 consultation aborted or failed (partial results saved),
2 usage or configuration error, 130 interrupted.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

#: subcommand -> module with ``run(argv: list[str]) -> int``; imported only when used, so startup stays fast.
SUBCOMMANDS = {
    "plugins": "conclave.commands.plugins",
    "schemas": "conclave.commands.schemas",
    "doctor": "conclave.commands.doctor",
    "logs": "conclave.commands.logs",
    "stats": "conclave.commands.stats",
    "browse": "conclave.commands.browse",
    "index": "conclave.commands.index",
    "resume": "conclave.commands.resume",
}

# A Hydra override: key=value, +key=value, ++key=value, ~key[=value], group@pkg=option.
_OVERRIDE = re.compile(r"^(\+\+|\+|~)?[A-Za-z_][\w.@/:\[\]-]*=|^~[A-Za-z_]")


def hydra_quote(text: str) -> str:
    """Quote ``text`` as a Hydra override value that parses back to exactly ``text``.

    Inside double quotes Hydra's grammar still resolves ``${...}`` and treats ``\\`` before a quote as an escape, so
    interpolations are escaped (a question must never expand ``${oc.env:SECRET}``), quotes are escaped, and
    backslashes that precede a quote or the closing quote are doubled.
    """
    text = text.replace("${", "\\${")
    text = re.sub(r'(\\*)"', lambda m: m.group(1) * 2 + '\\"', text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return '"' + text + '"'


def _is_override(arg: str) -> bool:
    return bool(_OVERRIDE.match(arg))


def _split_question(args: list[str], stdin_text: str | None = None) -> tuple[list[str], str | None]:
    """Take the positional question (or ``-`` for stdin, or the argument after ``--``) out of ``args``.

    Flags and overrides stay in order; the question becomes a quoted ``question=`` override appended last
    (argparse rejects overrides placed after a flag's arguments, so order matters).
    """
    rest: list[str] = []
    question: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" and question is None and i + 1 < len(args):
            question = args[i + 1]
            i += 2
            continue
        if question is None and (arg == "-" or not (arg.startswith("-") or _is_override(arg))):
            if arg == "-":
                question = stdin_text if stdin_text is not None else sys.stdin.read()
                question = question.strip()
            else:
                question = arg
            i += 1
            continue
        rest.append(arg)
        # flags that take a value: keep the value with its flag so it is not mistaken for the question
        if arg in ("-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir", "-p", "--package",
                   "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion") and i + 1 < len(args):
            if arg in ("-c", "--cfg", "-i", "--info") and (args[i + 1].startswith("-") or _is_override(args[i + 1])):
                i += 1
                continue
            if arg in ("-i", "--info") and args[i + 1] not in (
                "all", "config", "defaults", "defaults-tree", "plugins", "searchpath"
            ):
                i += 1
                continue
            rest.append(args[i + 1])
            i += 2
            continue
        i += 1
    return rest, question


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the process exit code (``python -m conclave`` exits with it)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in SUBCOMMANDS:
        return _run_subcommand(args[0], args[1:])
    try:
        rest, question = _split_question(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    if question is not None:
        if not question.strip():
            print("conclave: the question is empty", file=sys.stderr)
            return EXIT_USAGE
        rest.append("question=" + hydra_quote(question))
    return run_hydra(_with_zero_config_panel(rest))


_INSPECTION_FLAGS = ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "-sc", "--shell-completion")


def _with_zero_config_panel(args: list[str]) -> list[str]:
    """Pick the panel from the keys present when the user picked none (see :mod:`conclave.panel`).

    ``--cfg job`` shows the same choice a run would make; the notice about the offline panel is printed only
    for a real run.
    """
    from conclave.config import default_home
    from conclave.panel import LOCAL_PANEL, LOCAL_PANEL_NOTICE, panel_override

    overrides = [a for a in args if "=" in a and not a.startswith("-")]
    override = panel_override(overrides, os.environ, default_home())
    if override is None:
        return args
    if override == f"agents={LOCAL_PANEL}" and not any(a in _INSPECTION_FLAGS for a in args):
        print(LOCAL_PANEL_NOTICE, file=sys.stderr)
    flags_end = next((i for i, a in enumerate(args) if not a.startswith("-") and "=" in a), len(args))
    # overrides must follow every flag (argparse), and the panel choice must precede the user's own overrides
    return [*args[:flags_end], override, *args[flags_end:]]


def _run_subcommand(name: str, argv: list[str]) -> int:
    from conclave.errors import ConclaveError

    module = importlib.import_module(SUBCOMMANDS[name])
    try:
        code: int = module.run(argv)
        return code
    except ConclaveError as exc:
        print(f"conclave {name}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def run_hydra(overrides: list[str]) -> int:
    """Hand ``overrides`` (flags included) to Hydra; translate every configuration error to one line, exit 2."""
    from conclave.errors import ConclaveError
    from conclave.hydra_app import hydra_entry, prepare_hydra, report_error, worst_exit

    # Let exceptions reach us instead of Hydra's reporter (which prints a trace and exits 1).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        prepare_hydra()
        saved_argv = sys.argv
        sys.argv = [saved_argv[0] if saved_argv else "conclave", *overrides]
        try:
            hydra_entry()
        finally:
            sys.argv = saved_argv
    except ConclaveError as exc:
        report_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("conclave: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # argparse usage errors and our own exits
        return exc.code if isinstance(exc.code, int) else (EXIT_USAGE if exc.code else EXIT_OK)
    except Exception as exc:
        message = _hydra_error_message(exc)
        if message is None:
            raise
        print(f"conclave: {message}", file=sys.stderr)
        return EXIT_USAGE
    return worst_exit()


def _hydra_error_message(exc: BaseException) -> str | None:
    """One line for Hydra's composition and override errors, or None when ``exc`` is not one of them."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(exc, MissingConfigException):
        text = str(exc)
        match = re.search(r"Could not find '([^/']+)/([^']+)'", text)
        options = sorted(exc.options or [])
        if match:
            group, value = match.groups()
            allowed = ", ".join(options) if options else "(none found)"
            return f"{group}: {value!r} is not one of: {allowed}"
        return text.splitlines()[0]
    if isinstance(exc, OverrideParseException):
        return f"cannot parse override: {str(exc).splitlines()[0]}"
    if isinstance(exc, ConfigCompositionException):
        text = str(exc)
        match = re.search(r"Could not override '([^']+)'", text) or re.search(
            r"Could not append to config\. An item is already at '([^']+)'", text
        )
        cause = exc.__cause__
        if match:
            key = match.group(1)
            if cause is not None and "not in struct" in str(cause):
                parent = key.rpartition(".")[0]
                allowed = _known_children(cause)
                hint = f"; known keys{' under ' + parent if parent else ''}: {allowed}" if allowed else ""
                return f"{key}: unknown key{hint} (prefix with + to add a new key)"
            detail = str(cause).splitlines()[0] if cause is not None else text.splitlines()[0]
            return f"{key}: {detail}"
        first = text.splitlines()[0]
        if cause is not None:
            first += f" ({str(cause).splitlines()[0]})"
        return first
    if isinstance(exc, OmegaConfBaseException):
        key = getattr(exc, "full_key", None)
        first = str(exc).splitlines()[0]
        return f"{key}: {first}" if key else first
    return None


def _known_children(cause: BaseException) -> str:
    node: Any = getattr(cause, "parent_node", None)
    try:
        keys = sorted(str(k) for k in node) if node is not None else []
    except Exception:
        keys = []
    return ", ".join(keys)
