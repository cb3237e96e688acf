"""Labelled claims and numeric citations: the one parser of the inline format, and the citation rules.

Artifacts carry claims as structured fields (``claims: [{id, text, label, citations}]`` and
``references: [{id, title, url?, snippet?}]``). Text that arrives as prose — a ``prose_excerpt``, a rationale, a
whole prose answer — may use the inline format instead::

    Billing writes 40k events a day.[FACT][1] Replays stay cheap at that volume.[INFER][1-2]
    Product wants audit trails.[ASSUME]

    References:
    [1] Billing dashboard, 2026. https://example.com/dash
    [2] Fowler (2005). Event Sourcing.

Citations are ``[1]``, ``[1][2]``, ``[1-3]`` (a range) or ``[1, 2]``; the ``References:`` section ends the text.

The rules, checked after schema validation and never fatal: every FACT cites at least one reference; an ASSUME
cites none; every cited number is a listed reference (no orphan citation); every listed reference is cited (no
unused reference).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

LABELS = ("FACT", "INFER", "ASSUME")
_RANGE_CAP = 50  # a range wider than this is a typo, not a citation of 50 sources

_CITE = r"\[\s*\d+(?:\s*[-–]\s*\d+)?(?:\s*,\s*\d+(?:\s*[-–]\s*\d+)?)*\s*\]"
_CITATION = re.compile(_CITE)
_CLAIM = re.compile(
    r"(?P<text>(?:[^.!?\n\[\]]|[.](?=\d))+?)\s*(?P<end>[.!?]?)\s*\[(?P<label>FACT|INFER|ASSUME)\]"
    rf"(?P<cites>(?:\s*{_CITE})*)",
    re.IGNORECASE,
)
_REFERENCES = re.compile(r"^[ \t]*(?:#+[ \t]*)?(?:\*\*)?references(?:\*\*)?[ \t]*:?(?:\*\*)?[ \t]*$",
                         re.IGNORECASE | re.MULTILINE)
_REFERENCE_LINE = re.compile(r"^\s*(?:\[(?P<a>\d+)\]|(?P<b>\d+)[.)])\s*(?P<rest>.+?)\s*$")
_URL = re.compile(r"https?://[^\s<>()\"']+")


@dataclass(frozen=True)
class InlineClaim:
    text: str
    label: str
    citations: tuple[int, ...]


@dataclass(frozen=True)
class InlineReference:
    id: int
    title: str
    url: str | None = None


@dataclass(frozen=True)
class InlineAnswer:
    """What :func:`parse_inline` found: the labelled claims, every number cited in the body, the references."""

    claims: list[InlineClaim]
    cited: list[int]
    references: list[InlineReference]

    def as_fields(self) -> dict[str, Any]:
        """The claims and references as the artifacts' structured fields (claim ids 1, 2, … in text order)."""
        return {
            "claims": [{"id": str(i), "text": c.text, "label": c.label, "citations": list(c.citations)}
                       for i, c in enumerate(self.claims, 1)],
            "references": [{k: v for k, v in asdict(r).items() if v is not None} for r in self.references],
        }


def citation_numbers(text: str) -> list[int]:
    """Every reference number in ``[1]``, ``[1][2]``, ``[1-3]``, ``[1, 2]`` groups of ``text``, in order, once."""
    out: list[int] = []
    for match in _CITATION.finditer(text):
        for part in match.group(0).strip("[] ").split(","):
            bounds = [int(b) for b in re.split(r"[-–]", part) if b.strip()]
            first, last = bounds[0], bounds[-1]
            if last < first or last - first > _RANGE_CAP:
                last = first
            out.extend(n for n in range(first, last + 1) if n not in out)
    return out


def split_references(text: str) -> tuple[str, list[InlineReference]]:
    """The body before a ``References:`` section, and the references listed in it."""
    headings = list(_REFERENCES.finditer(text))
    if not headings:
        return text, []
    heading = headings[-1]  # the last one: an earlier "References" line may be part of the prose
    references: list[InlineReference] = []
    for line in text[heading.end():].splitlines():
        match = _REFERENCE_LINE.match(line)
        if match is None:
            continue
        rest = match.group("rest")
        url = _URL.search(rest)
        title = _URL.sub("", rest).strip(" .,;-–") or rest.strip()
        number = int(match.group("a") or match.group("b"))
        if all(r.id != number for r in references):
            references.append(InlineReference(number, title, url.group(0).rstrip(".,;") if url else None))
    return text[:heading.start()], references


def parse_inline(text: str) -> InlineAnswer:
    """The labelled claims, cited numbers and references of a prose answer in the inline format."""
    body, references = split_references(text)
    claims = []
    for match in _CLAIM.finditer(body):
        claim_text = match.group("text").strip(" \t-*•")
        if claim_text:
            claims.append(InlineClaim(claim_text + (match.group("end") or ""), match.group("label").upper(),
                                      tuple(citation_numbers(match.group("cites")))))
    without_labels = re.sub(r"\[(?:FACT|INFER|ASSUME)\]", " ", body, flags=re.IGNORECASE)
    return InlineAnswer(claims, citation_numbers(without_labels), references)


