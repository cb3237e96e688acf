"""The heads log: the last durable (seq, hash) of each journal, kept apart so truncating a journal's tail shows.

One append-only file shared by every process; each line (``consultation_id seq hash``) is far below PIPE_BUF
and written with a single ``O_APPEND`` write, so concurrent writers never interleave within a line.
"""

from __future__ import annotations

import os
from pathlib import Path


class HeadsLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, consultation_id: str, seq: int, hash_: str) -> None:
        """Record a durable head (fsynced before returning)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{consultation_id} {seq} {hash_}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def load(self, consultation_id: str | None = None) -> dict[str, list[tuple[int, str]]]:
        """Every head recorded (for one consultation, or all), in the order written. A torn last line is ignored."""
        heads: dict[str, list[tuple[int, str]]] = {}
        prefix = None if consultation_id is None else consultation_id + " "
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return heads
        for line in text.splitlines():
            if prefix is not None and not line.startswith(prefix):
                continue
            parts = line.split(" ")
            if len(parts) != 3 or len(parts[2]) != 64 or not parts[1].isdigit():
                continue
            heads.setdefault(parts[0], []).append((int(parts[1]), parts[2]))
        return heads
