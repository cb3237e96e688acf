"""Rendering a result: the Markdown report, the JSON-LD document and the console writer."""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from conclave.artifacts.schema_registry import upgrade, validate
from conclave.render.console import print_result
from conclave.render.jsonld import to_jsonld
from conclave.render.markdown import render_markdown

RESULTS = Path(__file__).parent / "fixtures" / "results"


def load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))


@pytest.fixture
def converge() -> dict[str, Any]:
    return load("converge_complete")


@pytest.fixture
def explore() -> dict[str, Any]:
    return load("explore_complete")


@pytest.mark.parametrize(("name", "verdict_schema", "reply_schema"), [
    ("converge_complete", "verdict", "cross_exam_reply"),
    ("explore_complete", "verdict_explore", "cross_exam_reply_explore"),
])
def test_fixture_artifacts_are_schema_valid(name: str, verdict_schema: str, reply_schema: str) -> None:
    # the fixtures were recorded at format 1.0; each reads as a valid current artifact
    artifacts = load(name)["artifacts"]
    assert artifacts["round_2"]["schema_version"] == "1.0"
    problems = [validate("independent", upgrade("independent", a)) for a in artifacts["round_1"].values()]
    problems += [validate(reply_schema, upgrade(reply_schema, r)) for r in artifacts["round_3_replies"].values()]
    problems += [validate("synthesis", upgrade("synthesis", artifacts["round_2"])),
                 validate("cross_exam", upgrade("cross_exam", artifacts["round_3"])),
                 validate(verdict_schema, upgrade(verdict_schema, artifacts["round_4"]))]
    assert all(p == [] for p in problems), problems


def test_converge_report_sections_in_order(converge: dict[str, Any]) -> None:
    md = render_markdown(converge)
    headings = [line for line in md.splitlines() if line.startswith("#")]
    # dissent stays above the fold, right under the verdict; then the debate round by round
    assert headings == [
        "# Consultation summary", "## Verdict (confidence 84%)", "## Dissent", "## Realized panel",
        "## Round 1 · Independent positions", "### security (openai/gpt-4o)",
        "### architect (anthropic/claude-sonnet-4-5)", "### pragmatist (gemini/gemini-2.5-flash)",
        "## Round 2 · Synthesis", "## Round 3 · Cross-examination", "### security (openai/gpt-4o)",
        "### architect (anthropic/claude-sonnet-4-5)", "### pragmatist (gemini/gemini-2.5-flash)",
        "## How the agents moved (round 1 → round 3)", "## Cost",
    ]
    assert "> **Question:** Should we move billing to event sourcing?" in md
    assert converge["recommendation"] in md
    assert "- Two lost-update incidents on invoice status would be prevented, not just recorded (architect)" in md
    assert "⚠" not in md and "✖" not in md  # a complete run has no banner


def test_converge_report_details(converge: dict[str, Any]) -> None:
    md = render_markdown(converge)
    assert ("| pragmatist (Agent C) | pragmatic | gemini/gemini-2.5-flash "
            "| substituted for gemini/gemini-2.5-pro (timeout) |") in md
    assert ("| pragmatist | gemini/gemini-2.5-flash | Do not rewrite billing; add an audit-event table written in the "
            "same transaction and revisit event sourcing in a year. | 74% |") in md
    assert "**Unresolved**\n\n- Who staffs the projection rebuild and on-call for the event store" in md
    assert "- pragmatist (medium): The team has no on-call experience with an event store;" in md
    assert md.rstrip().splitlines()[-9:] == [
        "cost $0.0412 · 18,305 tokens (4,096 read from prompt caches) · 16.4 s · saved 4,210 tokens (31%)",
        "",
        "| Provider | Cost |",
        "| --- | ---: |",
        "| openai | $0.0231 |",
        "| anthropic | $0.0139 |",
        "| gemini | $0.0042 |",
        "",
        "_context: 1 source (4,182 bytes) · secrets redacted before sending: 1 (url_password: 1)_",
    ]


