"""Deterministic synthetic consultation event streams (the events.py payloads), for store tests and benchmarks.

``synthetic_events(n)`` is a realistic 4-round consultation (about 44 events with three agents, including
retries and the odd provider substitution). Every third one (``n % 3 == 0``) runs in explore mode and always
goes 4 rounds; converge ones may stop after round 2 (early termination); ``interrupted_after_round`` cuts a
stream off as a crash would. The same ``n`` always yields the same stream.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from conclave import events as ev
from conclave.artifacts.artifact_filter import token_efficiency_stats
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder

PANEL = (
    ("security", "security", "openai", "gpt-4o"),
    ("architect", "architecture", "anthropic", "claude-sonnet-4-5"),
    ("pragmatist", "pragmatic", "gemini", "gemini-2.5-pro"),
)
ROUND_TYPES = {1: "independent", 2: "synthesis", 3: "cross_exam", 4: "verdict"}
STATES = {1: "INDEPENDENT", 2: "SYNTHESIS", 3: "CROSS_EXAM", 4: "VERDICT"}
TOPICS = ("event sourcing", "a monorepo", "Kubernetes", "GraphQL", "Rust", "Postgres", "a message queue", "SQLite")


def consultation_id(n: int) -> str:
    return f"c{n:07d}-{hashlib.sha256(str(n).encode()).hexdigest()[:8]}"


def synthetic_events(
    n: int, *, start_ts: float = 1_767_225_600.0, spacing_s: float = 60.0, interrupted_after_round: int | None = None,
    config: dict[str, Any] | None = None,
) -> list[ev.Event]:
    """The event stream of synthetic consultation ``n``, starting ``n * spacing_s`` after ``start_ts``.

    ``config`` replaces the recorded configuration snapshot (pass a real ``Settings`` dump to test resume).
    """
    return list(_Stream(n, start_ts + n * spacing_s, interrupted_after_round, config).events())


class _Stream:
    def __init__(self, n: int, ts: float, interrupted_after_round: int | None, config: dict[str, Any] | None) -> None:
        self.config = config
        self.rng = random.Random(n)
        self.cid = consultation_id(n)
        self.ts = ts
        self.seq = 0
        self.stop_after = interrupted_after_round
        self.mode = "converge" if n % 3 else "explore"
        self.out: list[ev.Event] = []

    def emit(self, type_: str, **data: Any) -> None:
        self.ts += self.rng.uniform(0.001, 0.05)
        self.out.append(ev.Event(type_, self.cid, self.seq, round(self.ts, 6), data))
        self.seq += 1

    def transition(self, from_: str, to: str, reason: str) -> None:
        self.emit(ev.STATE_TRANSITION, **{"from": from_, "to": to, "reason": reason})

    def events(self) -> Iterator[ev.Event]:
        rng = self.rng
        topic = rng.choice(TOPICS)
        config = self.config or {"mode": {"strategy": self.mode, "options": {}}, "rounds": 4,
                                 "filtering": {"round3": {"consensus_points": rng.choice((2, 3)), "tensions": 2}}}
        self.emit(
            ev.CONSULTATION_STARTED, question=f"Should we adopt {topic} for service {rng.randint(1, 500)}?",
            mode=self.mode, strategy=self.mode,
            agents=[{"name": a, "persona": p, "provider": pr, "model": m} for a, p, pr, m in PANEL],
            judge={"provider": "openai", "model": "gpt-4o"}, planned_rounds=4, config=config,
            config_hash=hashlib.sha256(repr(config).encode()).hexdigest(),
            prompt_versions={f"round_{r}": f"{self.mode}_r{r}_v1" for r in range(1, 5)}, conclave_version="0.1.0",
            scrub_report={"total": 0, "by_type": {}},
            judge_labels={a: f"Agent {'ABC'[i]}" for i, (a, *_rest) in enumerate(PANEL)},
            shuffle_seed=rng.randint(0, 2**31),
        )
        self.transition("IDLE", "ESTIMATING", "start")
        estimate = round(rng.uniform(0.01, 0.2), 4)
        self.emit(ev.COST_ESTIMATED, estimated_cost=estimate, input_tokens=rng.randint(2000, 9000),
                  output_tokens=rng.randint(1000, 5000), unknown_prices=[])
        self.transition("ESTIMATING", "AWAITING_CONSENT", "estimated")
        self.emit(ev.USER_CONSENT, approved=True, auto_approved=estimate < 0.5, reason="under always_allow_under")
        self.transition("AWAITING_CONSENT", "INDEPENDENT", "consent")
        for round_number in (1, 2, 3, 4):
            self.round(round_number)
            if self.stop_after == round_number:
                return iter(self.out)
            if round_number == 2:
                confidence = round(rng.uniform(0.6, 0.98), 2)
                accepted = self.mode == "converge" and confidence >= 0.9
                self.emit(ev.EARLY_TERMINATION, offered=confidence >= 0.9, accepted=accepted, confidence=confidence,
                          threshold=0.9, reason="consensus confidence", rounds_skipped=2 if accepted else 0,
                          estimated_cost_saved=round(estimate * 0.45, 4) if accepted else 0.0)
                if accepted:
                    self.finish(2, confidence)
                    return iter(self.out)
            if round_number < 4:
                self.transition(STATES[round_number], STATES[round_number + 1], "round complete")
        self.finish(4, round(rng.uniform(0.55, 0.97), 2))
        return iter(self.out)

    def round(self, number: int) -> None:
        rng = self.rng
        self.emit(ev.ROUND_STARTED, round_number=number, round_type=ROUND_TYPES[number])
        if number in (3, 4):
            before = rng.randint(1500, 4000)
            self.emit(ev.FILTER_APPLIED, round_number=number, artifact_type="synthesis", filter="top_n",
                      limits={"consensus_points": 3, "tensions": 2}, tokens_before=before,
                      tokens_after=before - rng.randint(100, 1200))
        callers = [(a, pr, m) for a, _p, pr, m in PANEL] if number in (1, 3) else []
        if number != 1:
            callers.append(("judge", "openai", "gpt-4o"))
        totals = [0, 0, 0.0]
        for agent, provider, model in callers:
            if agent != "judge" and rng.random() < 0.03:
                self.emit(ev.PROVIDER_SUBSTITUTED, round_number=number, agent=agent, original_provider=provider,
                          original_model=model, substitute_provider="openai", substitute_model="gpt-4o-mini",
                          reason="failure")
                provider, model = "openai", "gpt-4o-mini"
            attempts = 2 if rng.random() < 0.08 else 1
            for attempt in range(1, attempts + 1):
                ok = attempt == attempts
                tokens_in, tokens_out = rng.randint(400, 2500), rng.randint(150, 900) if ok else 0
                cost = round(tokens_in * 2.5e-6 + tokens_out * 1e-5, 6)
                totals[0] += tokens_in
                totals[1] += tokens_out
                totals[2] += cost
                self.emit(ev.PROVIDER_ATTEMPT, round_number=number, agent=agent, provider=provider, model=model,
                          number=attempt, started_at=self.ts, latency_s=round(rng.uniform(0.5, 6.0), 3),
                          outcome="ok" if ok else "rate_limited", status=200 if ok else 429,
                          error=None if ok else "429 Too Many Requests", hedge=False, input_tokens=tokens_in,
                          output_tokens=tokens_out, cached_input_tokens=0, cost=cost)
            artifact_type = "cross_exam_reply" if number == 3 and agent != "judge" else ROUND_TYPES[number]
            self.emit(ev.ROUND_ARTIFACT, round_number=number, artifact_type=artifact_type, schema=artifact_type,
                      agent=None if agent == "judge" else agent, artifact=self.artifact(artifact_type, agent),
                      raw_text="{...}", status="valid")
            if agent != "judge":
                self.emit(ev.AGENT_COMPLETED, round_number=number, agent=agent, ok=True,
                          duration_s=round(rng.uniform(0.5, 6.0), 3), input_tokens=tokens_in,
                          output_tokens=tokens_out, cost=cost, error=None)
        self.emit(ev.ROUND_COMPLETED, round_number=number, round_type=ROUND_TYPES[number],
                  duration_s=round(rng.uniform(1, 8), 3), input_tokens=totals[0], output_tokens=totals[1],
                  cost=round(totals[2], 6))

    def artifact(self, artifact_type: str, agent: str) -> dict[str, Any]:
        rng = self.rng
        if artifact_type == "independent":
            return {"artifact_type": artifact_type, "position": f"{agent} favours option {rng.randint(1, 4)}",
                    "key_points": ["auditability", "operational cost"], "confidence": round(rng.uniform(0.5, 1), 2)}
        if artifact_type == "synthesis":
            return {"artifact_type": artifact_type,
                    "consensus_points": [{"point": "incremental migration", "supporting_agents": ["security"],
                                          "confidence": round(rng.uniform(0.5, 1), 2)}],
                    "tensions": [{"area": "complexity", "viewpoints": []}], "priority_order": ["safety"]}
        if artifact_type == "verdict":
            dissent = [{"agent": rng.choice(PANEL)[0], "concern": "operational complexity",
                        "severity": rng.choice(("low", "medium", "high"))}] if rng.random() < 0.4 else []
            return {"artifact_type": artifact_type, "recommendation": "Adopt it incrementally",
                    "confidence": round(rng.uniform(0.55, 0.97), 2), "evidence": ["pilot results"],
                    "dissent": dissent}
        return {"artifact_type": artifact_type, "challenges": [], "rebuttals": [], "unresolved": ["scope"]}

    def finish(self, last_round: int, confidence: float) -> None:
        self.transition(STATES[last_round], "COMPLETE", "verdict" if last_round == 4 else "early termination")
        verdict = next((e.data["artifact"] for e in reversed(self.out)
                        if e.type == ev.ROUND_ARTIFACT and e.data["artifact_type"] == "verdict"), None)
        result = {"consultation_id": self.cid, "question": self.out[0].data["question"], "mode": self.mode,
                  "recommendation": verdict["recommendation"] if verdict else "Adopt it incrementally",
                  "confidence": confidence, "dissent": verdict["dissent"] if verdict else [],
                  "early_terminated": last_round == 2, "rounds_completed": last_round,
                  "token_efficiency_stats": self.token_efficiency_stats()}
        # why the debate ended, fixed by the consultation's number (no draw from the random generator)
        n = int(self.cid.rsplit("-", 1)[-1], 16) if "-" in self.cid else 0
        result["exit"] = {"reason": "early-termination" if last_round == 2 else ("consensus", "convergence",
                                                                                 "round-cap")[n % 3],
                          "rounds_played": last_round, "cross_exam_rounds": int(last_round == 4), "round_cap": 6,
                          "decisions": []}
        checks = self.quality_checks()
        labelled = sum(c["labelled"] for c in checks)
        facts, cited = sum(c["facts"] for c in checks), sum(c["facts_cited"] for c in checks)
        result["quality"] = {"metrics": {
            "label_adoption": round(labelled / (labelled + sum(c["unlabelled"] for c in checks)), 4),
            "citation_compliance": round(cited / facts, 4) if facts else None,
            "rule_violations": {"fact_uncited": facts - cited},
            "pass_rate": {"U2": round(sum(c["verification"][0]["passed"] for c in checks) / len(checks), 4)}}}
        # quality records draw nothing from the stream's random generator and keep the clock where it is, so
        # every other record (and its timestamp) is what it was before they existed
        for agent, check in zip([a for a, *_ in PANEL], checks, strict=True):
            self.out.append(ev.Event(ev.QUALITY_CHECKS, self.cid, self.seq, round(self.ts, 6),
                                     {"round_number": 1, "agent": agent, **check}))
            self.seq += 1
        self.emit(ev.CONSULTATION_COMPLETED, status="complete", result=result)

    def token_efficiency_stats(self) -> dict[str, Any] | None:
        """As the engine reports it (None when no round filtered): the input of the rounds after the synthesis as
        sent, and what filtering saved there (here: what the filter events say they removed)."""
        filtered = [e.data for e in self.out if e.type == ev.FILTER_APPLIED]
        if not filtered:
            return None
        used = sum(e.data["input_tokens"] for e in self.out
                   if e.type == ev.ROUND_COMPLETED and e.data["round_number"] > 2)
        saved = sum(d["tokens_before"] - d["tokens_after"] for d in filtered)
        return token_efficiency_stats(used + saved, used, [d["round_number"] for d in filtered])

    def quality_checks(self) -> list[dict[str, Any]]:
        """Round-1 citation checks for each panel member, fixed by the consultation's number."""
        n = int(self.cid.rsplit("-", 1)[-1], 16) if "-" in self.cid else 0
        out = []
        for i, _ in enumerate(PANEL):
            facts = 1 + (n + i) % 3
            cited = facts - ((n + i) % 4 == 0)
            out.append({"anchor": None, "claim_source": "structured", "labelled": facts + 1,
                        "unlabelled": (n + i) % 2, "facts": facts, "facts_cited": cited,
                        "rules": [{"rule": "fact_uncited", "detail": "a FACT claim cites no reference"}]
                        * (facts - cited),
                        "verification": [{"question_id": "U2", "passed": cited == facts, "reason": "",
                                          "by": "checker"}]})
        return out


def record_synthetic(home: Path, numbers: Iterable[int], **options: Any) -> Path:
    """Record the synthetic consultations ``numbers`` (:func:`synthetic_events` with ``options``) into ``home``
    through the recorder, as a running home would; the index's path."""
    recorder = Recorder(home)
    for n in numbers:
        for event in synthetic_events(n, **options):
            recorder(event)
    recorder.close()
    return StoreLayout(home).index_path
