"""What a CLI consultation does before round 1 stays small: Hydra composes the config once, not twice."""

from __future__ import annotations

from pathlib import Path

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
