"""Context loading: files, a bounded project summary and stdin, with every omission listed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from conclave.config.settings import Settings
from conclave.engine.context import (
    MAX_FILE_BYTES,
    MAX_OMITTED_LISTED,
    MAX_PROJECT_FILES,
    MAX_TOTAL_BYTES,
    ContextBundle,
    is_secret_file,
    load_context,
)
from conclave.errors import ConfigError
from conclave.scrub import scrub


def make_settings(context: list[str] | None = None, project: str | None = None) -> Settings:
    return Settings.model_validate({
        "question": "Should we move billing to event sourcing?",
        "agents": {
            "security": {"persona": "security", "provider": "openai", "model": "gpt-4o"},
            "architect": {"persona": "architecture", "provider": "openai", "model": "gpt-4o"},
        },
        "judge": {"provider": "openai", "model": "gpt-4o"},
        "personas": {
            "security": {"name": "Security Expert", "focus": "threats"},
            "architecture": {"name": "Architect", "focus": "structure"},
        },
        "providers": {"openai": {"api": "openai"}},
        "mode": {"strategy": "converge"},
        "context": context or [],
        "project": project,
        "home": "/tmp/conclave-test-home",
    })


def by_path(bundle: ContextBundle) -> dict[str, dict[str, Any]]:
    return {s["path"]: s for s in bundle.sources}


@pytest.fixture
def chdir_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_context_files_are_included_in_order_with_sources(chdir_tmp: Path) -> None:
    (chdir_tmp / "adr-007.md").write_text("# ADR 7\nWe record invoices as events.\n")
    (chdir_tmp / "schema.sql").write_text("CREATE TABLE invoice_events (id bigserial);\n")
    bundle = load_context(make_settings(context=["schema.sql", "adr-007.md"]))
    assert bundle.text.index("CREATE TABLE") < bundle.text.index("# ADR 7")
    assert '<file path="schema.sql">' in bundle.text
    assert bundle.sources == [
        {"path": "schema.sql", "bytes": 44, "sent": 44, "truncated": False, "kind": "context_file", "omitted": None},
        {"path": "adr-007.md", "bytes": 38, "sent": 38, "truncated": False, "kind": "context_file", "omitted": None},
    ]


@pytest.mark.parametrize(
    ("setup", "kwargs", "message"),
    [
        (None, {"context": ["missing.md"]}, "context: file not found: missing.md"),
        ("dir", {"context": ["docs"]}, "context: not a file: docs (pass a directory as project=…)"),
        ("binary", {"context": ["report.docx"]}, "context: report.docx is not a supported type; accepted: text "
                                                 "files, PDF (.pdf) and images (.png, .jpg, .jpeg, .webp, .gif)"),
        (None, {"project": "no-such-dir"}, "project: directory not found: no-such-dir"),
        ("file", {"project": "notes.txt"}, "project: not a directory: notes.txt"),
    ],
)
def test_bad_paths_are_one_line_config_errors(
    chdir_tmp: Path, setup: str | None, kwargs: dict[str, Any], message: str
) -> None:
    if setup == "dir":
        (chdir_tmp / "docs").mkdir()
    elif setup == "binary":
        (chdir_tmp / "report.docx").write_bytes(b"PK\x03\x04\x14\x00\x06\x00\x08\x00\x00\x00!\x00")  # a zip
    elif setup == "file":
        (chdir_tmp / "notes.txt").write_text("x")
    with pytest.raises(ConfigError) as info:
        load_context(make_settings(**kwargs))
    assert info.value.problems == [message]
    assert info.value.exit_code == 2


def make_project(root: Path) -> Path:
    files = {
        "README.md": "# Billing\nHandles invoices.\n",
        "pyproject.toml": "[project]\nname = 'billing'\n",
        "src/billing/ledger.py": "class Ledger:\n    pass\n",
        "src/billing/api.py": "def create_invoice():\n    ...\n",
        "node_modules/left-pad/index.js": "module.exports = NODE_MODULES_CONTENT",
        ".git/config": "[core] GIT_CONTENT",
        "src/billing/__pycache__/ledger.cpython-311.pyc": "PYCACHE_CONTENT",
        "build/lib/out.py": "BUILD_CONTENT",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "docs").mkdir()
    (root / "docs" / "diagram.png").write_bytes(b"\x89PNG\x00\x00binary")
    return root


def test_project_summary_has_a_tree_and_contents_shallow_files_first(chdir_tmp: Path) -> None:
    make_project(chdir_tmp / "svc")
    bundle = load_context(make_settings(project="svc"))
    text = bundle.text
    assert text.startswith('<project path="svc">\nFile tree (4 files shown):\n  README.md\n  pyproject.toml\n'
                           "  src/billing/api.py\n  src/billing/ledger.py\n")
    assert "class Ledger:" in text and "def create_invoice" in text
    for excluded in ("NODE_MODULES_CONTENT", "GIT_CONTENT", "PYCACHE_CONTENT", "BUILD_CONTENT"):
        assert excluded not in text
    sources = by_path(bundle)
    assert sources["svc/docs/diagram.png"]["omitted"] == "binary"
    assert not any("node_modules" in p or ".git/" in p for p in sources)
    assert load_context(make_settings(project="svc")) == bundle  # deterministic


def test_a_file_over_the_per_file_limit_is_truncated_with_a_marker(chdir_tmp: Path) -> None:
    (chdir_tmp / "p").mkdir()
    (chdir_tmp / "p" / "big.log").write_text("event replayed\n" * 12_000)  # 180,000 bytes
    bundle = load_context(make_settings(project="p"))
    assert f"[… truncated by conclave: showing {MAX_FILE_BYTES:,} of 180,000 bytes]" in bundle.text
    assert by_path(bundle)["p/big.log"] == {
        "path": "p/big.log", "bytes": 180_000, "sent": MAX_FILE_BYTES, "truncated": True, "kind": "project_file", "omitted": None,
    }
    assert len(bundle.text.encode()) < MAX_FILE_BYTES + 1_000


def test_the_file_count_limit_lists_what_was_left_out(chdir_tmp: Path) -> None:
    (chdir_tmp / "p").mkdir()
    for i in range(MAX_PROJECT_FILES + 20):
        (chdir_tmp / "p" / f"module_{i:03d}.py").write_text(f"VALUE_{i} = {i}\n")
    bundle = load_context(make_settings(project="p"))
    kept = [s for s in bundle.sources if s["omitted"] is None]
    left = [s for s in bundle.sources if s["omitted"] is not None]
    assert len(kept) == MAX_PROJECT_FILES and len(left) == 20
    assert left[0] == {"path": "p/module_100.py", "bytes": 16, "sent": 0, "truncated": False, "kind": "project_file",
                       "omitted": "over the 100-file limit"}
    assert "VALUE_99 = 99" in bundle.text and "VALUE_100" not in bundle.text
    assert "… 20 more files left out" in bundle.text


def test_the_total_size_limit_bounds_the_summary(chdir_tmp: Path) -> None:
    (chdir_tmp / "p").mkdir()
    for i in range(15):
        (chdir_tmp / "p" / f"part_{i:02d}.txt").write_text("x" * 90_000 + "\n")
    bundle = load_context(make_settings(project="p"))
    reasons = [s["omitted"] for s in bundle.sources]
    assert reasons.count(None) == 12  # 11 whole files + the 12th cut at the 1 MB boundary
    assert reasons.count("over the 1 MB total limit") == 3
    assert by_path(bundle)["p/part_11.txt"]["truncated"] is True
    assert MAX_TOTAL_BYTES < len(bundle.text.encode()) < MAX_TOTAL_BYTES + 5_000


def test_omitted_entries_beyond_the_listing_cap_are_summarised(chdir_tmp: Path) -> None:
    (chdir_tmp / "p").mkdir()
    total = MAX_PROJECT_FILES + MAX_OMITTED_LISTED + 50
    for i in range(total):
        (chdir_tmp / "p" / f"f{i:04d}.txt").write_text("1234\n")
    bundle = load_context(make_settings(project="p"))
    assert len(bundle.sources) == MAX_PROJECT_FILES + MAX_OMITTED_LISTED + 1
    assert bundle.sources[-1] == {"path": "p/…", "bytes": 250, "sent": 0, "truncated": False, "kind": "project_file",
                                  "omitted": "50 more files left out (limits, binaries, symlinks or secret files)"}


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_symlinks_leaving_the_project_are_skipped(chdir_tmp: Path) -> None:
    outside = chdir_tmp / "outside"
    outside.mkdir()
    (outside / "credentials.txt").write_text("OUTSIDE_SECRET")
    project = chdir_tmp / "p"
    project.mkdir()
    (project / "main.py").write_text("print('hi')\n")
    (project / "creds.txt").symlink_to(outside / "credentials.txt")
    (project / "shared").symlink_to(outside, target_is_directory=True)
    (project / "alias.py").symlink_to(project / "main.py")  # inside the project: fine
    bundle = load_context(make_settings(project="p"))
    assert "OUTSIDE_SECRET" not in bundle.text
    sources = by_path(bundle)
    assert sources["p/creds.txt"]["omitted"] == "symlink outside the project"
    assert sources["p/shared"]["omitted"] == "symlink outside the project"
    assert sources["p/alias.py"]["omitted"] is None


SECRET_FILES = {
    ".env": "DB_PASSWORD=ENV_FILE_CONTENT\n",
    ".env.local": "ENV_LOCAL_CONTENT=1\n",
    ".env.production": "ENV_PRODUCTION_CONTENT=1\n",
    "certs/server.pem": "PEM_CONTENT",
    "certs/server.key": "KEY_CONTENT",
    "certs/client.p12": "P12_CONTENT",
    "certs/client.pfx": "PFX_CONTENT",
    "android/release.jks": "JKS_CONTENT",
    "android/release.keystore": "KEYSTORE_CONTENT",
    "deploy/id_rsa": "ID_RSA_CONTENT",
    "deploy/id_rsa.pub": "ID_RSA_PUB_CONTENT",
    "deploy/id_ed25519": "ID_ED25519_CONTENT",
    "deploy/id_ecdsa": "ID_ECDSA_CONTENT",
    ".npmrc": "//registry.npmjs.org/:_authToken=NPMRC_CONTENT",
    ".pypirc": "[pypi]\npassword = PYPIRC_CONTENT",
    ".netrc": "machine api.example.com password NETRC_CONTENT",
    ".git-credentials": "https://ci:GIT_CREDENTIALS_CONTENT@github.com",
    "gcp/credentials.json": '{"CREDENTIALS_JSON_CONTENT": 1}',
    "gcp/service-account-prod.json": '{"SERVICE_ACCOUNT_CONTENT": 1}',
    "infra/terraform.tfstate": "TFSTATE_CONTENT",
    "infra/terraform.tfstate.backup": "TFSTATE_BACKUP_CONTENT",
    "infra/prod.tfvars": "TFVARS_CONTENT",
    "config/secrets.yml": "SECRETS_YML_CONTENT",
    "config/secrets.yaml": "SECRETS_YAML_CONTENT",
    "web/.htpasswd": "HTPASSWD_CONTENT",
    "config/.ENV": "UPPERCASE_ENV_CONTENT",  # matched case-insensitively
}
#: templates documenting the variables, and ordinary files whose names merely resemble secret files
NOT_SECRET_FILES = {
    ".env.example": "DB_PASSWORD=\n",
    ".env.sample": "API_KEY=\n",
    ".env.template": "TOKEN=\n",
    "src/env.py": "import os\n",
    "src/keyboard.py": "LAYOUT = 'qwerty'\n",
    "src/monkey.key.md": "# notes on key handling\n",
    "src/credentials.py": "def load(): ...\n",
    "infra/main.tf": 'resource "null_resource" "x" {}\n',
    "docs/secrets.md": "# How we manage secrets\n",
}


def test_secret_files_in_a_project_are_left_out_and_listed(chdir_tmp: Path) -> None:
    root = chdir_tmp / "p"
    for rel, text in {**SECRET_FILES, **NOT_SECRET_FILES}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    bundle = load_context(make_settings(project="p"))
    sources = by_path(bundle)
    for rel, text in SECRET_FILES.items():
        assert text not in bundle.text, rel
        assert f"  {rel}\n" not in bundle.text, rel  # not in the file tree either
        assert sources[f"p/{rel}"] == {"path": f"p/{rel}", "bytes": len(text.encode()), "sent": 0, "truncated": False,
                                       "kind": "project_file", "omitted": "secret file"}
    for rel, text in NOT_SECRET_FILES.items():
        assert sources[f"p/{rel}"]["omitted"] is None, rel
        assert f'<file path="{rel}">\n{text}\n</file>' in bundle.text
    assert f"… {len(SECRET_FILES)} more files left out" in bundle.text


@pytest.mark.parametrize(
    ("filename", "secret"),
    [
        (".env", True), (".env.staging", True), (".ENV.LOCAL", True), ("id_rsa", True), ("id_ed25519.bak", True),
        ("server.PEM", True), ("service-account.json", True), ("secrets.yaml", True), ("dev.tfvars", True),
        (".env.example", False), (".env.sample", False), (".env.template", False), (".envrc.md", False),
        ("environment.py", False), ("key.py", False), ("keys.json", False), ("credentials.yaml", False),
        ("service-account.md", False), ("my_secrets.yml", False), ("tfstate.md", False), ("pem.txt", False),
    ],
)
def test_secret_files_are_recognised_by_name(filename: str, secret: bool) -> None:
    assert is_secret_file(filename) is secret


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_a_symlink_named_like_a_secret_file_is_left_out_too(chdir_tmp: Path) -> None:
    (chdir_tmp / "p").mkdir()
    (chdir_tmp / "p" / "settings.txt").write_text("LINKED_CONTENT")
    (chdir_tmp / "p" / ".env").symlink_to(chdir_tmp / "p" / "settings.txt")
    bundle = load_context(make_settings(project="p"))
    assert by_path(bundle)["p/.env"]["omitted"] == "secret file"
    assert by_path(bundle)["p/settings.txt"]["omitted"] is None


def test_an_explicitly_named_secret_file_is_sent_and_scrubbed(chdir_tmp: Path) -> None:
    # The user asked for this file by name, so it is included; the scrubber (run on all context) redacts values.
    (chdir_tmp / ".env").write_text("DB_PASSWORD=Tr0ub4dor-3x\nSTRIPE_SECRET_KEY=sk_live_51HqT9kLmN3pQ7rS2tU8vW4x\n"
                                    "LOG_LEVEL=debug\n")
    bundle = load_context(make_settings(context=[".env"]))
    assert bundle.sources == [{"path": ".env", "bytes": 92, "sent": 92, "truncated": False, "kind": "context_file",
                               "omitted": None}]
    assert "LOG_LEVEL=debug" in bundle.text
    scrubbed, report = scrub(bundle.text)
    assert "Tr0ub4dor" not in scrubbed and "sk_live_" not in scrubbed
    assert "DB_PASSWORD=[REDACTED_PASSWORD]" in scrubbed and "LOG_LEVEL=debug" in scrubbed
    assert report.by_type == {"password": 1, "stripe_key": 1}


def test_stdin_is_appended_after_files(chdir_tmp: Path) -> None:
    (chdir_tmp / "a.md").write_text("file body")
    bundle = load_context(make_settings(context=["a.md"]), stdin_text="piped log line")
    assert bundle.text.endswith("<stdin>\npiped log line\n</stdin>")
    assert bundle.sources[-1] == {"path": "-", "bytes": 14, "sent": 14, "truncated": False, "kind": "stdin", "omitted": None}


def test_no_context_is_an_empty_bundle() -> None:
    bundle = load_context(make_settings())
    assert bundle.empty and bundle.text == "" and bundle.sources == []
    assert bundle.as_dict() == {"text": "", "sources": []}
