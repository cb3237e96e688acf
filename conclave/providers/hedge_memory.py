"""What hedging remembers between processes: each (provider, model)'s recent latencies and the hedge budget.

One small JSON file, ``$CONCLAVE_HOME/hedging.json``::

    {"version": 1,
     "budget": {"tokens": 1.45},                          # the token bucket shared by every process of this home
     "latency": {"openai gpt-4o": [0.412, 0.388, ...]}}   # seconds, oldest first, successful attempts only

Bounds: the last :data:`SAMPLES_PER_MODEL` latencies per (provider, model) and the :data:`MAX_MODELS` most recently
used models, so the file stays under ~100 KB whatever the history. A process reads it once, when its provider pool
opens (one small file, no lock); it adds its new latencies when the pool closes, and it takes budget tokens at the
moment it is about to hedge. Every write is a read-merge-replace under an exclusive ``flock`` on
``hedging.json.lock`` and an atomic rename, so concurrent processes neither corrupt the file nor lose each other's
samples or spend the same token twice (where ``flock`` does not exist, the rename still keeps the file whole). An
unreadable file is treated as empty and an unwritable one only costs the memory: hedging state is advisory and
never fails a consultation (nor adds a line to its stderr: failures are logged at debug level).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FILE_NAME = "hedging.json"
#: latency samples kept per (provider, model): the same window the in-process history keeps
SAMPLES_PER_MODEL = 200
#: (provider, model) pairs kept; the least recently updated are dropped first
MAX_MODELS = 64
VERSION = 1


def _key(provider: str, model: str) -> str:
    return f"{provider} {model}"


class HedgeMemory:
    """The hedging file of one home. ``load()`` once; ``note()`` each successful latency; ``take_token()`` before
    a hedge; ``flush()`` when the pool closes."""

    def __init__(self, home: Path) -> None:
        self.path = Path(home) / FILE_NAME
        self._new: dict[str, list[float]] = {}
        self._accrued = 0.0  # budget tokens earned by this process's calls and not yet written

    # ------------------------------------------------------------------------------------- reading

    def load(self) -> dict[tuple[str, str], list[float]]:
        """The remembered latencies per (provider, model), oldest first; empty when the file is missing or bad."""
        data = self._read()
        out: dict[tuple[str, str], list[float]] = {}
        for key, samples in data["latency"].items():
            provider, _, model = key.partition(" ")
            out[(provider, model)] = samples
        return out

    def tokens(self, burst: float) -> float:
        """The bucket's tokens as the file has them (a new home starts full)."""
        return self._bucket(self._read(), burst)

    # ------------------------------------------------------------------------------------- recording

    def note(self, provider: str, model: str, latency_s: float) -> None:
        """One successful attempt's latency, written at the next :meth:`flush`."""
        self._new.setdefault(_key(provider, model), []).append(round(latency_s, 3))

    def accrue(self, tokens: float) -> None:
        """Budget earned by a call started in this process, written with the next token taken or flush."""
        self._accrued += tokens

    def take_token(self, burst: float) -> bool:
        """Spend one budget token if the shared bucket (plus what this process earned since it last wrote) has
        one. Atomic across processes."""
        try:
            with self._locked() as data:
                tokens = min(burst, self._bucket(data, burst) + self._accrued)
                self._accrued = 0.0
                granted = tokens >= 1.0 - 1e-9
                data["budget"] = {"tokens": round(tokens - 1.0 if granted else tokens, 6)}
                return granted
        except OSError as exc:
            log.debug("cannot update the hedge budget in %s: %s", self.path, exc)
            return False

    def flush(self, burst: float) -> None:
        """Merge this process's new latencies and earned tokens into the file."""
        if not self._new and not self._accrued:
            return
        try:
            with self._locked() as data:
                latency: dict[str, list[float]] = data["latency"]
                for key, samples in self._new.items():
                    merged = [*latency.pop(key, []), *samples][-SAMPLES_PER_MODEL:]
                    latency[key] = merged  # re-inserted last: the most recently used
                while len(latency) > MAX_MODELS:
                    del latency[next(iter(latency))]
                data["budget"] = {"tokens": round(min(burst, self._bucket(data, burst) + self._accrued), 6)}
        except OSError as exc:
            log.debug("cannot remember hedging latencies in %s: %s", self.path, exc)
            return
        self._new.clear()
        self._accrued = 0.0

    # ------------------------------------------------------------------------------------- the file

    @staticmethod
    def _bucket(data: dict[str, Any], burst: float) -> float:
        tokens = data["budget"].get("tokens")
        if not isinstance(tokens, int | float) or not math.isfinite(tokens):
            return burst
        return max(0.0, min(burst, float(tokens)))

    def _read(self) -> dict[str, Any]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raw = None
        return _clean(raw)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """The file's data under an exclusive lock; written back (atomically) when the block ends normally."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(FILE_NAME + ".lock"), "a+b") as lock:
            try:
                import fcntl

                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            except ImportError:  # pragma: no cover - Windows: the atomic rename alone keeps the file whole
                pass
            data = self._read()
            yield data
            fd, tmp = tempfile.mkstemp(prefix=".hedging.", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump({"version": VERSION, **data}, handle, separators=(",", ":"))
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise


def _clean(raw: Any) -> dict[str, Any]:
    """The file's content with anything malformed dropped (a hand-edited or foreign file never breaks a run)."""
    data: dict[str, Any] = {"budget": {}, "latency": {}}
    if not isinstance(raw, dict) or raw.get("version") != VERSION:
        return data
    if isinstance(raw.get("budget"), dict):
        data["budget"] = raw["budget"]
    latency = raw.get("latency")
    if isinstance(latency, dict):
        for key, samples in latency.items():
            if isinstance(key, str) and " " in key and isinstance(samples, list):
                kept = [float(s) for s in samples if isinstance(s, int | float) and math.isfinite(s) and s >= 0]
                if kept:
                    data["latency"][key] = kept[-SAMPLES_PER_MODEL:]
    return data
