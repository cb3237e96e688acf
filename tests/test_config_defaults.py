"""One source per default: the composed default configuration (``conf/``) and the pydantic models of
:mod:`conclave.config.settings` cannot disagree, and no default names an option that does not exist."""

from __future__ import annotations

from typing import Any

from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from pydantic import BaseModel

from conclave.config.defaults_yaml import config_path, regenerate
from conclave.config.settings import SafetySettings, Settings, settings_from_container
from conclave.plugin_manager import get_plugins

#: keys whose YAML value is an interpolation of the environment, resolved at start (the model's default is the
#: same place, computed: ``default_home()``)
ENVIRONMENT_DEFAULTS = {"home"}


def _composed_defaults(resolve: bool = False) -> dict[str, Any]:
    with initialize_config_module(config_module="conclave.conf", version_base="1.3"):
        cfg = compose("config", overrides=["question=Q?"])
    container = OmegaConf.to_container(cfg, resolve=resolve)
    assert isinstance(container, dict)
    return {str(k): v for k, v in container.items() if k != "hydra"}


def _model_default(field: Any) -> Any:
    if field.default_factory is not None:
        return field.default_factory()
    return field.default


def _disagreements(model: type[BaseModel], yaml: dict[str, Any], prefix: str = "") -> list[str]:
    """Every key of ``model`` with a default whose composed YAML value differs or is missing, recursively."""
    problems = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        if field.is_required() or key in ENVIRONMENT_DEFAULTS:
            continue
        if name not in yaml:
            problems.append(f"{key}: default {_model_default(field)!r} in config.py, missing from conf/")
            continue
        default = _model_default(field)
        if isinstance(default, BaseModel):
            nested = yaml[name]
            assert isinstance(nested, dict), key
            problems += _disagreements(type(default), nested, f"{key}.")
            continue
        if yaml[name] != default:
            problems.append(f"{key}: conf/ says {yaml[name]!r}, config.py says {default!r}")
    return problems


def test_every_default_in_conf_equals_the_pydantic_default() -> None:
    assert _disagreements(Settings, _composed_defaults()) == []


def test_the_checked_in_config_yaml_is_what_the_models_generate() -> None:
    """A default is written once, in settings.py: conf/config.yaml's defaults (values and comments) are rendered
    from the models; ``python -m conclave.config.defaults_yaml`` rewrites them, and a stale file fails here."""
    text = config_path().read_text(encoding="utf-8")
    assert regenerate(text) == text
    edited = text.replace("\ntau: 0.8", "\ntau: 0.9").replace("  tau: 0.8 ", "  tau: 0.9 ")
    assert edited != text and regenerate(edited) == text  # a default changed in the YAML alone is caught


def test_the_composed_default_config_validates_to_the_model_defaults() -> None:
    """Validated, the default composition equals the model built from its defaults alone, key for key."""
    yaml = _composed_defaults(resolve=True)
    yaml.pop("home")
    settings = settings_from_container(yaml).model_dump()
    by_model = Settings.model_validate({k: yaml[k] for k in ("question", "agents", "judge", "personas",
                                                              "providers", "mode")}).model_dump()
    assert settings == by_model


def test_the_safety_modes_default_names_only_registered_strategies() -> None:
    strategies = set(get_plugins().strategies.names())
    assert set(SafetySettings().modes) <= strategies
    assert SafetySettings().modes  # the adversarial modes still always get a full evaluation


def _minimal(**extra: Any) -> dict[str, Any]:
    yaml = _composed_defaults(resolve=True)
    yaml.pop("home")
    return {**yaml, **extra}


def test_quick_is_an_alias_of_rounds_2() -> None:
    """``quick=true`` becomes ``rounds=2`` when validated: the plan, the exit controller and the report read one key."""
    quick, two = settings_from_container(_minimal(quick=True)), settings_from_container(_minimal(rounds=2))
    assert quick.rounds == two.rounds == 2
    assert (quick.planned_rounds, quick.may_repeat) == (two.planned_rounds, two.may_repeat) == (2, False)
    assert settings_from_container(_minimal(quick=True, rounds=1)).rounds == 1  # fewer rounds still win
    assert settings_from_container(_minimal(quick=True, rounds=3)).rounds == 2
