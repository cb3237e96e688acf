"""argv → a subcommand, or a Hydra-composed consultation. Owns question quoting and exit codes.

Exit codes: 0 complete (also "complete, degraded"), 1 consultation aborted or failed (partial results saved),
2 usage or configuration error, 130 interrupted.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from conclave.config.home import default_home
from conclave.errors import ConclaveError, UsageError
from conclave.quoting import SHELL_COMPLETION_HINT, hydra_quote
from conclave.version import __version__

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
#: 128 + SIGPIPE: what a shell reports for a process that stopped because its output pipe closed
EXIT_BROKEN_PIPE = 141

#: subcommand -> module with ``run(argv: list[str]) -> int``; imported only when used, so startup stays fast.
#: Likewise the consultation's own modules (Hydra, the config models, the engine) are imported where a consultation
#: starts (:func:`run_hydra`), not by a subcommand or ``--version``.
SUBCOMMANDS = {
    "plugins": "conclave.cli.commands.plugins",
    "schemas": "conclave.cli.commands.schemas",
    "doctor": "conclave.cli.commands.doctor",
    "logs": "conclave.cli.commands.logs",
    "stats": "conclave.cli.commands.stats",
    "browse": "conclave.cli.commands.browse",
    "index": "conclave.cli.commands.index",
    "resume": "conclave.cli.commands.resume",
    "ask": "conclave.cli.commands.ask",
    "show-prompt": "conclave.cli.commands.show_prompt",
    "show": "conclave.cli.commands.show",
    "export": "conclave.cli.commands.audit_export",
    "serve": "conclave.cli.commands.serve",
    "mcp": "conclave.cli.commands.mcp",
    "eval": "conclave.eval.command",
}

# A Hydra override: key=value, +key=value, ++key=value, ~key[=value], group@pkg=option.
_OVERRIDE = re.compile(r"^(\+\+|\+|~)?[A-Za-z_][\w.@/:\[\]-]*=|^~[A-Za-z_]")


def _is_override(arg: str) -> bool:
    return bool(_OVERRIDE.match(arg))


_VALUE_FLAGS = ("-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir", "-p", "--package",
                "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion")
_CFG_CHOICES = ("job", "hydra", "all")
_INFO_TOPICS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


#: every flag Hydra's parser knows; anything else starting with "-" is not passed to it (its usage is 8 lines)
_HYDRA_FLAGS = ("-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "--resolve", "-p", "--package",
                "-r", "--run", "-m", "--multirun", "-sc", "--shell-completion", "-cp", "--config-path",
                "-cn", "--config-name", "-cd", "--config-dir", "--experimental-rerun", "-i", "--info")

#: options people try first, and the override that does what they meant
_FLAG_HINTS = {
    "--model": "choose models with overrides: agents.NAME.model=MODEL for one agent, judge.model=MODEL for the judge",
    "-f": "read the question from a file with `conclave - < FILE`; add files to the prompt with context=[FILE,...]",
    "--file": "read the question from a file with `conclave - < FILE`; add files to the prompt with context=[FILE,...]",
    "--json": "ask for JSON with output.format=json",
    "-q": "run two rounds with quick=true",
    "-v": "turn on verbose output with verbose=true",
}


def _hydra_flag(arg: str) -> str | None:
    """The full name of the Hydra flag ``arg`` spells (argparse accepts an unambiguous prefix of a long option,
    and ``--flag=value``), or None."""
    name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
    if name not in _HYDRA_FLAGS:
        matches = [f for f in _HYDRA_FLAGS if f.startswith(name)] if name.startswith("--") else []
        if len(matches) != 1:
            return None
        name = matches[0]
    return name + eq + value


def _unknown_flag(arg: str, following: str | None) -> str:
    """One line for an option conclave does not have, pointing to the override that does what was meant."""
    from conclave.config.settings import Settings

    name, _, value = arg.partition("=")
    if name in _FLAG_HINTS:
        return f"{name} is not an option; {_FLAG_HINTS[name]}"
    key = name.lstrip("-").replace("-", "_")
    field = Settings.model_fields.get(key)
    if field is not None and field.annotation is bool:  # a switch: the next argument is the question, not its value
        value = value or "true"
    elif not value and following is not None and not following.startswith("-") and not _is_override(following):
        value = following
    if key.partition(".")[0] in Settings.model_fields:
        return f"{name} is not an option; settings are KEY=VALUE overrides without dashes: {key}={value or 'VALUE'}"
    return (f"{name} is not an option; settings are KEY=VALUE overrides (conclave --help lists them), and a "
            "question that starts with - goes after --")


#: command names of the predecessor (llm-conclave) and the conclave command that does what each did
_PREDECESSOR_COMMANDS = {
    "consult": 'conclave "QUESTION"', "discuss": 'conclave "QUESTION"', "review": 'conclave "QUESTION"',
    "iterate": 'conclave "QUESTION"', "consult-stats": "conclave stats", "sessions": "conclave logs list",
    "continue": "conclave resume", "server": "conclave serve", "template": "conclave --help",
    "templates": "conclave --help", "personas": "conclave --help", "init": "conclave doctor",
    "config": "conclave --cfg job",
}
_BARE_WORD = re.compile(r"[A-Za-z][\w-]*")


def _mistaken_command(word: str) -> str | None:
    """Why a one-word question is refused: it is a predecessor's command name or close to one of ours, so the user
    meant a command, not a paid consultation about that word (``conclave -- WORD`` still asks it)."""
    if not _BARE_WORD.fullmatch(word):
        return None
    name = word.lower()
    meant = _PREDECESSOR_COMMANDS.get(name)
    if meant is None:
        close = difflib.get_close_matches(name.replace("_", "-"), SUBCOMMANDS, n=1, cutoff=0.8)
        meant = f"conclave {close[0]}" if close else None
    if meant is None:
        return None
    return f"{word!r} is not a conclave command (did you mean {meant}?); to ask it as a question: conclave -- {word}"


def _read_stdin(given: str | None) -> str:
    if given is not None:
        return given.strip()
    if sys.stdin is None:  # started with stdin closed
        raise UsageError("the question is - (read it from stdin), but stdin is closed")
    try:
        text = sys.stdin.read()
        text.encode("utf-8")  # undecodable bytes read as lone surrogates (surrogateescape) fail here
    except (UnicodeDecodeError, UnicodeEncodeError) as exc:
        raise UsageError(f"the question on stdin is not UTF-8 text (at offset {exc.start})") from None
    return text.strip()


def _split_question(args: list[str], stdin_text: str | None = None, *,
                    refuse_commands: bool = False) -> tuple[list[str], list[str], str | None]:
    """Split ``args`` into Hydra flags (with their values), overrides, and the positional question.

    The question is the first argument that is neither a flag nor an override, or ``-`` (stdin), or the argument
    after ``--``. With ``refuse_commands``, a positional question that is one word naming a command (see
    :func:`_mistaken_command`) is a usage error. Flags come back first because Hydra's argparse rejects a flag
    placed after an override, so ``conclave "Q" mode=explore --cfg job`` works as the user meant.
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
            mistaken = _mistaken_command(arg) if refuse_commands else None
            if mistaken is not None:
                raise UsageError(mistaken)
            question = _read_stdin(stdin_text) if arg == "-" else arg
            i += 1
            continue
        if not arg.startswith("-"):
            overrides.append(arg)
            i += 1
            continue
        if arg != "-":
            full = _hydra_flag(arg)
            if full is None:
                raise UsageError(_unknown_flag(arg, args[i + 1] if i + 1 < len(args) else None))
            arg = full
        flags.append(arg)
        i += 1
        if arg in ("-i", "--info"):
            # its topic is optional: name it, or argparse reads the override after it (e.g. the panel) as the topic
            topic_given = i < len(args) and args[i] in _INFO_TOPICS
            flags.append(args[i] if topic_given else "all")
            i += int(topic_given)
            continue
        name, eq, value = arg.partition("=")
        if name in ("-c", "--cfg"):
            # its value is required and one of three (argparse's complaint is Hydra's eight-line usage)
            value = value if eq else (args[i] if i < len(args) else "")
            if value not in _CFG_CHOICES:
                raise UsageError(f"--cfg: {value!r} is not one of: {', '.join(_CFG_CHOICES)}" if value else
                                 f"--cfg needs one of: {', '.join(_CFG_CHOICES)} (e.g. conclave --cfg job)")
            if not eq:
                flags.append(value)
                i += 1
            continue
        # a flag's value stays with its flag, so it is not mistaken for the question or an override
        if arg in _VALUE_FLAGS:
            if i >= len(args):
                raise UsageError(SHELL_COMPLETION_HINT if arg in ("-sc", "--shell-completion") else
                                 f"{arg} needs a value")
            flags.append(args[i])
            i += 1
    return flags, overrides, question


