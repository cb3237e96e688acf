"""Run the real CLI (`sys.executable -m conclave`) as a subprocess with an isolated CONCLAVE_HOME."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

PROVIDER_KEY_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "XAI_API_KEY",
                     "MISTRAL_API_KEY", "OPENAI_BASE_URL")


def clean_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without provider keys, with CONCLAVE_HOME pointing at ``home``."""
    env = {k: v for k, v in os.environ.items() if k not in PROVIDER_KEY_VARS and not k.startswith("CONCLAVE_")}
    env["CONCLAVE_HOME"] = str(home)
    env["CONCLAVE_PROGRESS"] = "0"
    env.pop("HYDRA_FULL_ERROR", None)
    env.update(extra or {})
    return env


def run_conclave(
    *args: str,
    home: Path,
    cwd: Path | None = None,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conclave", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        cwd=cwd or home,
        env=clean_env(home, env),
        timeout=timeout,
    )
