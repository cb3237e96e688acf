"""The layers a session carries, built above all of them: the quality layer (claims ledger, verification,
groupthink), the safety guard, and the context window (what each call shows of earlier rounds).

The session holds the shared record; these layers read it and the plan. Building them here, not in
:class:`~conclave.engine.session.Session`, keeps the session below every layer in the import graph: a layer may
import the record types, and adding a detector or a controller touches its layer alone."""

from __future__ import annotations

from conclave.engine.quality import QualityLayer
from conclave.engine.safety_gate import SafetyGuard
from conclave.engine.session import Session
from conclave.quality.summarize import ContextWindow


def with_layers(session: Session) -> Session:
    """``session`` with its quality layer, safety guard and context window, in the order each needs the one before."""
    session.quality = QualityLayer(session)
    session.safety = SafetyGuard(session)
    session.context = ContextWindow(session)
    return session
