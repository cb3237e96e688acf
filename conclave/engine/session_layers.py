"""The layers a session carries, built above all of them: the quality layer (claims ledger, verification,
groupthink), the safety guard, and the context window (what each call shows of earlier rounds).

The session holds the shared record; these layers read it and the plan. Building them here, not in
:class:`~conclave.engine.session.Session`, keeps the session below every layer in the import graph: a layer may
import the record types, and adding a detector or a controller touches its layer alone."""

from __future__ import annotations

from conclave.engine.quality import QualityLayer
from conclave.engine.safety_gate import SafetyGuard
from conclave.engine.session import Session
from conclave.quality.summarize import ContextWindow, WindowInputs


def with_layers(session: Session) -> Session:
    """``session`` with its quality layer, safety guard and context window, in the order each needs the one before."""
    session.quality = QualityLayer(session)
    session.safety = SafetyGuard(session)
    session.context = ContextWindow(WindowInputs(
        settings=session.settings.summarization, strategy=session.strategy, record=session.record,
        filtering=session.filtering, state=session.quality.state, consultation_id=session.bus.consultation_id,
        steps=lambda: session.plan.steps(), present=session.present, labels=lambda: session.labels,
        view=session.view, debate_state=lambda: session.quality.template_values("debate_state")["debate_state"]))
    return session
