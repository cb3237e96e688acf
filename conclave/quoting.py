"""Text as Hydra overrides: a question quoted so it parses back to itself and never interpolates. Light on
purpose: the command line quotes before it knows whether Hydra will run."""

from __future__ import annotations

import re

SHELL_COMPLETION_HINT = ("--shell-completion needs one of install=SHELL, uninstall=SHELL or query=SHELL "
                         "(bash, zsh, fish)")


def hydra_quote(text: str) -> str:
    """Quote ``text`` as a Hydra override value that parses back to exactly ``text``.

    Inside double quotes Hydra's grammar still resolves ``${...}`` and treats ``\\`` before a quote as an escape, so
    interpolations are escaped (a question must never expand ``${oc.env:SECRET}``), quotes are escaped, and
    backslashes that precede a quote or the closing quote are doubled.
    """
    # n backslashes before "${" must stay literal: 2n backslashes, then the escaped "\${"
    text = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)
    text = re.sub(r'(\\*)"', lambda m: m.group(1) * 2 + '\\"', text)
    text = re.sub(r"(\\+)\Z", lambda m: m.group(1) * 2, text)
    return '"' + text + '"'
