"""The user's context: ``context`` files, a summarised ``project`` directory and stdin, as one bounded text.

A project is summarised as a file tree plus file contents, shallow files first (README and manifests before
deep sources), within fixed bounds: at most 100 files, 100 KB per file (longer files are truncated with a
marker), 1 MB in total. Binaries, dependency/build directories, symlinks leaving the project and secret files
(``.env``, private keys, credential stores, Terraform state: see :func:`is_secret_file`) are skipped. Every file
read, truncated or left out is listed in ``sources`` with its size and how much of it was sent, so the report can
say what the panel saw; :func:`cut_notices` says on stderr, as the consultation starts, what was cut and where.

A file named in ``context`` is sent even if it looks like a secret file: the user asked for it. Like everything
else it goes through the scrubber first (unless ``scrub=false``), which redacts the values it recognises.

A context file may also be a PDF or an image. A PDF's text is extracted (pypdf) and sent to every seat like a text
file, page by page within the same 2 MB bound: the pages beyond it are cut, and its source says which pages were
sent (``pages``). An image (PNG, JPEG, WebP, GIF; at most 5 MB) is kept apart in ``images``: the engine sends it to
the seats whose model accepts images. Any other binary file (``.docx``…) is refused, naming the accepted types.
"""

from __future__ import annotations

import fnmatch
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conclave.errors import ConfigError
from conclave.extras import install_hint
from conclave.providers.base import ImagePart

if TYPE_CHECKING:
    from conclave.config.settings import Settings

MAX_PROJECT_FILES = 100
MAX_FILE_BYTES = 100 * 1024
MAX_TOTAL_BYTES = 1024 * 1024
#: an explicitly named context file may be larger than a project file
MAX_CONTEXT_FILE_BYTES = 2 * 1024 * 1024
#: an attached image is sent whole or not at all: at most this large (Anthropic's limit per image)
MAX_IMAGE_BYTES = 5 * 1024 * 1024
#: what a context file may be besides text, by its leading bytes
IMAGE_SIGNATURES = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF87a", "image/gif"),
                    (b"GIF89a", "image/gif"))
ACCEPTED_TYPES = "text files, PDF (.pdf) and images (.png, .jpg, .jpeg, .webp, .gif)"
#: left-out project files listed one by one; beyond this they are summarised in a single entry
MAX_OMITTED_LISTED = 200

EXCLUDED_DIRS = frozenset({
    ".git", "node_modules", ".venv", "venv", "__pycache__", "dist", "build", "target", ".next", "coverage",
    ".mypy_cache", ".pytest_cache", ".ruff_cache",
})

#: project files left out by name because they typically hold credentials (matched case-insensitively)
SECRET_FILE_PATTERNS = (
    ".env", ".env.*", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "id_rsa*", "id_ed25519*",
    "id_ecdsa*", ".npmrc", ".pypirc", ".netrc", ".git-credentials", ".htpasswd", "credentials.json",
    "service-account*.json", "*.tfstate", "*.tfstate.backup", "*.tfvars", "secrets.y*ml",
)
#: committed templates that document the variables without their values
SECRET_FILE_TEMPLATES = frozenset({".env.example", ".env.sample", ".env.template"})
SECRET_FILE_REASON = "secret file"

_SNIFF_BYTES = 8192


@dataclass(frozen=True)
class ContextBundle:
    """The context text sent with every prompt, and where each part came from.

    ``sources`` entries: ``{path, bytes, sent, truncated, kind, omitted}`` where ``kind`` is ``context_file``,
    ``project_file``, ``stdin``, ``pdf`` or ``image``, ``bytes`` is the size on disk, ``sent`` how many of those
    bytes (from the start; for a PDF, of its extracted text) are in the prompt, and ``omitted`` is null or why it was
    left out. A PDF's entry adds ``pages`` (``"pp. 1–12 of 40"``), ``pages_sent`` and ``pages_total``.
    """

    text: str = ""
    sources: list[dict[str, Any]] = field(default_factory=list)
    images: tuple[ImagePart, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.text

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "sources": [dict(s) for s in self.sources]}


