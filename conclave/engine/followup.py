"""Follow-up questions: a consultation run with ``parent=ID`` continues a finished one.

The parent must resolve to exactly one consultation of the home and pass ``conclave logs verify``; the follow-up
keeps the parent's panel (agents, judge, personas) and mode unless the given overrides choose them. The panel sees
the parent's verdict, dissent and debate state (claims by id and status) as a compact block at the head of the
context, never the raw transcript.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from conclave import events as ev
from conclave.config.settings import Settings, settings_from_container
from conclave.errors import ConclaveError, ConfigError, StorageError, UsageError
from conclave.store.heads import key_from_env
from conclave.store.journal import JournalError, read_records
from conclave.store.paths import StoreLayout
from conclave.store.verify import verify_store

#: the claims the block lists at most (the newest first kept), and each claim's words
MAX_CLAIMS = 30
CLAIM_WORDS = 16
#: what a follow-up's parent must have ended with: a verdict to follow up on
FINISHED = ("complete", "completed_degraded")


@dataclass(frozen=True)
class ParentRecord:
    """What a follow-up reads of its parent: its id, its recorded configuration and its result."""

    id: str
    config: dict[str, Any]
    result: dict[str, Any]


def load_parent(layout: StoreLayout, ref: str, *, verify: bool = True) -> ParentRecord:
    """The parent ``ref`` names, verified as ``conclave logs verify`` does; one-line errors: unknown, ambiguous,
    failing verification or unfinished (exit 2), unreadable (exit 1)."""
    try:
        cid = layout.resolve_id(ref)
    except UsageError as exc:  # the store's wording, named as the parent key
        raise ConfigError([f"parent: {exc}"]) from None
    try:
        if verify:
            report = verify_store(layout, [cid], key=key_from_env())
            if not report.ok:
                raise ConfigError([f"parent: {cid} fails `conclave logs verify` ({report.problems[0]}); a follow-up "
                                   "builds only on an intact record"])
        records = read_records(layout.journal_path(cid))
    except OSError as exc:
        raise StorageError(f"parent: cannot read the journal of {cid}: {exc.strerror or exc}") from None
    except (JournalError, ValueError) as exc:
        raise ConfigError([f"parent: {cid} fails `conclave logs verify` ({exc})"]) from None
    started = next((r for r in records if r.get("type") == ev.CONSULTATION_STARTED), None)
    final = next((r for r in reversed(records) if r.get("type") == ev.CONSULTATION_COMPLETED), None)
    status = (final or {}).get("data", {}).get("status")
    if started is None or final is None or status not in FINISHED:
        raise ConfigError([f"parent: {cid} has no verdict to follow up on (status {status or 'unfinished'}); "
                           f"`conclave resume {cid}` finishes it first"])
    config = dict((started.get("data") or {}).get("config") or {})
    order = [str(a.get("name")) for a in (started.get("data") or {}).get("agents") or [] if isinstance(a, dict)]
    agents = config.get("agents")
    if isinstance(agents, dict) and sorted(order) == sorted(agents):  # the journal sorts keys; keep panel order
        config["agents"] = {name: agents[name] for name in order}
    return ParentRecord(cid, config, dict(final["data"].get("result") or {}))


def overridden(given: Iterable[str]) -> set[str]:
    """The top-level keys (and config groups) the given overrides set: ``agents.x.model=…`` and ``agents=local``
    both name ``agents``, ``persona@personas.x=…`` names ``personas``."""
    keys = set()
    for override in given:
        key = override.lstrip("+~").partition("=")[0]
        group, _, package = key.partition("@")
        keys.add((package or group).split(".")[0].split("/")[0])
    return keys


def with_parent(settings: Settings, given: Iterable[str]) -> Settings:
    """``settings`` of a follow-up: ``parent`` resolved to the full id, and the parent's panel and mode wherever
    ``given`` (the overrides the caller chose) does not set them. Unchanged when ``parent`` is null."""
    if settings.parent is None:
        return settings
    parent = load_parent(StoreLayout(settings.home), settings.parent)
    chosen = overridden(given)
    if "agents" in chosen:
        chosen.add("judge")  # a panel of the caller's own comes with its own judge (or the one it implies)
    data = settings.model_dump(mode="json")
    for key in ("agents", "judge", "mode"):
        if key not in chosen and key in parent.config:
            data[key] = parent.config[key]
    if "personas" not in chosen:  # the personas the parent's panel plays, beside the ones composed now
        data["personas"] = {**data["personas"], **(parent.config.get("personas") or {})}
    # endpoints stay this run's own (keys and URLs are the caller's); a provider only the parent knew comes along
    data["providers"] = {**(parent.config.get("providers") or {}), **data["providers"]}
    data["parent"] = parent.id
    data["home"] = str(settings.home)
    return settings_from_container(data)


def cfg_note(layout: StoreLayout, ref: str, given: Iterable[str]) -> str:
    """One YAML comment line for ``conclave --cfg job parent=ID``: Hydra prints the configuration as composed,
    before a follow-up takes its parent's panel and mode (:func:`with_parent`); this line says what the run would
    take from the parent instead, or why a run with this parent would be refused."""
    try:
        parent = load_parent(layout, ref)
    except ConclaveError as exc:
        return f"# {_one_line(exc)} (a run with this parent is refused)"
    chosen = overridden(given)
    if "agents" in chosen:
        chosen.add("judge")
    taken = []
    agents = parent.config.get("agents")
    if "agents" not in chosen and isinstance(agents, dict):
        seats = ", ".join(f"{name} ({(a or {}).get('provider')}/{(a or {}).get('model')})" if isinstance(a, dict)
                          else str(name) for name, a in agents.items())
        taken.append(f"agents: {seats}")
    judge = parent.config.get("judge")
    if "judge" not in chosen and isinstance(judge, dict):
        taken.append(f"judge: {judge.get('provider')}/{judge.get('model')}")
    mode = parent.config.get("mode")
    if "mode" not in chosen and mode:
        taken.append(f"mode: {mode.get('strategy') if isinstance(mode, dict) else mode}")
    if not taken:
        return f"# parent={parent.id}: the overrides choose the panel and mode, as shown above"
    return (f"# parent={parent.id}: the run replaces the above with the parent's {'; '.join(taken)}")


def parent_block(settings: Settings) -> str:
    """The compact context a follow-up's panel sees of its parent: question, verdict, dissent and the debate
    state's claims with their ids and statuses. Empty when ``parent`` is null."""
    if settings.parent is None:
        return ""
    parent = load_parent(StoreLayout(settings.home), settings.parent, verify=False)
    return render_block(parent)