def test_explore_report_is_an_options_menu(explore: dict[str, Any]) -> None:
    md = render_markdown(explore)
    assert "## Options (confidence 72%)" in md and "## Verdict" not in md
    assert "### 1. Hybrid: team seats plus usage-based API" in md
    assert "### architect" in md and "**Refined position:**" in md  # explore replies have their own renderer
    option = md[md.index("### 2. Committed-use credits"):md.index("### 3.")]
    assert "- **Pros:** Finance can budget; Upfront cash" in option
    assert "- **Cons:** Harder for small teams to start" in option
    assert "- **Best when:** Selling to enterprises with procurement" in option
    assert "- **Championed by:** architect" in option
    assert "**Synergies**\n\n- Metering is a prerequisite" in md
    assert "_All models answered as configured._" in md
    assert "cost unknown for: grok-4 · 17,430 tokens" in md
    assert "## Dissent" not in md


def test_degraded_run_names_the_fallback_judge(converge: dict[str, Any]) -> None:
    converge["status"] = "completed_degraded"
    converge["judge"].update(actual_provider="anthropic", actual_model="claude-sonnet-4-5", fallback_used=True)
    md = render_markdown(converge)
    assert ("> ⚠ **Completed, degraded.** The judge model openai/gpt-4o was unavailable; "
            "a fallback judge (anthropic/claude-sonnet-4-5) was used.") in md
    assert "Judge: anthropic/claude-sonnet-4-5 (fallback for openai/gpt-4o)" in md


def partial(result: dict[str, Any], status: str, reason: str) -> dict[str, Any]:
    out = copy.deepcopy(result)
    out.update(status=status, completed_rounds=2, verdict=None, recommendation=None, confidence=None, dissent=[],
               concerns=[], abort_reason=reason, token_efficiency_stats=None)
    out["artifacts"].update(round_3_replies={}, round_3=None, round_4=None)
    return out


def test_partial_run_shows_the_abort_reason_and_no_verdict(converge: dict[str, Any]) -> None:
    md = render_markdown(partial(converge, "partial", "actual cost $0.09 exceeded 1.5 × the estimate $0.05"))
    assert ("> ⚠ **Partial result.** Stopped after 2 of 4 rounds. "
            "Reason: actual cost $0.09 exceeded 1.5 × the estimate $0.05") in md
    assert "## Verdict\n\n_No verdict was reached._" in md
    assert "## Round 3" not in md and "## How the agents moved" not in md  # round 3 never ran
    assert "**Revised position:**" not in md
    assert "saved" not in md


def test_one_round_run_points_to_the_perspectives(converge: dict[str, Any]) -> None:
    result = partial(converge, "complete", "")
    result.update(planned_rounds=1, completed_rounds=1, abort_reason=None)
    result["artifacts"]["round_2"] = None
    md = render_markdown(result)
    assert "_A one-round run asks for independent answers only: see the positions below._" in md
    assert "### architect (anthropic/claude-sonnet-4-5)" in md


def test_aborted_run_marks_absent_agents(converge: dict[str, Any]) -> None:
    result = partial(converge, "aborted", "interrupted by the user")
    agent = result["agents"][2]
    agent.update(absent=True, error="timeout after 120 s | no answer")
    del result["artifacts"]["round_1"]["pragmatist"]
    md = render_markdown(result)
    assert md.startswith("# Consultation summary")
    assert "> ✖ **Aborted.** Stopped after 2 of 4 rounds. Reason: interrupted by the user" in md
    assert "| pragmatist (Agent C) | pragmatic | — | absent: timeout after 120 s \\| no answer |" in md
    assert ("| pragmatist | gemini/gemini-2.5-flash | absent: gave no round-1 answer (timeout after 120 s \\| no "
            "answer) | — |") in md


def test_early_termination_note(converge: dict[str, Any]) -> None:
    result = partial(converge, "complete", "")
    result.update(abort_reason=None, recommendation="Adopt event sourcing for invoices", confidence=0.93,
                  verdict={"recommendation": "Adopt event sourcing for invoices", "confidence": 0.93,
                           "evidence": ["Auditability first"], "dissent": []})
    result["early_termination"] = {"offered": True, "accepted": True, "reason": "high_confidence_after_synthesis",
                                   "confidence": 0.93, "threshold": 0.9, "rounds_skipped": 2,
                                   "estimated_cost_saved": 0.0123}
    md = render_markdown(result)
    assert ("> Stopped early after round 2: consensus confidence 93% reached the threshold 90%; "
            "2 rounds skipped (estimated saving $0.0123).") in md
    assert "## Verdict (confidence 93%)" in md and "⚠" not in md

    result["early_termination"]["accepted"] = False
    assert "offered (consensus confidence 93% reached the threshold 90%) and declined" in render_markdown(result)