def load_context(settings: Settings, stdin_text: str | None = None) -> ContextBundle:
    """Read ``settings.context`` files, summarise ``settings.project`` and append ``stdin_text``.

    Raises ``ConfigError`` (exit 2) for a missing, unreadable or binary context file or a missing project dir.
    """
    sections: list[str] = []
    sources: list[dict[str, Any]] = []
    images: list[ImagePart] = []
    for name in settings.context:
        section, source, image = _context_file(name)
        sections.append(section)
        sources.append(source)
        if image is not None:
            images.append(image)
    if settings.project is not None:
        section, project_sources = _project(settings.project)
        sections.append(section)
        sources.extend(project_sources)
    if stdin_text:
        data = stdin_text.encode("utf-8")
        body, truncated = _bounded(data, MAX_TOTAL_BYTES)
        sections.append(f"<stdin>\n{body}\n</stdin>")
        sources.append(_source("-", len(data), truncated, "stdin", sent=min(len(data), MAX_TOTAL_BYTES)))
    return ContextBundle("\n\n".join(sections), sources, tuple(images))


def _source(path: str, size: int, truncated: bool, kind: str, omitted: str | None = None,
            sent: int = 0) -> dict[str, Any]:
    return {"path": path, "bytes": size, "sent": sent, "truncated": truncated, "kind": kind, "omitted": omitted}


def cut_notices(sources: list[dict[str, Any]]) -> list[str]:
    """One line for each context file or stdin cut to its limit, and one for the project's cut and left-out files
    (what was cut, where, and how much of it the panel sees)."""
    notices = []
    for s in sources:
        if s["kind"] == "pdf":
            if s["truncated"]:
                notices.append(f"context file {s['path']} has {s['pages_total']} pages: {s['pages']} are sent (the "
                               f"{_size_text(MAX_CONTEXT_FILE_BYTES)} limit of extracted text); the rest is cut")
            if not s["sent"]:
                notices.append(f"context file {s['path']}: no text could be extracted (a scanned PDF?); "
                               "the panel sees none of it")
        elif s["kind"] != "project_file" and s["truncated"]:
            what = "stdin" if s["kind"] == "stdin" else f"context file {s['path']}"
            notices.append(f"{what} is {_size_text(s['bytes'])}: only its first {_size_text(s['sent'])} is sent "
                           f"(the limit); the remaining {_size_text(s['bytes'] - s['sent'])} is cut")
    project = [s for s in sources if s["kind"] == "project_file"]
    cut = [s for s in project if s["truncated"]]
    over = [s for s in project if (s["omitted"] or "").startswith("over the")]
    if cut or over:
        parts = []
        if cut:
            parts.append(f"{len(cut)} file{'s' if len(cut) != 1 else ''} cut to their first bytes "
                         f"({', '.join(s['path'] for s in cut[:3])}{', …' if len(cut) > 3 else ''})")
        if over:
            parts.append(f"files left out over the {MAX_PROJECT_FILES}-file or 1 MB limit "
                         f"(first: {over[0]['path']})")
        sent = sum(s["sent"] for s in project)
        total = sum(s["bytes"] for s in project)
        notices.append(f"project: {'; '.join(parts)}; {_size_text(sent)} of {_size_text(total)} is sent")
    return notices


