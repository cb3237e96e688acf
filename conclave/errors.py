"""Exceptions users see. Each carries a message that can be printed as-is, one line, no traceback."""

from __future__ import annotations


class ConclaveError(Exception):
    """Base of every error conclave raises (plugins included). Its message is printed as one line, no traceback;
    ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class ConfigError(ConclaveError):
    """The composed configuration is invalid: one line per problem, naming the key and what is allowed."""

    exit_code = 2

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class UsageError(ConclaveError):
    """The command line itself is wrong (missing question, unknown subcommand option, …)."""

    exit_code = 2


class PluginError(ConclaveError):
    """A plugin failed to load, clashed with another plugin, or implements an unknown hook."""

    exit_code = 2


class StorageError(ConclaveError):
    """The data home refuses a read or write (full disk, read-only, not a directory): one line naming the path
    and the operating system's reason."""

    exit_code = 1
