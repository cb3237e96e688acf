"""Bridge from the Hydra task to the engine."""

from __future__ import annotations

from typing import Any

from conclave.config import Settings
from conclave.errors import ConclaveError


def run_from_cli(settings: Settings) -> Any:
    raise ConclaveError(
        "configuration is valid, but the consultation engine is not part of this build yet "
        "(tracked in the engine issue); `conclave --cfg job` shows the composed config"
    )
