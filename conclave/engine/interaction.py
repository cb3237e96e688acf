"""How the engine asks the user something: on a terminal (stdin and stderr are TTYs) or not at all.

The ``ask`` function is injectable so tests (and embedding applications) can answer prompts without a TTY.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass


def _ask_on_terminal(prompt: str) -> str:
    print(prompt, end=" ", file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    return line.strip() if line else ""  # EOF answers nothing; callers treat that as their default


def _warn_on_stderr(message: str) -> None:
    print(f"conclave: warning: {message}", file=sys.stderr, flush=True)


def _no_terminal(prompt: str) -> str:
    raise RuntimeError(f"no terminal to ask: {prompt}")


@dataclass(frozen=True)
class Interaction:
    """``interactive`` says whether questions may be asked; ``ask`` shows one and returns the answer line."""

    interactive: bool
    ask: Callable[[str], str] = _no_terminal
    warn: Callable[[str], None] = _warn_on_stderr

    @classmethod
    def from_terminal(cls) -> Interaction:
        """Interactive when both stdin and stderr are terminals (stdout may be piped to a file)."""
        tty = sys.stdin.isatty() and sys.stderr.isatty()
        return cls(interactive=tty, ask=_ask_on_terminal if tty else _no_terminal)

    @classmethod
    def non_interactive(cls) -> Interaction:
        return cls(interactive=False)