def render_block(parent: ParentRecord) -> str:
    result = parent.result
    lines = [f"EARLIER CONSULTATION {parent.id} (this question follows up on it)",
             f"Earlier question: {_one_line(result.get('question') or parent.config.get('question'))}"]
    confidence = result.get("confidence")
    shown = f" (confidence {confidence:.0%})" if isinstance(confidence, int | float) else ""
    lines.append(f"Verdict{shown}: {_one_line(result.get('recommendation')) or '(none)'}")
    dissent = [d for d in result.get("dissent") or [] if isinstance(d, dict)]
    if dissent:
        lines.append("Dissent:")
        lines += [f"- {d.get('agent', '?')} ({d.get('severity', '?')}): {_one_line(d.get('concern'))}"
                  for d in dissent]
    claims = [c for c in ((result.get("quality") or {}).get("state") or {}).get("claims") or []
              if isinstance(c, dict)]
    if claims:
        kept = claims[-MAX_CLAIMS:]
        lines.append("Debate state (claim id [label, status]: claim):")
        if len(kept) < len(claims):
            lines.append(f"- … {len(claims) - len(kept)} older claim(s) left out")
        for c in kept:
            words = str(c.get("text") or "").split()
            text = " ".join(words[:CLAIM_WORDS]) + (" …" if len(words) > CLAIM_WORDS else "")
            lines.append(f"- {c.get('id')} [{c.get('label')}, {c.get('status')}]: {text}")
    return "\n".join(lines)


def _one_line(value: Any) -> str:
    return " ".join(str(value or "").split())
