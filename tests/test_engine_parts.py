"""Engine building blocks without providers: labels, templates, extraction helpers, termination, consent."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from conclave_plugins.strategies import ConvergeStrategy, ExploreStrategy
from test_engine_support import answering

from conclave.artifacts import schema_registry as artifacts
from conclave.engine.cost.consent import decide_consent, round_up_to_cent, store_always_allow
from conclave.engine.cost.estimate import CostEstimate, PlannedCall
from conclave.engine.extraction import extract, header_for, request_schema
from conclave.engine.interaction import Interaction
from conclave.engine.labels import JudgeLabels
from conclave.engine.prompt_template import PromptTemplate, TemplateError
from conclave.engine.strategy import TEMPLATE_KEYS
from conclave.engine.termination import decide_early_termination, is_rubber_stamp

AGENTS = ["security", "architect", "pragmatist"]


# ---------------------------------------------------------------------------------------------- labels


def test_labels_are_a_seeded_shuffle_of_the_panel() -> None:
    maps = {tuple(JudgeLabels(AGENTS, seed).by_name.items()) for seed in range(20)}
    assert len(maps) > 1  # the order depends on the seed…
    assert JudgeLabels(AGENTS, 7).by_name == JudgeLabels(AGENTS, 7).by_name  # …and only on the seed
    assert sorted(JudgeLabels(AGENTS, 7).by_name.values()) == ["Agent A", "Agent B", "Agent C"]


def test_judge_output_is_translated_to_names_and_back_exactly() -> None:
    labels = JudgeLabels(AGENTS, 0, {"security": "Agent B", "architect": "Agent A", "pragmatist": "Agent C"})
    judged: dict[str, Any] = {
        "consensus_points": [{"point": "Agent A and Agent B agree on audit logs", "supporting_agents": ["Agent A",
                              "agent b"], "confidence": 0.8}],
        "tensions": [{"topic": "cost", "viewpoints": [{"agent": "Agent C", "viewpoint": "too dear"},
                                                      {"agent": "Agent A", "viewpoint": "worth it"}]}],
    }
    named = labels.to_names(judged)
    assert named["consensus_points"][0]["supporting_agents"] == ["architect", "security"]
    assert named["consensus_points"][0]["point"] == "architect (Agent A) and security (Agent B) agree on audit logs"
    assert [v["agent"] for v in named["tensions"][0]["viewpoints"]] == ["pragmatist", "architect"]
    back = labels.to_labels(named)
    assert back["consensus_points"][0]["point"] == judged["consensus_points"][0]["point"]
    assert back["consensus_points"][0]["supporting_agents"] == ["Agent A", "Agent B"]
    assert "security" not in json.dumps(labels.judge_view({**named, "created_at": "x"}))


# ---------------------------------------------------------------------------------------------- templates


@pytest.mark.parametrize("strategy", [ConvergeStrategy, ExploreStrategy])
def test_every_template_is_versioned_and_hashed(strategy: Any) -> None:
    versions = strategy().prompt_versions()
    assert set(versions) == set(TEMPLATE_KEYS.values())
    for name, key in TEMPLATE_KEYS.items():
        template = strategy().template(name)
        assert re.fullmatch(r"v[1-9][0-9]*", template.version)
        assert versions[key] == f"{strategy.name}/{name}@{template.version}#sha256:{template.sha256[:16]}"


def test_template_renders_values_verbatim_and_rejects_unknown_placeholders() -> None:
    template = PromptTemplate.parse("t", "x", "---\nversion: v2\n---\nQ: $question\n")
    assert template.render(question="costs $5 and ${oc.env:HOME}") == "Q: costs $5 and ${oc.env:HOME}\n"
    assert template.id.startswith("t/x@v2#sha256:")
    with pytest.raises(TemplateError, match=r"\$question"):
        template.render(other="x")
    with pytest.raises(TemplateError, match="version"):
        PromptTemplate.parse("t", "y", "no header $question")


# ---------------------------------------------------------------------------------------------- extraction


def test_request_schema_is_self_contained_and_as_strict_as_the_file() -> None:
    for name in ("independent", "synthesis", "cross_exam", "cross_exam_reply", "verdict", "verdict_explore"):
        text = json.dumps(request_schema(name))
        assert "$ref" not in text
    tensions = request_schema("synthesis")["properties"]["tensions"]["items"]["properties"]["viewpoints"]
    assert tensions["minItems"] == 2


def test_extract_fills_the_header_and_repairs_text() -> None:
    header = header_for("independent", 1, "security")
    assert header["artifact_type"] == "independent" and header["agent_id"] == "security"
    body = {"agent_id": "someone else", "round_number": 9, "position": "Yes", "key_points": ["a"],
            "rationale": "because", "confidence": 0.7, "prose_excerpt": ""}
    fenced = "Here you go:\n```json\n" + json.dumps(body) + "\n```\nThanks"
    result = extract(fenced, None, "independent", header)
    assert result.status == "repaired"
    assert result.artifact is not None and result.artifact["agent_id"] == "security"
    assert result.artifact["round_number"] == 1
    bad = extract(json.dumps({**body, "confidence": 3}), None, "independent", header)
    assert not bad.ok and any(e.startswith("$.confidence:") for e in bad.errors)


# ---------------------------------------------------------------------------------------------- verdicts


def _synthesis(points: list[tuple[str, list[str], float]], tensions: list[Any] | None = None) -> dict[str, Any]:
    return {
        "consensus_points": [{"point": p, "supporting_agents": a, "confidence": c} for p, a, c in points],
        "tensions": tensions or [],
        "priority_order": [],
    }


def test_converge_verdict_from_synthesis_follows_the_documented_derivation() -> None:
    synthesis = _synthesis(
        [("Use an append-only log", ["security", "architect"], 0.8), ("Start small", ["architect"], 0.9)],
        [{"topic": "cost", "viewpoints": [{"agent": "pragmatist", "viewpoint": "too dear"},
                                          {"agent": "architect", "viewpoint": "worth it"}]}],
    )
    verdict = ConvergeStrategy().verdict_from_synthesis(synthesis)
    assert verdict["recommendation"] == "Start small"
    assert verdict["confidence"] == pytest.approx(0.85)
    assert verdict["evidence"] == ["Start small", "Use an append-only log"]
    # only the outsider (supports no consensus point) dissents; mean 0.85 is not > 0.85 -> medium
    assert verdict["dissent"] == [{"agent": "pragmatist", "concern": "cost: too dear", "severity": "medium"}]
    artifacts.check("verdict", {**verdict, **header_for("verdict", 4, None)})


def test_explore_verdict_from_synthesis_is_a_valid_menu() -> None:
    synthesis = _synthesis(
        [("Event log", ["security", "architect"], 0.7)],
        [{"topic": "storage", "viewpoints": [{"agent": "pragmatist", "viewpoint": "Postgres"},
                                             {"agent": "architect", "viewpoint": "Kafka"}]}],
    )
    verdict = ExploreStrategy().verdict_from_synthesis(synthesis)
    assert [o["option"] for o in verdict["recommendations"]] == ["Event log", "Postgres", "Kafka"]
    assert verdict["recommendations"][1]["championed_by"] == ["pragmatist"]
    artifacts.check("verdict_explore", {**verdict, **header_for("verdict_explore", 4, None)})


# ---------------------------------------------------------------------------------------------- termination


def _settings(threshold: float = 0.9, non_interactive: str = "accept", rounds: int = 4) -> Any:
    return SimpleNamespace(
        early_termination=SimpleNamespace(threshold=threshold, non_interactive=non_interactive),
        planned_rounds=rounds,
    )


def test_rubber_stamp_needs_high_confidence_everywhere_and_no_tensions() -> None:
    sure = {"a": {"confidence": 0.9}, "b": {"confidence": 0.95}}
    assert is_rubber_stamp(sure, {"tensions": []})
    assert not is_rubber_stamp(sure, {"tensions": [{"topic": "x"}]})
    assert not is_rubber_stamp({**sure, "c": {"confidence": 0.85}}, {"tensions": []})


@pytest.mark.parametrize(("groupthink", "offered", "reason"), [
    (True, False, "groupthink_detected"),  # the detectors fired: cross-examination is not skipped
    (False, True, "high_confidence_after_synthesis"),  # they found a diverse panel: the old rule does not apply
    (None, False, "rubber_stamp_guard"),  # shadow stage: the rubber-stamp rule decides, as before
])
def test_early_termination_defers_to_the_groupthink_detectors(groupthink: bool | None, offered: bool,
                                                              reason: str) -> None:
    decision = decide_early_termination(
        strategy=ConvergeStrategy(), settings=_settings(),
        round_1={"a": {"confidence": 0.9}, "b": {"confidence": 0.95}},  # every agent above 0.85
        synthesis=_synthesis([("x", ["a", "b"], 0.95)]),  # and no tension
        interaction=Interaction(interactive=False), cost_saved=None, groupthink=groupthink,
    )
    assert (decision["offered"], decision["reason"]) == (offered, reason)


def test_termination_asks_on_a_terminal_with_the_confidence() -> None:
    asked: list[str] = []
    decision = decide_early_termination(
        strategy=ConvergeStrategy(),
        settings=_settings(),
        round_1={"a": {"confidence": 0.5}, "b": {"confidence": 0.9}},
        synthesis=_synthesis([("x", ["a", "b"], 0.95)]),
        interaction=Interaction(interactive=True, ask=answering(asked, "n")),
        cost_saved=0.12,
    )
    assert asked == ["Strong consensus reached (confidence 95%). Terminate early and skip Rounds 3-4? [Y/n]"]
    assert decision["offered"] and not decision["accepted"] and decision["reason"] == "declined_by_user"


def test_explore_never_stops_early_and_says_so() -> None:
    decision = decide_early_termination(
        strategy=ExploreStrategy(), settings=_settings(), round_1={}, synthesis=_synthesis([("x", [], 1.0)]),
        interaction=Interaction.non_interactive(), cost_saved=None,
    )
    assert not decision["offered"] and decision["notice"] == "Explore mode: all rounds will execute"


# ---------------------------------------------------------------------------------------------- consent


def _estimate(cost: float | None) -> CostEstimate:
    return CostEstimate([PlannedCall(1, "a", "openai", "gpt-4o", 10, 10, cost)])


def test_consent_paths() -> None:
    cost = SimpleNamespace(always_allow_under=0.5, auto_approve=False)
    settings: Any = SimpleNamespace(cost=cost)
    assert decide_consent(_estimate(0.2), settings, Interaction.non_interactive()).auto_approved
    refused = decide_consent(_estimate(0.8), settings, Interaction.non_interactive())
    assert not refused.approved and "cost.auto_approve=true" in refused.reason and "0.80" in refused.reason
    unknown = decide_consent(_estimate(None), settings, Interaction.non_interactive())
    assert not unknown.approved and "openai/gpt-4o" in unknown.reason
    always = decide_consent(_estimate(0.8123), settings, Interaction(True, ask=lambda p: "a"))
    assert always.approved and always.new_threshold == 0.82
    assert round_up_to_cent(0.81) == 0.81 and round_up_to_cent(0.8101) == 0.82


def test_always_merges_into_existing_user_settings(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "user" / "settings.yaml"
    path.parent.mkdir(parents=True)
    path.write_text("judge:\n  model: gpt-4.1\ncost:\n  abort_ratio: 2.0\n")
    store_always_allow(tmp_path, 0.82)
    assert yaml.safe_load(path.read_text()) == {
        "judge": {"model": "gpt-4.1"},
        "cost": {"abort_ratio": 2.0, "always_allow_under": 0.82},
    }
