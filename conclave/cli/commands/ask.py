"""``conclave ask [ID] "follow-up question" [overrides]``: ask a follow-up of consultation ID (an id or unique
prefix; default: the latest consultation). Sugar for ``conclave "question" parent=ID``: the same panel and mode as
the parent unless overridden, its verdict, dissent and debate state shown to the panel, exit codes as for any
consultation.
"""

from __future__ import annotations

from conclave.cli.main import _VALUE_FLAGS, _is_override, _main
from conclave.config.home import default_home
from conclave.errors import UsageError
from conclave.quoting import hydra_quote
from conclave.store.paths import StoreLayout

USAGE = 'conclave ask [ID] "follow-up question" [overrides]'


def run(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    rest, words, after_dashes = _split(argv)
    if any(o.lstrip("+~").startswith("parent=") for o in rest):
        raise UsageError("give the consultation to follow up as ID, not as parent=… (" + USAGE + ")")
    if after_dashes is not None:
        if len(words) > 1:
            raise UsageError(f"takes at most one ID before the question (got {len(words)} words; {USAGE})")
        parent, question = (words[0] if words else None), after_dashes
    elif len(words) == 2:
        parent, question = words
    elif len(words) == 1:
        if words[0] in StoreLayout(default_home()).journal_ids():  # an id alone: the question was forgotten
            raise UsageError(f"the follow-up question of {words[0]} is missing ({USAGE})")
        parent, question = None, words[0]
    elif not words:
        raise UsageError(f"the follow-up question is missing ({USAGE})")
    else:
        raise UsageError(f"takes an ID and one question; quote the question (got {len(words)} words: "
                         f"{words[0]!r}, …)")
    parent = parent or latest_consultation(StoreLayout(default_home()))
    return _main([*rest, "parent=" + hydra_quote(parent), "--", question] if question != "-" else
                 [*rest, "parent=" + hydra_quote(parent), "-"])


def _split(argv: list[str]) -> tuple[list[str], list[str], str | None]:
    """Overrides and flags (in order), the positional words, and the argument after ``--`` (None without one)."""
    rest: list[str] = []
    words: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            if i + 1 >= len(argv):
                raise UsageError(f"-- must be followed by the question ({USAGE})")
            rest += argv[i + 2:]
            return rest, words, argv[i + 1]
        if arg == "-" or not (arg.startswith("-") or _is_override(arg)):
            words.append(arg)
        else:
            rest.append(arg)
            if arg in _VALUE_FLAGS and i + 1 < len(argv):  # its value is no positional word
                i += 1
                rest.append(argv[i])
        i += 1
    return rest, words, None


def latest_consultation(layout: StoreLayout) -> str:
    """The newest consultation of the home (ids sort by their start time)."""
    ids = layout.journal_ids()
    if not ids:
        raise UsageError(f"no consultation to follow up in {layout.journal_dir}; ask a question first")
    return ids[-1]
