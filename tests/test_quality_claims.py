"""Labelled claims and numeric citations: the inline parser (every pattern of the format) and the citation rules."""

from __future__ import annotations

import pytest

from conclave.quality.claims import (
    InlineClaim,
    InlineReference,
    check_rules,
    citation_numbers,
    claims_of,
    inline_problems,
    parse_inline,
    split_references,
)


def test_a_fact_claim_with_one_citation_after_its_full_stop() -> None:
    answer = parse_inline("Your claim here.[FACT][1]")
    assert answer.claims == [InlineClaim("Your claim here.", "FACT", (1,))]


def test_each_label_is_extracted_from_its_sentence() -> None:
    text = "Billing writes 40k events a day.[FACT][1] Replays stay cheap.[INFER] Audit trails matter.[ASSUME]"
    assert [(c.text, c.label) for c in parse_inline(text).claims] == [
        ("Billing writes 40k events a day.", "FACT"), ("Replays stay cheap.", "INFER"),
        ("Audit trails matter.", "ASSUME")]


@pytest.mark.parametrize(("text", "numbers"), [
    ("[1]", [1]), ("[1][2]", [1, 2]), ("[1-3]", [1, 2, 3]), ("[1–3]", [1, 2, 3]), ("[1, 4]", [1, 4]),
    ("[2][1-2][3]", [2, 1, 3]), ("[3-1]", [3]), ("no citation", [])])
def test_citation_groups(text: str, numbers: list[int]) -> None:
    assert citation_numbers(text) == numbers


def test_a_claim_takes_every_citation_group_that_follows_its_label() -> None:
    assert parse_inline("Costs fell.[FACT][1][2] Then.[INFER][1-3]").claims == [
        InlineClaim("Costs fell.", "FACT", (1, 2)), InlineClaim("Then.", "INFER", (1, 2, 3))]


def test_a_decimal_number_stays_inside_its_claim() -> None:
    assert parse_inline("Latency grew 3.5% last year.[FACT][1]").claims[0].text == "Latency grew 3.5% last year."


def test_labels_are_read_case_insensitively_and_stored_upper_case() -> None:
    assert parse_inline("It holds.[fact][1]").claims[0].label == "FACT"


def test_the_references_section_lists_numbered_sources_with_their_urls() -> None:
    body, refs = split_references(
        "A claim.[FACT][1]\n\nReferences:\n[1] Author (2024). Title. Source. https://example.com/a.\n"
        "2. Fowler (2005). Event Sourcing.\nnot a reference line\n")
    assert body.strip() == "A claim.[FACT][1]"
    assert refs == [InlineReference(1, "Author (2024). Title. Source", "https://example.com/a"),
                    InlineReference(2, "Fowler (2005). Event Sourcing", None)]


def test_a_markdown_references_heading_is_recognised() -> None:
    assert [r.id for r in split_references("x\n## References\n[1] A.\n")[1]] == [1]


def test_numbers_cited_in_the_body_exclude_the_references_section() -> None:
    answer = parse_inline("See [2] and [1-2].\nReferences:\n[1] A\n[2] B\n[3] C\n")
    assert answer.cited == [2, 1]
    assert [r.id for r in answer.references] == [1, 2, 3]


def test_an_orphan_citation_and_an_unused_reference_in_prose_are_found() -> None:
    answer = parse_inline("It holds.[FACT][1] See [4].\nReferences:\n[1] A\n[2] B\n")
    assert sorted((p.rule, p.reference) for p in inline_problems(answer)) == [
        ("orphan_citation", 4), ("unused_reference", 2)]


def test_valid_prose_has_no_problems() -> None:
    answer = parse_inline("It holds.[FACT][1] Hence so.[INFER] We value it.[ASSUME]\nReferences:\n[1] A\n")
    assert inline_problems(answer) == []


# ------------------------------------------------------------------------------------------------ the rules


def _claim(cid: str, label: str, *citations: int) -> dict[str, object]:
    return {"id": cid, "text": f"claim {cid}", "label": label, "citations": list(citations)}


def test_a_fact_without_citation_breaks_the_rules() -> None:
    assert [(v.rule, v.claim) for v in check_rules([_claim("1", "FACT")], [])] == [("fact_uncited", "1")]


def test_an_assume_with_a_citation_breaks_the_rules() -> None:
    violations = check_rules([_claim("1", "ASSUME", 1)], [{"id": 1, "title": "A"}])
    assert [(v.rule, v.claim) for v in violations] == [("assume_cited", "1")]


def test_an_orphan_citation_is_reported_with_its_number() -> None:
    violations = check_rules([_claim("1", "FACT", 2)], [])
    assert [(v.rule, v.reference) for v in violations] == [("orphan_citation", 2)]


def test_an_unused_reference_is_reported() -> None:
    violations = check_rules([_claim("1", "FACT", 1)], [{"id": 1, "title": "A"}, {"id": 2, "title": "B"}])
    assert [(v.rule, v.reference) for v in violations] == [("unused_reference", 2)]


def test_an_infer_may_cite_or_not() -> None:
    refs = [{"id": 1, "title": "A"}]
    assert check_rules([_claim("1", "INFER"), _claim("2", "INFER", 1)], refs) == []


def test_structured_claims_win_over_inline_prose() -> None:
    artifact = {"claims": [_claim("1", "INFER")], "prose_excerpt": "Other.[FACT][1]"}
    claims, _, source = claims_of(artifact)
    assert (source, [c["text"] for c in claims]) == ("structured", ["claim 1"])


def test_without_structured_claims_the_prose_excerpt_is_parsed() -> None:
    claims, refs, source = claims_of({"prose_excerpt": "It holds.[FACT][1]\nReferences:\n[1] Dash https://x.y/z"})
    assert source == "inline"
    assert claims == [{"id": "1", "text": "It holds.", "label": "FACT", "citations": [1]}]
    assert refs == [{"id": 1, "title": "Dash", "url": "https://x.y/z"}]


def test_an_artifact_without_claims_has_none() -> None:
    assert claims_of({"prose_excerpt": "plain words"}) == ([], [], "none")