# ------------------------------------------------------------------------------------------------ the rules


@dataclass(frozen=True)
class RuleViolation:
    """One broken rule: a citation rule (fact_uncited | assume_cited | orphan_citation | unused_reference) or a
    synthesis coverage rule (claim_unaccounted | position_unaccounted, :mod:`conclave.quality.coverage`)."""

    rule: str
    detail: str
    claim: str | None = None
    reference: int | None = None
    agent: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


RULES = ("fact_uncited", "assume_cited", "orphan_citation", "unused_reference")


def check_rules(claims: Iterable[Mapping[str, Any]], references: Iterable[Mapping[str, Any]]) -> list[RuleViolation]:
    """Every violation of the citation rules by ``claims`` against ``references`` (structured fields)."""
    listed = {int(r["id"]) for r in references if isinstance(r.get("id"), int)}
    cited: set[int] = set()
    out: list[RuleViolation] = []
    for claim in claims:
        cid, label = str(claim.get("id", "")), str(claim.get("label", ""))
        numbers = [n for n in claim.get("citations") or [] if isinstance(n, int)]
        cited.update(numbers)
        if label == "FACT" and not numbers:
            out.append(RuleViolation("fact_uncited", "a FACT claim cites no reference", claim=cid))
        if label == "ASSUME" and numbers:
            out.append(RuleViolation("assume_cited", "an ASSUME claim must not carry citations", claim=cid))
        for n in numbers:
            if n not in listed:
                out.append(RuleViolation("orphan_citation", f"[{n}] is cited but not listed in references",
                                         claim=cid, reference=n))
    for n in sorted(listed - cited):
        out.append(RuleViolation("unused_reference", f"reference [{n}] is listed but never cited", reference=n))
    return out


def inline_problems(answer: InlineAnswer) -> list[RuleViolation]:
    """The rules applied to a prose answer: its claims, plus numbers cited anywhere in its body."""
    claims = answer.as_fields()["claims"]
    problems = check_rules(claims, answer.as_fields()["references"])
    listed = {r.id for r in answer.references}
    in_claims = {n for c in answer.claims for n in c.citations}
    for n in answer.cited:
        if n not in listed and n not in in_claims:
            problems.append(RuleViolation("orphan_citation", f"[{n}] is cited but not listed in references",
                                          reference=n))
    body_cited = set(answer.cited)
    return [p for p in problems if not (p.rule == "unused_reference" and p.reference in body_cited)]


# ------------------------------------------------------------------------------------------------ artifacts

#: the prose fields of agents' artifacts that may carry inline-labelled claims
PROSE_FIELDS = ("prose_excerpt", "rationale", "critique", "defense")


def objection_items(artifact: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The three mandatory items of a critical objection answer as INFER claims: the counterargument and the
    challenge to an assumption oppose the state claims they name; the alternative hypothesis stands alone."""
    out: list[dict[str, Any]] = []
    for key, text_key in (("counterargument", "text"), ("alternative_hypothesis", "text"),
                          ("challenged_assumption", "challenge")):
        item = artifact.get(key)
        if isinstance(item, Mapping) and str(item.get(text_key) or "").strip():
            claim: dict[str, Any] = {"id": key, "text": str(item[text_key]).strip(), "label": "INFER",
                                     "citations": []}
            if item.get("opposes"):
                claim["opposes"] = [str(x) for x in item["opposes"]]
            out.append(claim)
    return out


def claims_of(artifact: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """An agent artifact's claims and references, and where they came from: ``structured`` (its fields),
    ``inline`` (parsed from its prose fields) or ``none``. A critical objection answer's mandatory items come
    first, as claims (:func:`objection_items`)."""
    items = objection_items(artifact)
    if items:
        extra = [dict(c) for c in artifact.get("claims") or [] if isinstance(c, Mapping)]
        return [*items, *extra], [dict(r) for r in artifact.get("references") or []], "structured"
    claims = artifact.get("claims")
    if isinstance(claims, list) and claims:
        return [dict(c) for c in claims], [dict(r) for r in artifact.get("references") or []], "structured"
    prose = "\n\n".join(str(artifact[f]) for f in PROSE_FIELDS if isinstance(artifact.get(f), str) and artifact[f])
    if prose:
        fields = parse_inline(prose).as_fields()
        if fields["claims"]:
            return fields["claims"], fields["references"], "inline"
    return [], [dict(r) for r in artifact.get("references") or []], "none"


def unlabelled_points(artifact: Mapping[str, Any]) -> int:
    """How many substantive statements an artifact without claims made unlabelled (its key points, else one
    position): the denominator of label adoption."""
    points = artifact.get("key_points")
    if isinstance(points, list) and points:
        return len(points)
    return 1