def _size_text(n: int) -> str:
    for unit, size in (("MB", 1024 * 1024), ("KB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit} ({n:,} bytes)"
    return f"{n:,} bytes"


def _context_file(name: str) -> tuple[str, dict[str, Any], ImagePart | None]:
    path = Path(name).expanduser()
    if not path.exists():
        raise ConfigError([f"context: file not found: {name}"])
    if not path.is_file():
        raise ConfigError([f"context: not a file: {name} (pass a directory as project=…)"])
    data = _read(path, "context", name)
    if data.startswith(b"%PDF-"):
        section, source = _pdf_file(name, data)
        return section, source, None
    media_type = image_type(data)
    if media_type is not None:
        if len(data) > MAX_IMAGE_BYTES:
            raise ConfigError([f"context: {name} is {_size_text(len(data))}, over the "
                               f"{_size_text(MAX_IMAGE_BYTES)} limit for an image"])
        section = f'<image path="{name}" type="{media_type}">attached as an image for models that accept images</image>'
        return section, _source(name, len(data), False, "image", sent=len(data)), ImagePart(name, media_type, data)
    if _is_binary(data):
        raise ConfigError([f"context: {name} is not a supported type; accepted: {ACCEPTED_TYPES}"])
    body, truncated = _bounded(data, MAX_CONTEXT_FILE_BYTES)
    return f'<file path="{name}">\n{body}\n</file>', _source(
        name, len(data), truncated, "context_file", sent=min(len(data), MAX_CONTEXT_FILE_BYTES)
    ), None


def image_type(data: bytes) -> str | None:
    """The media type of an image conclave can attach, from its leading bytes; None for anything else."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((media for magic, media in IMAGE_SIGNATURES if data.startswith(magic)), None)


def _pdf_file(name: str, data: bytes) -> tuple[str, dict[str, Any]]:
    """A PDF's text, page by page, while it stays within the context file bound (the first page is cut to it
    when it alone is larger)."""
    try:
        import pypdf  # the pdf extra: ~26 MiB of RSS that only a consultation with a PDF context file pays
        from pypdf.errors import PyPdfError
    except ImportError:
        raise ConfigError([f"context: {name} is a PDF; reading PDFs needs pypdf: {install_hint('pdf')}"]) from None
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ConfigError([f"context: {name} is an encrypted PDF; decrypt it first"])
        pages: list[str] = []
        total, truncated, any_text = 0, False, False
        for number, page in enumerate(reader.pages, 1):
            text = (page.extract_text() or "").strip()
            any_text = any_text or bool(text)
            chunk = f'<page number="{number}">\n{text}\n</page>'
            size = len(chunk.encode("utf-8"))
            if total + size > MAX_CONTEXT_FILE_BYTES:
                truncated = True
                if not pages:
                    chunk, _ = _bounded(chunk.encode("utf-8"), MAX_CONTEXT_FILE_BYTES)
                    pages.append(chunk)
                    total = MAX_CONTEXT_FILE_BYTES
                break
            pages.append(chunk)
            total += size
        count = len(reader.pages)
    except (PyPdfError, ValueError, KeyError, TypeError, OSError) as exc:
        raise ConfigError([f"context: cannot read {name} as a PDF ({type(exc).__name__})"]) from None
    source = _source(name, len(data), truncated, "pdf", sent=total if any_text else 0)
    source.update(pages=page_range(len(pages), count), pages_sent=len(pages), pages_total=count)
    body = "\n".join(pages)
    return f'<file path="{name}" type="application/pdf" pages="{count}">\n{body}\n</file>', source


def page_range(sent: int, total: int) -> str:
    """``p. 1``, ``pp. 1–12`` or ``pp. 1–12 of 40``: the pages of a PDF that were sent."""
    shown = "p. 1" if sent == 1 else f"pp. 1–{sent}" if sent else "no pages"
    return shown if sent == total else f"{shown} of {total}"


def _read(path: Path, key: str, shown: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError([f"{key}: cannot read {shown}: {exc.strerror or exc}"]) from None


def _is_binary(data: bytes) -> bool:
    return b"\x00" in data[:_SNIFF_BYTES]


def _bounded(data: bytes, limit: int) -> tuple[str, bool]:
    """``data`` as text, cut to ``limit`` bytes (at a character boundary) with a visible marker."""
    if len(data) <= limit:
        return data.decode("utf-8", errors="replace"), False
    head = data[:limit].decode("utf-8", errors="ignore")  # "ignore" drops only a split trailing character
    return f"{head}\n[… truncated by conclave: showing {limit:,} of {len(data):,} bytes]", True


def is_secret_file(filename: str) -> bool:
    """Whether a project file is left out by name (``.env``, ``id_rsa``, ``prod.tfvars``…), not by content."""
    lowered = filename.lower()
    if lowered in SECRET_FILE_TEMPLATES:
        return False
    return any(fnmatch.fnmatchcase(lowered, pattern) for pattern in SECRET_FILE_PATTERNS)


def _project(name: str) -> tuple[str, list[dict[str, Any]]]:
    root = Path(name).expanduser()
    if not root.exists():
        raise ConfigError([f"project: directory not found: {name}"])
    if not root.is_dir():
        raise ConfigError([f"project: not a directory: {name}"])
    real_root = root.resolve()
    included: list[tuple[str, str]] = []  # (relative path, body)
    sources: list[dict[str, Any]] = []
    omitted: list[dict[str, Any]] = []
    total = 0
    for rel, path, reason in _candidates(root, real_root):
        shown = f"{name.rstrip('/')}/{rel}"
        if reason is not None:
            omitted.append(_source(shown, _size(path), False, "project_file", reason))
            continue
        size = _size(path)
        if len(included) >= MAX_PROJECT_FILES:
            omitted.append(_source(shown, size, False, "project_file", f"over the {MAX_PROJECT_FILES}-file limit"))
            continue
        if total >= MAX_TOTAL_BYTES:
            omitted.append(_source(shown, size, False, "project_file", "over the 1 MB total limit"))
            continue
        try:
            data = path.read_bytes()
        except OSError as exc:
            omitted.append(_source(shown, size, False, "project_file", f"unreadable: {exc.strerror or exc}"))
            continue
        if _is_binary(data):
            omitted.append(_source(shown, len(data), False, "project_file", "binary"))
            continue
        body, truncated = _bounded(data, min(MAX_FILE_BYTES, MAX_TOTAL_BYTES - total))
        sent = min(len(data), MAX_FILE_BYTES, MAX_TOTAL_BYTES - total)
        total += sent
        included.append((rel, body))
        sources.append(_source(shown, len(data), truncated, "project_file", sent=sent))
    sources.extend(_listed(omitted, name))
    return _render_project(name, included, len(omitted)), sources


def _listed(omitted: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The omitted entries, with any beyond ``MAX_OMITTED_LISTED`` folded into one summary entry."""
    if len(omitted) <= MAX_OMITTED_LISTED:
        return omitted
    rest = omitted[MAX_OMITTED_LISTED:]
    summary = _source(f"{name.rstrip('/')}/…", sum(s["bytes"] for s in rest), False, "project_file",
                      f"{len(rest)} more files left out (limits, binaries, symlinks or secret files)")
    return [*omitted[:MAX_OMITTED_LISTED], summary]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _candidates(root: Path, real_root: Path) -> Iterator[tuple[str, Path, str | None]]:
    """Every project file as (relative posix path, path, reason to omit or None), shallow files first."""
    found: list[tuple[str, Path, str | None]] = []
    for dirpath, dirnames, filenames in os.walk(root):  # never follows directory symlinks
        here = Path(dirpath)
        keep = []
        for d in sorted(dirnames):
            if d in EXCLUDED_DIRS:
                continue
            if (here / d).is_symlink():
                rel = (here / d).relative_to(root).as_posix()
                found.append((rel, here / d, _symlink_reason(here / d, real_root, "symlinked directory")))
                continue
            keep.append(d)
        dirnames[:] = keep
        for f in filenames:
            path = here / f
            rel = path.relative_to(root).as_posix()
            if is_secret_file(f):
                found.append((rel, path, SECRET_FILE_REASON))  # by name: never read, whatever it links to
                continue
            reason = _symlink_reason(path, real_root, None) if path.is_symlink() else None
            if reason is None and not path.is_file():
                reason = "not a regular file"
            found.append((rel, path, reason))
    found.sort(key=lambda item: (item[0].count("/"), item[0]))
    yield from found


def _symlink_reason(path: Path, real_root: Path, inside: str | None) -> str | None:
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return "broken symlink"
    return inside if target.is_relative_to(real_root) else "symlink outside the project"


def _render_project(name: str, included: list[tuple[str, str]], omitted: int) -> str:
    tree = "\n".join(f"  {rel}" for rel, _ in included)
    note = f"\n  … {omitted} more files left out (limits, binaries, symlinks or secret files)" if omitted else ""
    files = "\n\n".join(f'<file path="{rel}">\n{body}\n</file>' for rel, body in included)
    header = f'<project path="{name}">\nFile tree ({len(included)} files shown):\n{tree}{note}'
    return f"{header}\n\n{files}\n</project>" if files else f"{header}\n</project>"


__all__ = ["ACCEPTED_TYPES", "EXCLUDED_DIRS", "SECRET_FILE_PATTERNS", "ContextBundle", "cut_notices", "image_type",
           "is_secret_file", "load_context", "page_range"]
