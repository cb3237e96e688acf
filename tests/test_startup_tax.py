"""What a CLI consultation does before round 1 stays small: Hydra composes the config once, not twice."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from conclave import hydra_app


def test_the_packaged_config_leaves_hydra_mode_unset(conclave_env: Path) -> None:
    # the mode probe is answered without composing only because no packaged file sets hydra.mode
    from hydra import compose, initialize_config_module

    hydra_app.prepare_hydra()
    with initialize_config_module("conclave.conf", version_base="1.3"):
        cfg = compose("config", ["question=q"], return_hydra_config=True)
    assert cfg.hydra.mode is None


@pytest.mark.parametrize(("overrides", "argv", "user_file", "probed"), [
    (["question=q", "rounds=2"], [], None, False),
    (["question=q", "hydra.mode=MULTIRUN"], [], None, True),
    (["question=q", "++hydra.mode=MULTIRUN"], [], None, True),
    (["question=q"], ["-cn", "mine"], None, True),
    (["question=q"], [], "cost: {always_allow_under: 1.0}\n", False),
    (["question=q"], [], "hydra:\n  mode: MULTIRUN\n", True),
], ids=["plain", "override", "forced-override", "other-primary-config", "user-settings", "user-sets-hydra"])
def test_hydra_probes_the_mode_only_when_something_may_set_it(conclave_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                             overrides, argv, user_file, probed) -> None:
    monkeypatch.setattr("sys.argv", ["conclave", *argv, *overrides])
    monkeypatch.setenv("CONCLAVE_PLUGINS", "openai,anthropic,gemini")
    if user_file is not None:
        settings = conclave_env / "conf" / "user" / "settings.yaml"
        settings.parent.mkdir(parents=True)
        settings.write_text(user_file)
    monkeypatch.setattr(hydra_app, "user_config_dir", lambda: conclave_env / "conf")
    from conclave.plugins import reset_plugins

    reset_plugins()
    try:
        assert hydra_app._mode_may_be_set(overrides) is probed
    finally:  # the plugins cached under this test's CONCLAVE_PLUGINS (no strategies) must not outlive it
        reset_plugins()


#: modules a consultation needs only after its first request, or never: none of them may be imported before it
#: on the remembered-composition path (a plain run's usual path; the warm-up thread imports some during round 1)
NOT_BEFORE_THE_FIRST_REQUEST = (
    "hydra", "omegaconf", "antlr4", "yaml", "tomllib", "numpy", "rich", "jsonschema", "sqlite3", "sqlite_utils",
    "datasette", "jinja2", "llama_cpp", "ctypes", "difflib", "importlib.metadata", "conclave.engine.result", "conclave.store.index",
    "conclave.render.report", "conclave.render.markdown", "conclave.render.jsonld", "conclave.hydra_app",
)


@pytest.mark.slow
async def test_a_remembered_run_imports_no_heavy_module_before_its_first_request(
        fake_provider_server: Any, conclave_env: Path) -> None:
    from test_compose_cache import QUESTION, _hydra

    from conclave import compose_cache
    from conclave.panel import zero_config_overrides

    given = ["rounds=1", "output.format=json", "cost.auto_approve=true", *fake_provider_server.overrides()]
    overrides = [*zero_config_overrides(given, os.environ, conclave_env), *given]  # as the CLI orders them
    task, hydra_cfg = _hydra(overrides)  # what the first run's Hydra composes and remembers
    assert compose_cache.store(conclave_env, compose_cache.cache_key(conclave_env, overrides), task, hydra_cfg)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(conclave_env), CONCLAVE_PROGRESS="0", CONCLAVE_TRACE_STARTUP="modules")
    for _ in range(2):  # the first run in a home fills the start-up caches (entry points, parsed data files)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "conclave", QUESTION, *given, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(conclave_env), env=env)
        out, err = await asyncio.wait_for(process.communicate(), timeout=120)
        assert process.returncode == 0, err.decode()
        assert json.loads(out)["status"] == "complete"
    listed = [line for line in err.decode().splitlines() if line.startswith("conclave-trace: modules: ")]
    assert len(listed) == 1, err.decode()
    imported = set(listed[0].removeprefix("conclave-trace: modules: ").split())
    assert "conclave.providers.http" in imported  # the list is the real one, taken at the first request
    early = sorted(name for name in imported
                   if any(name == heavy or name.startswith(heavy + ".") for heavy in NOT_BEFORE_THE_FIRST_REQUEST))
    assert early == [], early