def test_every_key_may_be_null(converge: dict[str, Any]) -> None:
    nulls = dict.fromkeys(converge)
    nulls["question"] = "Is this tolerated?"
    md = render_markdown(nulls)
    assert "> **Question:** Is this tolerated?" in md and "_No verdict was reached._" in md
    assert md.rstrip().endswith("cost unknown")
    assert render_markdown({}).startswith("# Consultation summary")


def test_jsonld_adds_context_type_and_id_and_keeps_every_key(converge: dict[str, Any]) -> None:
    doc = to_jsonld(converge)
    assert doc["@type"] == "conclave:Consultation"
    assert doc["@id"] == "urn:conclave:c-20260302-091405-7f3a9c"
    assert doc["@context"]["@vocab"] == "https://conclave.dev/ns#"
    assert doc["@context"]["created_at"] == {"@id": "schema:dateCreated", "@type": "xsd:dateTime"}
    assert {k: v for k, v in doc.items() if not k.startswith("@")} == converge
    assert json.loads(json.dumps(doc)) == doc


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_console_markdown_is_plain_text_when_not_a_terminal(converge: dict[str, Any]) -> None:
    out = io.StringIO()
    print_result(converge, "markdown", out)
    assert out.getvalue() == render_markdown(converge)


def test_console_markdown_is_styled_by_rich_on_a_terminal(converge: dict[str, Any]) -> None:
    out = _Terminal()
    print_result(converge, "markdown", out)
    text = out.getvalue()
    assert "Should we move billing to event sourcing?" in text
    assert "## Verdict" not in text  # rich rendered the heading instead of printing its markup
    assert "\x1b[" in text


def test_console_json_and_both(converge: dict[str, Any]) -> None:
    out = io.StringIO()
    print_result(converge, "json", out)
    assert json.loads(out.getvalue()) == to_jsonld(converge)
    both = io.StringIO()
    print_result(converge, "both", both)
    head, sep, tail = both.getvalue().rpartition("---\n{")
    assert sep and head == render_markdown(converge)
    assert json.loads("{" + tail) == to_jsonld(converge)


def test_console_rejects_an_unknown_format(converge: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"output\.format"):
        print_result(converge, "yaml", io.StringIO())  # type: ignore[arg-type]


