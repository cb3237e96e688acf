"""A remembered composition is exactly what Hydra composes, and any change of its inputs makes Hydra compose again."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_conclave

from conclave import compose_cache
from conclave.cli import hydra_quote
from conclave.testing.fake_server import FakeProviderServer

QUESTION = "Use ${oc.env:HOME} \\${x} and \"quotes\", or 'not'?\\"


def _hydra(overrides: list[str]) -> tuple[Any, Any]:
    """What the Hydra task receives for ``overrides`` + the question: the task config and the hydra node."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from conclave.hydra_app import prepare_hydra

    prepare_hydra()
    GlobalHydra.instance().clear()
    with initialize_config_module("conclave.conf", version_base="1.3"):
        cfg = compose("config", [*overrides, "question=" + hydra_quote(QUESTION)], return_hydra_config=True)
    hydra_cfg = cfg.hydra
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, hydra_cfg


@pytest.mark.parametrize("overrides", [
    [],
    ["agents=local"],
    ["mode=explore", "rounds=2", "filtering.round3.tensions=1", "judge.model=gpt-4.1"],
    ["+personas.ops={name: Ops, focus: on call}", "context=[a.md,b.md]", "cost.always_allow_under=0.25"],
], ids=["defaults", "panel", "overrides", "additions"])
@pytest.mark.parametrize("home_var", ["set", "unset", "empty"])  # $CONCLAVE_HOME and $OPENAI_BASE_URL
def test_the_remembered_config_is_what_hydra_composes(conclave_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                      overrides: list[str], home_var: str) -> None:
    from omegaconf import OmegaConf

    user = conclave_env / "conf" / "user"
    user.mkdir(parents=True)
    (user / "settings.yaml").write_text("quality:\n  state_tokens: 900\n")
    task, hydra_cfg = _hydra(overrides)
    key = compose_cache.cache_key(conclave_env, overrides)
    assert compose_cache.store(conclave_env, key, task, hydra_cfg)
    if home_var == "unset":
        monkeypatch.delenv("CONCLAVE_HOME")
    elif home_var == "empty":
        monkeypatch.setenv("CONCLAVE_HOME", "")
        monkeypatch.setenv("OPENAI_BASE_URL", "")
    else:
        monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    found = compose_cache.load(conclave_env, key, QUESTION)
    assert found is not None
    config, logging = found
    expected = OmegaConf.to_container(task, resolve=True)
    assert config == expected and list(config) == list(expected)  # values, and the order of every key
    assert logging == [OmegaConf.to_container(hydra_cfg.hydra_logging, resolve=True),
                       OmegaConf.to_container(hydra_cfg.job_logging, resolve=True)]


def test_a_config_it_cannot_reproduce_is_never_stored(conclave_env: Path) -> None:
    for overrides in (["+personas.x={name: X, focus: '${oc.env:HOME}/x'}"],  # not a whole-value env lookup
                      ["+personas.x={name: X, focus: '${now:%H}'}"]):  # a resolver only Hydra registers
        task, hydra_cfg = _hydra(overrides)
        assert not compose_cache.store(conclave_env, compose_cache.cache_key(conclave_env, overrides), task,
                                       hydra_cfg)
    task, hydra_cfg = _hydra(["hydra.verbose=true"])
    assert not compose_cache.store(conclave_env, "verbose", task, hydra_cfg)
    user = conclave_env / "conf" / "user"
    user.mkdir(parents=True)
    (user / "settings.yaml").write_text("hydra:\n  job:\n    chdir: true\n")
    task, hydra_cfg = _hydra([])
    assert not compose_cache.store(conclave_env, "user-hydra", task, hydra_cfg)
    assert not list(compose_cache.cache_dir(conclave_env).glob("*.json"))


def test_the_key_follows_overrides_and_every_config_file(conclave_env: Path) -> None:
    key = compose_cache.cache_key(conclave_env, ["rounds=2"])
    assert key == compose_cache.cache_key(conclave_env, ["rounds=2"])
    assert key != compose_cache.cache_key(conclave_env, ["rounds=3"])
    user = conclave_env / "conf" / "user"
    user.mkdir(parents=True)
    settings = user / "settings.yaml"
    settings.write_text("rounds: 2\n")
    with_file = compose_cache.cache_key(conclave_env, ["rounds=2"])
    assert with_file != key
    os.utime(settings, ns=(1, 1))
    assert compose_cache.cache_key(conclave_env, ["rounds=2"]) != with_file
    assert compose_cache.eligible([], ["rounds=2"])
    assert not compose_cache.eligible(["-m"], ["rounds=2"])
    assert not compose_cache.eligible([], ["hydra.job.chdir=true"])
    assert not compose_cache.eligible([], ["hydra/job_logging=default"])


def test_a_repeated_run_errs_the_same_and_sees_a_changed_settings_file(tmp_path: Path) -> None:
    first = run_conclave("Q?", "rounds=7", home=tmp_path)
    stored = list(compose_cache.cache_dir(tmp_path).glob("*.json"))
    assert first.returncode == 2 and len(stored) == 1
    inode = stored[0].stat().st_ino
    again = run_conclave("Q?", "rounds=7", home=tmp_path)
    assert (again.returncode, again.stdout, again.stderr) == (first.returncode, first.stdout, first.stderr)
    assert stored[0].stat().st_ino == inode  # read, not composed and written again
    user = tmp_path / "conf" / "user"
    user.mkdir(parents=True)
    (user / "settings.yaml").write_text("quick: perhaps\n")
    for _ in range(2):  # composed by Hydra after the change, then remembered: the same line both times
        changed = run_conclave("Q?", home=tmp_path)
        assert changed.returncode == 2
        assert changed.stderr.startswith("conclave: quick:") and f"(set in {user / 'settings.yaml'})" in changed.stderr
        assert len(changed.stderr.splitlines()) == 1


async def test_a_remembered_config_runs_the_same_consultation(fake_provider_server: FakeProviderServer,
                                                              conclave_env: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(conclave_env), CONCLAVE_PROGRESS="0")
    results = []
    for _ in range(2):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "conclave", QUESTION, "rounds=1", "output.format=json", "cost.auto_approve=true",
            *fake_provider_server.overrides(), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=str(conclave_env), env=env)
        out, err = await asyncio.wait_for(process.communicate(), timeout=120)
        assert process.returncode == 0, err.decode()
        results.append(json.loads(out))
    assert len(list(compose_cache.cache_dir(conclave_env).glob("*.json"))) == 1
    first, second = results
    assert first["question"] == second["question"] == QUESTION
    for key in ("status", "mode", "strategy", "planned_rounds", "completed_rounds", "judge", "prompt_versions"):
        assert first[key] == second[key], key

    def seats(result: dict[str, Any]) -> list[dict[str, Any]]:  # the judge's labels are shuffled per run
        return [{k: v for k, v in agent.items() if k != "label"} for agent in result["agents"]]

    assert seats(first) == seats(second)
    # the same prompts (the fake's prompt cache serves the second run's prefixes, so only the billed split differs)
    assert [first["tokens"][k] for k in ("input", "output")] == [second["tokens"][k] for k in ("input", "output")]
