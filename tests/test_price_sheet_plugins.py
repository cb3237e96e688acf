"""Provider plugins ship their own price sheets (``register_price_sheets``): the built-in sheets live with the
plugins that price them, and a provider's prices come and go with its plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_external_plugin import plugin_site  # noqa: F401  (the pip-installed example plugin, a fixture)

from conclave.plugin_manager import get_plugins
from conclave.providers import pricing


def test_each_builtin_sheet_is_registered_by_its_provider_plugin() -> None:
    registered = get_plugins().registries["price_sheets"]
    owners = {name: registered.owner(name) for name in registered.names()}
    assert owners == {"openai": "openai", "grok": "openai", "mistral": "openai", "anthropic": "anthropic",
                      "gemini": "gemini", "local": "local"}
    assert pricing.PriceTable.load().price("openai", "gpt-4o-mini") is not None


def test_an_installed_plugin_ships_the_price_sheet_of_its_provider(plugin_site: Path, tmp_path: Path) -> None:  # noqa: F811
    """The out-of-tree example plugin (pip-installed) registers ``pricing/echo.yaml`` from its own package."""
    proc = subprocess.run(
        [sys.executable, "-c", "from conclave.providers.pricing import PriceTable; "
         "print(PriceTable.load().price('echo', 'echo-1'))"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, "PYTHONPATH": str(plugin_site), "CONCLAVE_HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ModelPrice(input=1.0, output=2.0, cached_input=None, cache_write_input=None)"