def test_plain_output_does_not_import_rich() -> None:
    code = (
        "import io, json, sys; from conclave.render.console import print_result; "
        f"print_result(json.load(open({str(RESULTS / 'converge_complete.json')!r})), 'both', io.StringIO()); "
        "print('rich' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ------------------------------------------------------------------------------------------------ debate value


def test_debate_value_of_the_fixture(converge: dict[str, Any]) -> None:
    from conclave.render.debate_value import debate_value

    value = debate_value(converge)
    assert value is not None
    by_agent = {a["agent"]: a for a in value["agents"]}
    assert [a["agent"] for a in value["agents"]] == ["security", "architect", "pragmatist"]  # panel order
    # the pragmatist went from "do not rewrite billing" to "accept event sourcing if staffed": a shift, and it dissents
    assert by_agent["pragmatist"]["change"] == "moderate_shift" and by_agent["pragmatist"]["dissented"]
    # final confidence: the verdict's 0.84, times 0.8 for the dissenter
    assert by_agent["architect"]["final_confidence"] == 0.84
    assert by_agent["pragmatist"]["final_confidence"] == pytest.approx(0.672)
    assert by_agent["pragmatist"]["confidence_delta"] == pytest.approx(0.672 - 0.74)
    assert value["agents_changed_position"] == 3 and value["change_rate"] == 1.0
    assert value["avg_confidence_change"] == pytest.approx((0.02 - 0.04 - 0.068) / 3, abs=1e-4)
    # 2 of 3 refined or unchanged, mean confidence fell: 0.7 × 2/3
    assert value["convergence_score"] == pytest.approx(0.4667, abs=1e-4)


def test_debate_value_rules() -> None:
    from conclave.render.debate_value import debate_value, similarity

    assert similarity("Adopt event sourcing", "adopt event sourcing") == 1.0
    assert similarity("keep the monolith", "split into services") == 0.0

    def result(r1: str, r3: str, c1: float, reply_confidence: float | None = None) -> dict[str, Any]:
        reply: dict[str, Any] = {"revised_position": r3}
        if reply_confidence is not None:
            reply["confidence"] = reply_confidence  # a reply that reports its own confidence is believed
        return {"agents": [{"name": "a"}], "confidence": 0.9, "verdict": {"confidence": 0.9}, "dissent": [],
                "artifacts": {"round_1": {"a": {"position": r1, "confidence": c1}}, "round_3_replies": {"a": reply}}}

    same = debate_value(result("Adopt event sourcing now", "Adopt event sourcing now", 0.85))
    assert same is not None and same["agents"][0]["change"] == "same" and same["agents_changed_position"] == 0
    # the same words with a confidence jump of 0.15 or more count as a refinement
    jump = debate_value(result("Adopt event sourcing now", "Adopt event sourcing now", 0.5, reply_confidence=0.7))
    assert jump is not None and jump["agents"][0]["change"] == "minor_refinement"
    assert jump["convergence_score"] == pytest.approx(0.3 * (0.2 / 0.3) + 0.7)
    flipped = debate_value(result("Keep the monolith", "Split billing into services", 0.9))
    assert flipped is not None and flipped["agents"][0]["change"] == "significant_change"
    assert debate_value({"artifacts": {"round_1": {"a": {}}, "round_3_replies": {}}}) is None  # no round 3


# ------------------------------------------------------------------------------------------------ renderers


def test_a_new_record_type_needs_one_renderer_for_every_view(converge: dict[str, Any]) -> None:
    from conclave.render import renderers
    from conclave.render.html import render_html
    from conclave.render.nodes import Bullets, Para

    records = [
        {"type": "consultation:started", "seq": 0, "consultation_id": "c-x",
         "data": {"question": "Q?", "mode": "converge", "agents": [{"name": "a", "provider": "openai", "model": "m"}]}},
        {"type": "consultation:round_artifact", "seq": 1,
         "data": {"round_number": 5, "schema": "postmortem", "agent": None, "status": "valid",
                  "artifact": {"artifact_type": "postmortem", "objections": ["too slow"], "severity": "high"}}},
    ]
    # unregistered: the generic renderer still shows every field
    generic = render_markdown({}, records)
    assert "## Round 5 · Postmortem" in generic and "- too slow" in generic and "- **Severity:** high" in generic

    renderers.register("postmortem", lambda a, ctx: [Para(f"{len(a['objections'])} objection(s)", label="Raised:"),
                                                   Bullets(a["objections"])], title="Objections")
    try:
        md = render_markdown({}, records)
        assert "**Raised:** 1 objection(s)" in md and "Severity" not in md
        assert "<strong>Raised:</strong> 1 objection(s)" in render_html({}, records)
        from conclave.datasette_plugin import _artifact_cell

        cell = str(_artifact_cell(json.dumps(records[1]["data"]["artifact"]), "postmortem"))
        assert "<strong>Raised:</strong> 1 objection(s)" in cell
    finally:
        renderers._RENDERERS.pop("postmortem")
        renderers.TITLES.pop("postmortem")


def test_html_report_escapes_model_text(converge: dict[str, Any]) -> None:
    from conclave.render.html import render_html

    converge["verdict"]["recommendation"] = "<script>alert(1)</script> & more"
    page = render_html(converge)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page


HOSTILE = ("See <script>alert(1)</script> and <img src=x onerror=alert(2)> then [docs](javascript:alert(3)), "
           "[b](JaVa&#115;cript:alert(4)), [c](java\\script:alert(5)), [d](javascript\\:alert(6)), "
           "![e](data:text/html;base64,PHNjcmlwdD4=), <javascript:alert(7)> and [ok](https://example.org/a_b).\n\n"
           "[x]: javascript:alert(8)\n\n[x] <b onmouseover=alert(9)>hover</b>")


class _Elements(HTMLParser):
    """Every element and attribute of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))


def test_markdown_report_makes_model_html_and_script_links_inert(converge: dict[str, Any]) -> None:
    # Markdown viewers render raw HTML and follow any link: what a model wrote must reach the reader as text
    from markdown_it import MarkdownIt

    converge["verdict"]["recommendation"] = HOSTILE
    md = render_markdown(converge)
    page = MarkdownIt("commonmark", {"html": True}).render(md)  # a viewer that renders raw HTML
    elements = _Elements()
    elements.feed(page)
    assert {tag for tag, _ in elements.tags} <= {"h1", "h2", "h3", "p", "ul", "ol", "li", "strong", "em", "table",
                                                  "thead", "tbody", "tr", "th", "td", "blockquote", "a", "img", "code"}
    attrs = [(name, value.lower()) for _, a in elements.tags for name, value in a.items()]
    assert not [name for name, _ in attrs if name.startswith("on")]
    assert not [v for name, v in attrs if name in ("href", "src") and v.startswith(("javascript", "data", "vbscript"))]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown as text, readable
    assert '<a href="https://example.org/a_b">ok</a>' in page  # legitimate Markdown still works
    assert md.count("#unsafe-link-removed") == 5


def test_a_blocked_question_does_not_claim_the_models_answered(converge: dict[str, Any]) -> None:
    for agent in converge["agents"]:
        agent["substituted"] = False  # the fixture's panel as configured
    converge["judge"]["fallback_used"] = False
    result = partial(converge, "blocked", "blocked by the safety evaluator (tier 1, weapons) in the question")
    result.update(completed_rounds=0)
    result["artifacts"].update(round_1={}, round_2=None)
    md = render_markdown(result)
    assert "Blocked by the safety evaluator." in md
    assert "All models answered as configured" not in md
    assert "All models answered as configured" in render_markdown(converge)  # a run whose models did answer


# ------------------------------------------------------------------------------------------------ toy panel banner


def on_toy_panel(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` as the offline panel records it: every seat on the packaged 270M model of the local provider."""
    toy = copy.deepcopy(result)
    for seat in [*toy["agents"], toy["judge"]]:
        seat.update(provider="local", model="gemma-3-270m", actual_provider="local", actual_model="gemma-3-270m")
    return toy


TOY = "Toy offline panel — not for decisions."


def test_a_toy_result_opens_every_report_with_the_banner(converge: dict[str, Any]) -> None:
    from conclave.render.html import render_html

    toy = on_toy_panel(converge)
    markdown = render_markdown(toy)
    assert TOY in markdown.split("## Verdict")[0]  # above the verdict and its confidence
    assert markdown.index(TOY) < markdown.index("Should we move billing")
    page = render_html(toy)
    assert TOY in page and page.index(TOY) < page.index("confidence")
    assert TOY in render_markdown(toy, only_round=1)  # `conclave show --round 1` too
    for clean in (render_markdown(converge), render_html(converge)):
        assert TOY not in clean


def test_a_toy_result_says_so_in_json(converge: dict[str, Any]) -> None:
    out = io.StringIO()
    print_result(on_toy_panel(converge), "json", out)
    document = json.loads(out.getvalue())
    assert document["notice"].startswith(TOY)
    assert "notice" not in to_jsonld(converge)


def test_one_seat_substituted_onto_the_toy_model_is_enough(converge: dict[str, Any]) -> None:
    mixed = copy.deepcopy(converge)
    mixed["agents"][0].update(actual_provider="local", actual_model="gemma-3-270m", substituted=True)
    assert TOY in render_markdown(mixed)
    bigger = on_toy_panel(converge)
    # the local provider on a real GGUF, named as docs/providers-and-local-servers.md says
    for seat in [*bigger["agents"], bigger["judge"]]:
        seat.update(model="qwen2.5-7b", actual_model="qwen2.5-7b")
    assert TOY not in render_markdown(bigger)
