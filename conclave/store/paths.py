"""Where the store keeps things under the data home: one journal file per consultation, the heads log, the index."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from conclave.config.home import default_home as default_home  # re-exported: the one rule for the data home
from conclave.errors import UsageError

# Consultation ids become file names: keep them to a safe alphabet so an id can never escape the journal dir.
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def check_consultation_id(consultation_id: str) -> str:
    if not _ID.fullmatch(consultation_id):
        raise UsageError(f"invalid consultation id {consultation_id!r} (letters, digits, '_', '.', '-')")
    return consultation_id


@dataclass(frozen=True)
class StoreLayout:
    home: Path

    @property
    def journal_dir(self) -> Path:
        return self.home / "journal"

    @property
    def heads_path(self) -> Path:
        """Append-only ``consultation_id seq hash`` lines, written after each fsync of a journal."""
        return self.journal_dir / "HEADS"

    @property
    def index_path(self) -> Path:
        return self.home / "index.db"

    def journal_path(self, consultation_id: str) -> Path:
        return self.journal_dir / f"{check_consultation_id(consultation_id)}.jsonl"

    def journal_ids(self) -> list[str]:
        """Ids of every journal file, sorted (the order ``index rebuild`` replays them in)."""
        try:
            names = os.listdir(self.journal_dir)  # names, not Path objects: 0.4 s less at 100,000 journals
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(name[: -len(".jsonl")] for name in names if name.endswith(".jsonl"))

    def resolve_id(self, prefix: str) -> str:
        """The consultation whose id is ``prefix`` or starts with it; a usage error when none or several match."""
        ids = self.journal_ids()
        if prefix in ids:
            return prefix
        matches = [i for i in ids if i.startswith(prefix)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise UsageError(f"no consultation {prefix!r} in {self.journal_dir}")
        raise UsageError(f"{prefix!r} is ambiguous: " + ", ".join(matches[:5]) + (" …" if len(matches) > 5 else ""))
