"""Subcommands dispatched before Hydra. Each module exposes ``run(argv: list[str]) -> int``."""
