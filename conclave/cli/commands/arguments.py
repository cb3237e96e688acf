"""The subcommands' argument parser: a usage error is one line (exit 2), never argparse's usage block; and the
value types several subcommands share (a TCP port, a positive number of seconds)."""

from __future__ import annotations

import argparse
from typing import NoReturn

from conclave.errors import UsageError


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors raise :class:`UsageError`: the CLI prints ``conclave CMD: …`` on
    one line and exits 2. Sub-parsers (``logs list``, ``index merge``) are of this class too."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def port(text: str) -> int:
    """A TCP port number, 0 to 65535 (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number: allowed 0 to 65535 (0 picks a free one)")
    return value


def positive_seconds(text: str) -> float:
    """A number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def dollars(text: str) -> float:
    """A number of dollars, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of dollars") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of dollars ≥ 0")
    return value


def count(text: str) -> int:
    """A whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 0 or more")
    return value