def run() -> NoReturn:
    """The ``conclave`` command and ``python -m conclave``: :func:`main`, exiting with its code."""
    sys.exit(main())


def main(argv: Sequence[str] | None = None) -> int:
    """Everything the command does; returns the process exit code."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        return _stdout_closed()
    except OSError as exc:
        if exc.filename is None:  # not a file the system refused: a bug, with its traceback
            raise
        # a file or directory the system refuses (an unreadable home, say) where no command expected it
        print(f"conclave: cannot access {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED


def _stdout_closed() -> int:
    """The reader of stdout went away (``conclave plugins --json | head -1``): stop quietly, as Unix tools do.

    stdout is pointed at /dev/null first, so the interpreter's final flush of the unwritten rest cannot fail again.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


def _main(args: list[str]) -> int:
    if args and args[0] in SUBCOMMANDS:
        return _run_subcommand(args[0], args[1:])
    try:
        flags, overrides, question = _split_question(args, refuse_commands=True)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except UsageError as exc:
        print(f"conclave: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if "--version" in flags:  # Hydra's own --version would print Hydra's version
        print(f"conclave {__version__}")
        return EXIT_OK
    if question is not None:
        if not question.strip():
            print("conclave: the question is empty", file=sys.stderr)
            return EXIT_USAGE
        overrides.append("question=" + hydra_quote(question))
    if "--hydra-help" in flags:  # Hydra's help composes its own config, where an agents=… override cannot apply
        return run_hydra([*flags, *overrides])
    overrides = _with_zero_config_panel(overrides)
    if flags and set(flags) <= {"-h", "--help"}:
        return _help(overrides)
    if question is not None and (not flags or {"-m", "--multirun"} & set(flags)):
        from conclave.cli.panel import offline_panel_blocked

        if missing := offline_panel_blocked(overrides):
            print(f"conclave: {missing}", file=sys.stderr)  # before the run starts: nothing to resume
            return EXIT_USAGE
    code = run_hydra([*flags, *overrides])
    if code == EXIT_OK and {"-c", "--cfg"} & set(flags) and "hydra" not in flags:
        _parent_cfg_note(overrides)
    return code


def _parent_cfg_note(overrides: list[str]) -> None:
    """After ``--cfg job parent=ID``: one comment line saying what the follow-up takes from its parent, which the
    composed configuration Hydra printed does not show (the parent's panel and mode are read at run time)."""
    refs = [o.partition("=")[2] for o in overrides if o.lstrip("+").startswith("parent=")]
    ref = refs[-1].strip("'\"") if refs else ""
    if ref in ("", "null"):
        return
    from conclave.engine.followup import cfg_note
    from conclave.store.paths import StoreLayout

    print(cfg_note(StoreLayout(default_home()), ref, overrides), flush=True)


def _with_zero_config_panel(overrides: list[str]) -> list[str]:
    """Pick the panel from the keys present when the user picked none (see :mod:`conclave.cli.panel`).

    ``--cfg job`` shows the same choice a run would make. The notice about the offline panel is printed by the
    Hydra task once the configuration has validated, so a config error stays one line.
    """
    from conclave.cli import task
    from conclave.cli.panel import LOCAL_PANEL, zero_config_overrides

    added = zero_config_overrides(overrides, os.environ, default_home())
    task.offline_notice_pending = f"agents={LOCAL_PANEL}" in added
    return [*added, *overrides]  # first, so the user's own agents.* overrides still apply on top


def _help(overrides: list[str]) -> int:
    """``conclave --help [OVERRIDE ...]``: the help text, or the one-line error of a bad override (exit 2)."""
    from conclave.compose import help_text

    def show() -> None:
        print(help_text(overrides))

    code = _reported(show)
    return EXIT_OK if code is None else code


def _run_subcommand(name: str, argv: list[str]) -> int:
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

    def compose_and_run() -> None:
        from conclave.cli.hydra_app import hydra_entry, prepare_hydra

        prepare_hydra()
        saved_argv = sys.argv
        sys.argv = [saved_argv[0] if saved_argv else "conclave", *overrides]
        try:
            hydra_entry()
        finally:
            sys.argv = saved_argv

    code = _reported(compose_and_run)
    if code is not None:
        return code
    from conclave.cli.task import worst_exit

    return worst_exit()


def _reported(body: Callable[[], int | None]) -> int | None:
    """``body()``, with every error it raises turned into its exit code and one line on stderr (configuration
    errors: exit 2, no traceback)."""
    from conclave.cli.task import report_error
    from conclave.compose import hydra_error_message

    # Let exceptions reach us instead of Hydra's reporter (which prints a trace and exits 1).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        return body()
    except ConclaveError as exc:
        report_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("conclave: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # argparse usage errors and our own exits
        return exc.code if isinstance(exc.code, int) else (EXIT_USAGE if exc.code else EXIT_OK)
    except Exception as exc:
        message = hydra_error_message(exc)
        if message is None:
            raise
        print(f"conclave: {message}", file=sys.stderr)
        return EXIT_USAGE
