"""What an OpenAI chat request asks of the council, read from its model name and messages.

- The model is ``conclave/<panel>`` or ``conclave/<panel>/<mode>``, with a registered panel and mode (the guard
  checks them again when the request is composed); anything else is a 404 ``model_not_found``.
- The last message is the user's question. System (and developer) text and the earlier turns are context: they go
  the way of any inline text context (size bounds, secret scrubbing).
- A conversation that goes on after an answer of this server is a follow-up of that consultation: the answer
  carries its id in the ``conclave`` field of the message (clients that send the message back as they got it) or
  in its last line (``— conclave c-…``, for clients that send back only the text). The parent must be a
  consultation of this server's home; the turns up to its answer are then left out (the follow-up gives the panel
  the parent's verdict, dissent and debate state instead).

Every refusal is an :class:`ApiError`: an HTTP status and an OpenAI-style error body of one line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MODEL_PREFIX = "conclave/"
#: a consultation id (``conclave.engine.ids.new_consultation_id``)
CONSULTATION_ID = re.compile(r"c-[0-9a-z]{12}")
#: the last line of every answer this server gives names its consultation
ANSWER_MARK = re.compile(r"— conclave (c-[0-9a-z]{12})\b")
#: roles whose text is context; ``user`` turns before the last one are context too
CONTEXT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
#: roles kept as context of a follow-up whatever their place in the conversation
STANDING_ROLES = frozenset({"system", "developer"})
#: how much of a caller's value an error quotes
QUOTE_LIMIT = 60


class ApiError(Exception):
    """A request refused with ``status`` and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 kind: str = "invalid_request_error", extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return {"error": {**error, **self.extra}}


@dataclass(frozen=True)
class ChatRequest:
    model: str
    panel: str
    mode: str | None
    question: str
    context: str | None
    parent: str | None
    stream: bool

    def overrides(self) -> list[str]:
        """The overrides the request stands for; they pass the door's guard like any caller's value."""
        out = [f"agents={self.panel}"]
        if self.mode is not None:
            out.append(f"mode={self.mode}")
        if self.parent is not None:
            out.append(f"parent={self.parent}")
        return out


def model_names(groups: Mapping[str, Sequence[str]]) -> list[str]:
    """Every model this server answers to: a model per panel, and one per panel and mode."""
    names = []
    for panel in groups.get("agents", ()):
        names.append(f"{MODEL_PREFIX}{panel}")
        names.extend(f"{MODEL_PREFIX}{panel}/{mode}" for mode in groups.get("mode", ()))
    return names


def parse_model(model: Any, groups: Mapping[str, Sequence[str]]) -> tuple[str, str | None]:
    """``conclave/<panel>[/<mode>]`` → (panel, mode or None); a 404 for any other name."""
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model: required, a string such as conclave/default", param="model")
    panel, _, mode = model.removeprefix(MODEL_PREFIX).partition("/")
    if (model.startswith(MODEL_PREFIX) and panel in groups.get("agents", ())
            and (not mode or mode in groups.get("mode", ()))):
        return panel, mode or None
    raise ApiError(404, f"model: {_quote(model)} is not a model of this server; GET /v1/models lists them "
                        "(conclave/<panel> or conclave/<panel>/<mode>)", code="model_not_found", param="model")


def parse_chat(body: Any, groups: Mapping[str, Sequence[str]], known: Callable[[str], bool]) -> ChatRequest:
    """The request ``body`` (parsed JSON) as a :class:`ChatRequest`; ``known(id)``: whether a consultation of
    this server's home has that id. Parameters other than model, messages and stream are accepted and ignored:
    the panel's own settings decide temperature, lengths and the rest."""
    if not isinstance(body, Mapping):
        raise ApiError(400, "the request body must be a JSON object with model and messages")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "stream: must be true or false", param="stream")
    panel, mode = parse_model(body.get("model"), groups)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages: required, a non-empty list of {role, content}", param="messages")
    turns = [_turn(number, message) for number, message in enumerate(messages)]
    role, question = turns[-1]
    if role != "user" or not question.strip():
        raise ApiError(400, "messages: the last message must be the user's question (role user, with text)",
                       param="messages")
    parent, after = _parent(messages, known)
    context = [f"[{role}]\n{text}" for number, (role, text) in enumerate(turns[:-1])
               if text.strip() and (number > after or role in STANDING_ROLES)]
    return ChatRequest(model=str(body["model"]), panel=panel, mode=mode, question=question,
                       context="\n\n".join(context) or None, parent=parent, stream=stream)


def _turn(number: int, message: Any) -> tuple[str, str]:
    """(role, text) of one message; text parts are joined, other parts are refused."""
    where = f"messages[{number}]"
    if not isinstance(message, Mapping):
        raise ApiError(400, f"{where}: must be an object with role and content", param=where)
    role = message.get("role")
    if role not in CONTEXT_ROLES:
        raise ApiError(400, f"{where}.role: must be one of: {', '.join(sorted(CONTEXT_ROLES))}",
                       param=f"{where}.role")
    content = message.get("content")
    if content is None:
        return role, ""
    if isinstance(content, str):
        return role, content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ApiError(400, f"{where}.content: only text parts are accepted", param=f"{where}.content")
            texts.append(part["text"])
        return role, "\n".join(texts)
    raise ApiError(400, f"{where}.content: must be a string or a list of text parts", param=f"{where}.content")


def _parent(messages: list[Any], known: Callable[[str], bool]) -> tuple[str | None, int]:
    """The consultation the conversation continues (the latest answer of this server in it) and that answer's
    position; (None, -1) when there is none."""
    for number in range(len(messages) - 2, -1, -1):
        message = messages[number]
        if message.get("role") != "assistant":
            continue
        cid = answer_id(message)
        if cid is not None and known(cid):
            return cid, number
    return None, -1


def answer_id(message: Mapping[str, Any]) -> str | None:
    """The consultation id an assistant message of this server carries, if any."""
    extra = message.get("conclave")
    if isinstance(extra, Mapping) and isinstance(extra.get("id"), str) and CONSULTATION_ID.fullmatch(extra["id"]):
        return str(extra["id"])
    content = message.get("content")
    if isinstance(content, str):
        marks = ANSWER_MARK.findall(content)
        return marks[-1] if marks else None
    return None


def _quote(value: str) -> str:
    return repr(value if len(value) <= QUOTE_LIMIT else value[: QUOTE_LIMIT - 1] + "…")
