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
    "eval": "conclave.eval.command",
}

# A Hydra override: key=value, +key=value, ++key=value, ~key[=value], group@pkg=option.
_OVERRIDE = re.compile(r"^(\+\+|\+|~)?[A-Za-z_][\w.@/:\[\]-]*=|^~[A-Za-z_]")


def hydra_quote(text: str) -> str:
    """Quote ``text`` as a Hydra override value that parses back to exactly ``text``.

    Inside double quotes Hydra's grammar still resolves ``${...}`` and treats ``\\`` before a quote as an escape, so
    interpolations are escaped (a question must never expand ``${oc.env:SECRET}``), quotes are escaped, and
    backslashes that precede a quote or the closing quote are doubled.
    """
    # n backslashes before "${" must stay literal: 2n backslashes, then the escaped "\${"
    text = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)
    text = re.sub(r'(\\*)"', lambda m: m.group(1) * 2 + '\\"', text)
    text = re.sub(r"(\\+)\Z", lambda m: m.group(1) * 2, text)
    return '"' + text + '"'


def _is_override(arg: str) -> bool:
    return bool(_OVERRIDE.match(arg))


_VALUE_FLAGS = ("-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir", "-p", "--package",
                "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion")
_INFO_TOPICS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def _read_stdin(given: str | None) -> str:
    return (given if given is not None else sys.stdin.read()).strip()


def _split_question(args: list[str], stdin_text: str | None = None) -> tuple[list[str], list[str], str | None]:
    """Split ``args`` into Hydra flags (with their values), overrides, and the positional question.

    The question is the first argument that is neither a flag nor an override, or ``-`` (stdin), or the argument
    after ``--``. Flags come back first because Hydra's argparse rejects a flag placed after an override, so
    ``conclave "Q" mode=explore --cfg job`` works as the user meant.
    """
    flags: list[str] = []
    overrides: list[str] = []
    question: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" and question is None and i + 1 < len(args):
            question = args[i + 1]
            i += 2
            continue
        if question is None and (arg == "-" or not (arg.startswith("-") or _is_override(arg))):
            question = _read_stdin(stdin_text) if arg == "-" else arg
            i += 1
            continue
        if not arg.startswith("-"):
            overrides.append(arg)
            i += 1
            continue
        flags.append(arg)
        i += 1
        # a flag's value stays with its flag, so it is not mistaken for the question or an override
        if arg in _VALUE_FLAGS and i < len(args):
            value = args[i]
            optional_value = arg in ("-c", "--cfg", "-i", "--info")
            if optional_value and (value.startswith("-") or _is_override(value)):
                continue
            if arg in ("-i", "--info") and value not in _INFO_TOPICS:
                continue
            flags.append(value)
            i += 1
    return flags, overrides, question


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the process exit code (``python -m conclave`` exits with it)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in SUBCOMMANDS:
        return _run_subcommand(args[0], args[1:])
    try:
        flags, overrides, question = _split_question(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    if question is not None:
        if not question.strip():
            print("conclave: the question is empty", file=sys.stderr)
            return EXIT_USAGE
        overrides.append("question=" + hydra_quote(question))
    return run_hydra([*flags, *_with_zero_config_panel(overrides)])


def _with_zero_config_panel(overrides: list[str]) -> list[str]:
    """Pick the panel from the keys present when the user picked none (see :mod:`conclave.panel`).

    ``--cfg job`` shows the same choice a run would make. The notice about the offline panel is printed by the
    Hydra task once the configuration has validated, so a config error stays one line.
    """
    from conclave import hydra_app
    from conclave.home import default_home
    from conclave.panel import LOCAL_PANEL, panel_override

    override = panel_override(overrides, os.environ, default_home())
    if override is None:
        return overrides
    hydra_app.offline_notice_pending = override == f"agents={LOCAL_PANEL}"
    return [override, *overrides]  # first, so the user's own agents.* overrides still apply on top


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
    import yaml
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        where = f' in "{mark.name}", line {mark.line + 1}, column {mark.column + 1}' if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return f"invalid YAML{where}: {problem}"

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
        return (f"cannot parse override: {str(exc).splitlines()[0]} "
                "(if this argument is your question, put -- before it)")
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
        if first.startswith(("Ambiguous value for argument", "Sweep parameters")):
            return (f"{first}: a comma makes a list or a sweep — quote the value (key='a,b'), sweep with -m, "
                    "or, if this argument is your question, put -- before it")
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
