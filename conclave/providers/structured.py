"""How an endpoint is asked for structured output, and what each (base URL, model) turned out to accept.

OpenAI-compatible servers differ: api.openai.com takes ``response_format: json_schema`` in strict mode, vLLM and
llama.cpp's ``llama-server`` take ``json_schema`` with a raw schema, llama-cpp-python's server rejects
``json_schema`` but takes ``json_object`` with a ``schema`` it turns into a grammar, and some servers take neither.
With ``providers.<name>.structured_output: auto`` a provider starts with the best form and, when the server rejects
it (by status *and* message: a 400, 422 or 500 that names the form), moves once to the next one inside the same
attempt. A rejected form is not retried, is not counted as a provider failure, and the form that worked is kept in
``$CONCLAVE_HOME/structured_output.json`` so later runs start with it.

Forms, best first: ``json_schema`` → ``json_object`` (with the schema where the server takes one) → ``prompt`` (the
schema is written into the request and the JSON is extracted from the text). ``off`` asks for nothing.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from conclave.config.home import default_home

log = logging.getLogger(__name__)

#: the negotiation order of ``auto``
FORMS: tuple[str, ...] = ("json_schema", "json_object", "prompt")
#: statuses a server uses to reject a request parameter (llama-cpp-python answers 500 to an unknown form)
REJECTION_STATUSES = frozenset({400, 415, 422, 500, 501})
#: words in an error message that tie a rejection to the structured-output parameter rather than to the prompt
_FORM_WORDS = re.compile(r"response_format|json_schema|json_object|response format|\bschema\b|grammar|guided",
                         re.IGNORECASE)
MEMORY_FILE = "structured_output.json"


def next_forms(configured: str, remembered: str | None) -> list[str]:
    """The forms to try, in order: the configured one alone, or (``auto``) the remembered one and those after it."""
    if configured != "auto":
        return [configured]
    start = FORMS.index(remembered) if remembered in FORMS else 0
    return list(FORMS[start:])


def is_rejection(status: int | None, message: str) -> bool:
    """Whether an error answer says the server does not take the structured-output form it was sent."""
    return status in REJECTION_STATUSES and bool(_FORM_WORDS.search(message))


def prompt_instruction(schema: Mapping[str, Any]) -> str:
    """What the ``prompt`` form appends to the last user message: the whole schema, constraints included."""
    text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    return ("Answer with one JSON object only, with no text before or after it. The object must validate against "
            f"this JSON Schema:\n```json\n{text}\n```")


@functools.lru_cache(maxsize=256)
def is_local_url(url: str | None) -> bool:
    """A server on this machine or the local network (loopback, private or link-local address, ``localhost``,
    ``*.local``): calls to it cost nothing and it usually serves one request at a time."""
    if not url:
        return False
    host = (urlsplit(url).hostname or "").lower()
    if host in ("localhost", "host.docker.internal") or host.endswith((".localhost", ".local")):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local or address.is_unspecified


class FormMemory:
    """What each (base URL, model) accepted, in ``$CONCLAVE_HOME/structured_output.json``.

    Reads are cached per process; a write replaces the file atomically. An unreadable or unwritable file only
    costs a renegotiation, never a consultation: errors are logged and ignored.
    """

    def __init__(self, home: Path | None = None) -> None:
        self.home = home
        self._lock = threading.Lock()
        self._data: dict[str, str] | None = None

    @property
    def path(self) -> Path:
        return (self.home or default_home()) / MEMORY_FILE

    @staticmethod
    def key(base_url: str, model: str) -> str:
        return f"{base_url.rstrip('/')} {model}"

    def _load(self) -> dict[str, str]:
        if self._data is None:
            try:
                raw = json.loads(self.path.read_text(encoding="utf-8"))
                self._data = {str(k): str(v) for k, v in raw.items() if v in FORMS} if isinstance(raw, dict) else {}
            except (OSError, ValueError):
                self._data = {}
        return self._data

    def get(self, base_url: str, model: str) -> str | None:
        with self._lock:
            return self._load().get(self.key(base_url, model))

    def remember(self, base_url: str, model: str, form: str) -> None:
        with self._lock:
            data = self._load()
            key = self.key(base_url, model)
            if data.get(key) == form:
                return
            data[key] = form
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=".structured_output.", dir=self.path.parent)
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump(data, handle, indent=1, sort_keys=True)
                os.replace(tmp, self.path)
            except OSError as exc:
                log.warning("cannot remember the structured-output form in %s: %s", self.path, exc)


_MEMORIES: dict[str, FormMemory] = {}


def memory_for(environ: Mapping[str, str]) -> FormMemory:
    """The process-wide memory of the home ``environ`` names (``CONCLAVE_HOME``, else ``~/.conclave``)."""
    home = Path(environ["CONCLAVE_HOME"]).expanduser() if environ.get("CONCLAVE_HOME") else default_home()
    key = str(home)
    found = _MEMORIES.get(key)
    if found is None:
        found = _MEMORIES[key] = FormMemory(home)
    return found
