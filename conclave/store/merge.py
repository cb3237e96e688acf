"""Merge the journals of several data homes into one (``conclave index merge HOME…``), then rebuild and verify.

Distributed sweeps journal each worker to its own home; merging copies every journal (and its heads-log lines,
in their order) and every evaluation run directory into the target home. A journal already there with the same
bytes is skipped; one with different bytes is a conflict and nothing of it is copied. A journal still being
written is refused. The index is then rebuilt from the journals, so it holds exactly what they hold, and every
journal's hash chain is verified against its heads.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from conclave.errors import StorageError, UsageError
from conclave.eval.run_store import reindex
from conclave.store.heads import HeadsLog
from conclave.store.journal import is_being_written
from conclave.store.paths import StoreLayout
from conclave.store.sqlite_index import rebuild
from conclave.store.verify import verify_store


@dataclass
class MergeReport:
    copied: int = 0
    skipped: int = 0
    eval_runs: int = 0
    conflicts: list[str] = field(default_factory=list)
    consultations: int = 0
    verified: bool = False
    problems: list[str] = field(default_factory=list)


def merge_homes(target: Path, sources: list[Path]) -> MergeReport:
    layout = StoreLayout(Path(target))
    report = MergeReport()
    if layout.home.is_dir() and not os.access(layout.home, os.W_OK):
        raise StorageError(f"cannot merge into {layout.home}: the directory is read-only")
    for source in sources:
        source_layout = StoreLayout(Path(source))
        if not source_layout.journal_dir.is_dir() and not (Path(source) / "eval").is_dir():
            raise UsageError(f"{source}: not a conclave data home (no journal/ or eval/ directory)")
        if Path(source).resolve() == Path(target).resolve():
            raise UsageError(f"{source}: is the target home itself")
        heads = HeadsLog(source_layout.heads_path).load()
        target_heads = HeadsLog(layout.heads_path)
        for cid in source_layout.journal_ids():
            src = source_layout.journal_path(cid)
            if is_being_written(src):
                raise UsageError(f"{cid}: its journal in {source} is still being written; merge when it has ended")
            dst = layout.journal_path(cid)
            data = src.read_bytes()
            if dst.exists():
                if dst.read_bytes() == data:
                    report.skipped += 1
                else:
                    report.conflicts.append(f"{cid}: differs between {source} and {target}; not merged")
                continue
            try:
                _write_atomically(dst, data)
            except OSError as exc:
                raise StorageError(f"cannot write {dst}: {exc.strerror or exc}") from None
            for seq, hash_ in heads.get(cid, []):
                target_heads.append(cid, seq, hash_)
            report.copied += 1
        report.eval_runs += _merge_eval(Path(source), Path(target), report)

    rebuilt = rebuild(layout)
    report.consultations = rebuilt.consultations

    reindex(layout.home)
    verified = verify_store(layout, workers=None)  # a command of its own, as `logs verify`: every core
    report.verified = verified.ok
    report.problems = [str(p) for p in verified.problems]
    return report


def _merge_eval(source: Path, target: Path, report: MergeReport) -> int:
    root = source / "eval"
    if not root.is_dir():
        return 0
    merged = 0
    for run in sorted(p for p in root.iterdir() if (p / "run.json").is_file()):
        dst = target / "eval" / run.name
        if dst.exists():
            same = all((dst / f.name).is_file() and (dst / f.name).read_bytes() == f.read_bytes()
                       for f in run.iterdir() if f.is_file() and not f.name.startswith("."))
            if not same:
                report.conflicts.append(f"eval run {run.name}: differs between {source} and {target}; not merged")
            continue
        tmp = Path(tempfile.mkdtemp(dir=_mkdir(dst.parent), prefix=".merge."))
        for f in run.iterdir():
            if f.is_file() and not f.name.startswith("."):
                shutil.copyfile(f, tmp / f.name)
        os.replace(tmp, dst)
        merged += 1
    return merged


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".merge.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
