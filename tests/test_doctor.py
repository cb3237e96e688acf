"""``conclave doctor`` as a subprocess against the fake server (the fake is served by this test's event loop)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from typing import Any

import pytest

from conclave.testing.fake_server import FakeProviderServer
from conclave.testing.pytest_plugin import FAKE_KEYS


async def _doctor(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", "doctor", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(os.environ),
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["provider"]: entry for entry in report["providers"]}


def _assert_no_key_in(*texts: str) -> None:
    for text in texts:
        for key in FAKE_KEYS.values():
            assert key not in text


async def test_doctor_reports_every_provider_ready(fake_provider_server, conclave_env):
    code, out, err = await _doctor("--json", *fake_provider_server.overrides())
    report = json.loads(out)
    providers = _by_name(report)
    assert code == 0, err
    assert report["ok"] is True and report["used"] == ["anthropic", "gemini", "openai"]
    assert set(providers) == {"openai", "anthropic", "gemini", "grok", "mistral", "local"}
    assert providers["local"]["used"] is False
    assert providers["anthropic"]["key_present"] and providers["anthropic"]["key_source"] == "ANTHROPIC_API_KEY"
    assert providers["anthropic"]["models"] == {"claude-sonnet-4-5": True}  # listed as a dated snapshot
    assert providers["openai"]["models"] == {"gpt-4o": True}
    assert providers["gemini"]["reachable"] is True and providers["grok"]["used"] is False
    paths = {r.path for r in fake_provider_server.requests}
    assert paths == {"/openai/v1/models", "/anthropic/v1/models", "/gemini/v1beta/models"}
    _assert_no_key_in(out, err)


async def test_doctor_fails_when_a_panel_model_is_unknown(fake_provider_server, conclave_env):
    code, out, _ = await _doctor(*fake_provider_server.overrides(), "agents.architect.model=gpt-imaginary")
    assert code == 1
    assert "gpt-imaginary ✗ unknown" in out
    assert "not usable but used by the panel: openai" in out


async def test_doctor_names_a_rejected_key_but_never_prints_it(conclave_env):
    async with FakeProviderServer(keys={"anthropic": "a-different-key"}) as fake:
        code, out, err = await _doctor("--json", *fake.overrides())
    anthropic = _by_name(json.loads(out))["anthropic"]
    assert code == 1
    assert anthropic["key_rejected"] is True and anthropic["usable"] is False
    assert anthropic["error"].startswith("ANTHROPIC_API_KEY was rejected")
    _assert_no_key_in(out, err)


async def test_doctor_reports_a_missing_key_without_calling_the_provider(fake_provider_server, conclave_env,
                                                                         monkeypatch):
    monkeypatch.delenv("MISTRAL_API_KEY")
    # mistral keeps its official endpoint (which needs a key) and joins the panel
    overrides = [o for o in fake_provider_server.overrides() if not o.startswith("providers.mistral.")]
    code, out, _ = await _doctor("--json", *overrides, "agents.architect.provider=mistral",
                                 "agents.architect.model=mistral-large-latest")
    mistral = _by_name(json.loads(out))["mistral"]
    assert code == 1
    assert (mistral["key_required"], mistral["key_present"], mistral["reachable"]) == (True, False, None)
    assert mistral["problems"] == ["no key: set MISTRAL_API_KEY"]


async def test_doctor_reports_an_unreachable_endpoint(fake_provider_server, conclave_env):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, out, _ = await _doctor("--timeout", "2", *fake_provider_server.overrides(),
                                 f"providers.gemini.base_url=http://127.0.0.1:{port}/v1beta")
    assert code == 1
    gemini_line = next(line for line in out.splitlines() if " gemini " in line)
    assert gemini_line.startswith("FAIL") and " no " in gemini_line
    assert f"cannot reach gemini at 127.0.0.1:{port}" in out


@pytest.mark.parametrize(("override", "key"), [("providers.openai.timeout_s=-1", "providers.openai.timeout_s"),
                                             ("agents=nonexistent", "agents")])
async def test_doctor_rejects_a_bad_configuration_with_exit_2(conclave_env, override, key):
    code, out, err = await _doctor(override)
    assert (code, out) == (2, "")
    assert err.startswith(f"conclave doctor: {key}: ")


# ------------------------------------------------------------------------------------- the structured-output test call

_LLAMA_CPP_PYTHON_500 = "Input should be 'text' or 'json_object' (body.response_format.type: json_schema)"


def _rejects_json_schema(request: Any) -> Any:
    from conclave.testing.fake_server import Fault, Reply

    if ((request.json or {}).get("response_format") or {}).get("type") == "json_schema":
        return Fault.http(500, _LLAMA_CPP_PYTHON_500)
    return Reply(json={"answer": "yes, 17 is prime", "confidence": 0.9})


async def test_doctor_test_calls_a_free_local_server_and_reports_the_form_it_takes(fake_provider_server,
                                                                                  conclave_env):
    fake = fake_provider_server
    fake.script("gpt-4o", _rejects_json_schema)
    # send_key=official: a keyless server on 127.0.0.1, i.e. free, so doctor calls it without --probe
    code, out, err = await _doctor("--json", *fake.overrides(send_key="official"), "agents=openai_only")
    report = json.loads(out)
    openai = _by_name(report)["openai"]
    assert code == 0, err
    assert report["call_tested"] is True and openai["free"] is True
    assert openai["calls"]["gpt-4o"]["ok"] is True and openai["calls"]["gpt-4o"]["form"] == "json_object"
    forms = [r.json["response_format"]["type"] for r in fake.requests_for("gpt-4o")]
    assert forms == ["json_schema", "json_object"]
    # what the test call learnt is what the next consultation starts with
    assert json.loads((conclave_env / "structured_output.json").read_text()) == {
        f"{fake.base_url('openai')} gpt-4o": "json_object"}


async def test_doctor_fails_a_reachable_server_whose_answers_are_not_valid(fake_provider_server, conclave_env):
    from conclave.testing.fake_server import Reply

    fake = fake_provider_server
    fake.script("gpt-4o", Reply(text="I think so."))  # reachable, model listed, yet no usable artifact
    code, out, _ = await _doctor(*fake.overrides(send_key="official"), "agents=openai_only")
    assert code == 1
    assert "test call to gpt-4o failed: the answer holds no JSON object" in out
    assert "not usable but used by the panel: openai" in out


async def test_doctor_prices_the_test_call_on_paid_endpoints_and_makes_it_only_with_probe(fake_provider_server,
                                                                                         conclave_env):
    fake = fake_provider_server
    code, out, _ = await _doctor(*fake.overrides(), "agents=openai_only")
    assert code == 0
    assert "gpt-4o: not tested (--probe, ≈ $0.00" in out and "run conclave doctor --probe" in out
    assert fake.requests_for("gpt-4o") == []
    code, out, err = await _doctor("--json", "--probe", *fake.overrides(), "agents=openai_only")
    openai = _by_name(json.loads(out))["openai"]
    assert code == 0, err
    assert openai["calls"]["gpt-4o"]["ok"] is True and openai["calls"]["gpt-4o"]["cost"] > 0
    assert len(fake.requests_for("gpt-4o")) == 1
    _assert_no_key_in(out, err)


async def test_doctor_without_keys_checks_only_the_offline_panel_and_calls_the_rest_not_configured(
        conclave_env, monkeypatch, tmp_path):
    for var in FAKE_KEYS:
        monkeypatch.delenv(var)
    broken = tmp_path / "broken.gguf"  # fails fast where the packaged model would take seconds to load
    broken.write_bytes(b"not a gguf")
    code, out, _ = await _doctor(f"providers.local.model_path={broken}")
    rows = {line.split()[1]: line for line in out.splitlines()[1:] if line.split()[:1] in (["-"], ["ok"], ["FAIL"], ["warn"])}
    assert code == 1
    # the panel that would run (the offline one) is checked, and fails here for its broken model file
    assert rows.pop("local").split()[:3] == ["FAIL", "local", "yes"]
    assert "not usable but used by the panel: local" in out
    # the providers it does not use are neither failures nor warnings
    assert {"openai", "anthropic", "gemini", "grok", "mistral"} <= set(rows)
    assert all(row.split()[:3] == ["-", name, "no"] and "not configured" in row for name, row in rows.items())
