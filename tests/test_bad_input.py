"""Bad input from the person at the terminal: every case is answered with one line on stderr naming what is wrong
(the option or key, and what is allowed), no traceback, nothing on stdout, and the documented exit code (2 usage or
configuration, 1 storage). Each case runs the real CLI (``sys.executable -m conclave``) with a temporary home.
The last section: how the long-running commands stop and what they log, and the round count of a failed run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import sqlite3
import sys
from collections.abc import AsyncIterator, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import clean_env, run_conclave

from conclave.errors import UsageError
from conclave.eval.run_store import check_run_id
from conclave.store.journal import read_journal
from conclave.store.paths import StoreLayout, check_consultation_id
from conclave.testing.fake_server import FakeProviderServer, Fault, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for

CLI = [sys.executable, "-m", "conclave"]

USAGE, STORAGE = 2, 1

#: (argv, exit code, what the one line must contain)
CASES: list[tuple[list[str], int, str]] = [
    # the consultation's own command line
    ([""], USAGE, "conclave: the question is empty"),
    (["-"], USAGE, "conclave: the question is empty"),
    (["--model", "gpt-4o", "Q?"], USAGE, "--model is not an option; choose models with overrides"),
    (["--bogus", "Q?"], USAGE, "--bogus is not an option"),
    (["Q?", "rounds=abc"], USAGE, "rounds: input should be a valid integer"),
    (["Q?", "rounds=2.5"], USAGE, "rounds: input should be a valid integer"),
    (["Q?", "quick=2"], USAGE, "quick: input should be a valid boolean"),
    (["Q?", "verbose=maybe"], USAGE, "verbose: input should be a valid boolean"),
    (["Q?", "live=maybe"], USAGE, "live: input should be a valid boolean"),
    (["Q?", "live=true", "live_port=99999"], USAGE, "live_port: input should be less than or equal to 65535"),
    (["Q?", "live_port=abc"], USAGE, "live_port: input should be a valid integer"),
    (["Q?", "context=[/nonexistent/file.txt]"], USAGE, "context: file not found: /nonexistent/file.txt"),
    (["Q?", "context=/nonexistent"], USAGE, "context: input should be a valid list"),
    (["Q?", "context=[/etc]"], USAGE, "context: not a file: /etc"),
    (["-cn", "nope", "Q?"], USAGE, "Cannot find primary config 'nope'"),
    (["Q?", "hydra.bogus=1"], USAGE, "hydra.bogus: Key 'bogus' not in 'HydraConf'"),
    (["Q?", "cost.always_allow_under=abc"], USAGE, "cost.always_allow_under: input should be a valid number"),
    (["Q?", "cost.always_allow_under=-5"], USAGE, "cost.always_allow_under: input should be greater than or equal to 0"),
    (["Q?", "cost.budget=-1"], USAGE, "cost.budget: unknown key; known keys under cost:"),
    (["Q?", "+agents.x=1"], USAGE, "agents.x: input should be a valid dictionary"),
    (["Q?", "judge=nope"], USAGE, "judge: input should be a valid dictionary"),
    (["Q?", "judge.provider=nope"], USAGE, "judge.provider: unknown provider 'nope'; allowed:"),
    (["Q?", "agents.security.provider=nope"], USAGE, "agents.security.provider: unknown provider 'nope'"),
    (["Q?", "agents.security=nope"], USAGE, "agents.security: input should be a valid dictionary"),
    (["Q?", "agents.security.model="], USAGE, "agents.security.model: string should have at least 1 character"),
    (["Q?", "mode.options.bogus=1"], USAGE, "mode.options.bogus: unknown key; to add one"),
    (["Q?", "provider=nope"], USAGE, "provider: unknown key; known keys:"),
    (["Q?", "output=nope"], USAGE, "output: input should be a valid dictionary"),
    (["Q?", "output.format="], USAGE, "output.format: input should be 'markdown', 'json', 'both' or 'html'"),
    (["Q?", "filtering=nope"], USAGE, "filtering: input should be a valid dictionary"),
    (["Q?", "hedging=nope"], USAGE, "hedging: input should be a valid dictionary"),
    (["Q?", "cost=nope"], USAGE, "cost: input should be a valid dictionary"),
    (["Q?", "early_termination.threshold=-0.1"], USAGE, "early_termination.threshold: input should be greater"),
    (["Q?", "providers.openai.base_url=notaurl"], USAGE, "providers.openai.base_url: string should match pattern"),
    (["Q?", "providers.openai.timeout_s=-1"], USAGE, "providers.openai.timeout_s: input should be greater than 0"),
    (["Q?", "providers.nope.model=x"], USAGE, "providers.nope.model: unknown key; known keys under providers:"),
    (["Q?", "mode=${oc.env:HOME}"], USAGE, "mode: '"),
    (["Q?", "persona@agents.security=nope"], USAGE, "persona@agents.security: Could not override"),
    (["Q?", "=x"], USAGE, "Could not override ''"),
    (["Q?", "~nope"], USAGE, "Could not delete from config. 'nope' does not exist"),
    (["Q?", "verbose"], USAGE, "cannot parse override: Error parsing override 'verbose'"),
    (["Q?", "[1,2]"], USAGE, "cannot parse override:"),
    (["--cfg", "bogus"], USAGE, "--cfg: 'bogus' is not one of: job, hydra, all"),
    (["--cfg"], USAGE, "--cfg needs one of: job, hydra, all"),
    (["--cfg=bogus"], USAGE, "--cfg: 'bogus' is not one of: job, hydra, all"),
    (["--cfg", "rounds=2"], USAGE, "--cfg: 'rounds=2' is not one of: job, hydra, all"),
    (["-cn"], USAGE, "-cn needs a value"),
    (["-p"], USAGE, "-p needs a value"),
    (["Q?", "--config-dir"], USAGE, "--config-dir needs a value"),
    (["-sc"], USAGE, "--shell-completion needs one of install=SHELL"),
    (["--hydra-help", "--bogus"], USAGE, "--bogus is not an option"),
    # subcommands: unknown options, missing or extra arguments, bad values
    (["plugins", "--bogus"], USAGE, "conclave plugins: unrecognized arguments: --bogus"),
    (["plugins", "extra"], USAGE, "conclave plugins: unrecognized arguments: extra"),
    (["schemas"], USAGE, "conclave schemas: the following arguments are required"),
    (["schemas", "bogus"], USAGE, "conclave schemas: argument {list,show,validate}: invalid choice: 'bogus'"),
    (["schemas", "show"], USAGE, "conclave schemas: the following arguments are required: name"),
    (["schemas", "show", "nope"], USAGE, "conclave schemas: unknown schema 'nope'; allowed:"),
    (["schemas", "validate", "independent"], USAGE, "the following arguments are required: file"),
    (["schemas", "validate", "independent", "/nonexistent.json"], USAGE, "cannot read /nonexistent.json"),
    (["doctor", "--bogus"], USAGE, "conclave doctor: unrecognized arguments: --bogus"),
    (["doctor", "--timeout", "abc"], USAGE, "argument --timeout: 'abc' is not a number of seconds above 0"),
    (["doctor", "--timeout", "-1"], USAGE, "argument --timeout: '-1' is not a number of seconds above 0"),
    (["doctor", "--call-timeout", "0"], USAGE, "argument --call-timeout: '0' is not a number of seconds above 0"),
    (["doctor", "rounds=abc"], USAGE, "conclave doctor: rounds: input should be a valid integer"),
    (["doctor", "mode=nope"], USAGE, "conclave doctor: mode: 'nope' is not one of:"),
    (["doctor", "notanoverride"], USAGE, "conclave doctor: cannot parse override"),
    (["logs"], USAGE, "conclave logs: the following arguments are required: command"),
    (["logs", "bogus"], USAGE, "conclave logs: argument command: invalid choice: 'bogus' (choose from"),
    (["logs", "show"], USAGE, "conclave logs: the following arguments are required: id"),
    (["logs", "show", "nonexistent"], USAGE, "conclave logs: no consultation 'nonexistent'"),
    (["logs", "show", "../x"], USAGE, "conclave logs: no consultation '../x'"),
    (["logs", "list", "-n", "abc"], USAGE, "argument -n/--count: invalid int value: 'abc'"),
    (["logs", "list", "--bogus"], USAGE, "conclave logs: unrecognized arguments: --bogus"),
    (["logs", "verify", "nonexistent"], USAGE, "conclave logs: no consultation 'nonexistent'"),
    (["logs", "verify", "--against"], USAGE, "argument --against: expected one argument"),
    (["logs", "verify", "--against", "garbage"], USAGE, "conclave logs: not a heads digest: 'garbage'"),
    (["logs", "head", "extra"], USAGE, "conclave logs: unrecognized arguments: extra"),
    (["stats", "--month", "2024-13"], USAGE, "conclave stats: --month: expected YYYY-MM (years 0001 to 9998), got"),
    (["stats", "--month", "abc"], USAGE, "conclave stats: --month: expected YYYY-MM (years 0001 to 9998), got 'abc'"),
    (["stats", "--month", "9999-12"], USAGE, "conclave stats: --month: expected YYYY-MM (years 0001 to 9998), got"),
    (["stats", "--month", "0000-01"], USAGE, "conclave stats: --month: expected YYYY-MM (years 0001 to 9998), got"),
    (["stats", "--week", "--month"], USAGE, "argument --month: not allowed with argument --week"),
    (["stats", "--bogus"], USAGE, "conclave stats: unrecognized arguments: --bogus"),
    (["browse", "--port", "99999"], USAGE, "argument --port: '99999' is not a port number: allowed 0 to 65535"),
    (["browse", "--port", "-1"], USAGE, "argument --port: '-1' is not a port number: allowed 0 to 65535"),
    (["browse", "--port", "abc"], USAGE, "argument --port: 'abc' is not a port number"),
    (["browse", "--port"], USAGE, "argument --port: expected one argument"),
    (["browse", "extra"], USAGE, "conclave browse: unrecognized arguments: extra"),
    (["index"], USAGE, "conclave index: the following arguments are required: command"),
    (["index", "bogus"], USAGE, "conclave index: argument command: invalid choice: 'bogus' (choose from"),
    (["index", "rebuild", "extra"], USAGE, "conclave index: unrecognized arguments: extra"),
    (["index", "merge"], USAGE, "conclave index: the following arguments are required: homes"),
    (["index", "merge", "/nonexistent"], USAGE, "conclave index: /nonexistent: not a conclave data home"),
    (["resume", "nonexistent"], USAGE, "conclave resume: no consultation 'nonexistent'"),
    (["resume"], USAGE, "conclave resume: no interrupted consultation to resume"),
    (["resume", "a", "b"], USAGE, "conclave resume: unrecognized arguments: b"),
    (["show-prompt"], USAGE, "conclave show-prompt: the following arguments are required: round, rest"),
    (["show-prompt", "bogusround", "Q?"], USAGE, "conclave show-prompt: no round 'bogusround' in the converge plan"),
    (["show-prompt", "9", "Q?"], USAGE, "conclave show-prompt: no round '9' in the converge plan"),
    (["show-prompt", "1", "Q?", "--agent", "nobody"], USAGE, "--agent: 'nobody' is not on the panel; one of:"),
    (["show-prompt", "--from", "nope", "1"], USAGE, "conclave show-prompt: no journal for consultation nope"),
    (["show-prompt", "1", "Q?", "rounds=abc"], USAGE, "conclave show-prompt: rounds: input should be a valid"),
    (["show-prompt", "1", "Q?", "R?"], USAGE, "conclave show-prompt: takes one question; quote it"),
    (["show", "nope"], USAGE, "conclave show: no consultation 'nope'"),
    (["show"], USAGE, "conclave show: the following arguments are required: id"),
    (["show", "--format", "pdf", "x"], USAGE, "conclave show: --format: 'pdf' is not one of markdown, json, html"),
    (["show", "x", "--round", "abc"], USAGE, "conclave show: argument --round: invalid int value: 'abc'"),
    (["serve", "--port", "99999"], USAGE, "argument --port: '99999' is not a port number: allowed 0 to 65535"),
    (["serve", "--port", "abc"], USAGE, "argument --port: 'abc' is not a port number"),
    (["serve", "--bogus"], USAGE, "conclave serve: unrecognized arguments: --bogus"),
    (["serve", "--openai", "--max-cost", "lots"], USAGE, "argument --max-cost: 'lots' is not a number of dollars"),
    (["serve", "--openai", "--max-cost", "-1"], USAGE, "argument --max-cost: '-1' is not a number of dollars ≥ 0"),
    (["serve", "--host", "nonexistent.invalid", "--port", "0"], USAGE, "--host: cannot listen on nonexistent.invalid:0"),
    (["mcp", "--http", "--port", "99999"], USAGE, "argument --port: '99999' is not a port number: allowed 0 to 65535"),
    (["mcp", "--http", "--host", "nonexistent.invalid", "--port", "0"], USAGE,
     "conclave mcp: --host: cannot listen on nonexistent.invalid:0"),
    (["mcp", "--heartbeat", "99"], USAGE, "conclave mcp: --heartbeat: 99 is not in (0, 15] seconds"),
    (["mcp", "--heartbeat", "abc"], USAGE, "conclave mcp: argument --heartbeat: invalid float value: 'abc'"),
    (["mcp", "notanoverride"], USAGE, "conclave mcp: not an override: 'notanoverride'"),
    (["mcp", "rounds=abc"], USAGE, "conclave mcp: rounds: input should be a valid integer"),
    (["mcp", "--bogus"], USAGE, "conclave mcp: unrecognized arguments: --bogus"),
    (["eval", "report"], USAGE, "conclave eval: the following arguments are required: run"),
    (["eval", "resume"], USAGE, "conclave eval: the following arguments are required: run_id"),
    (["eval", "report", "nope"], USAGE, "conclave eval: eval run 'nope' not found"),
    (["eval", "report", "latest", "--format", "pdf"], USAGE, "conclave eval: --format: 'pdf' is not one of"),
    (["eval", "/nonexistent.jsonl"], USAGE, "eval set '/nonexistent.jsonl'"),
    (["eval", "arithmetic", "eval.n=abc"], USAGE, "eval.n: input should be a valid integer"),
    (["eval", "arithmetic", "--bogus"], USAGE, "conclave eval: --bogus is not an option"),
]


def assert_one_line(proc: Any, code: int, expected: str) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert proc.returncode == code, proc.stderr
    assert expected in lines[0], lines[0]
    assert proc.stdout == ""
    return lines[0]


@pytest.mark.parametrize(("argv", "code", "expected"), CASES, ids=[" ".join(c[0])[:60] or "''" for c in CASES])
def test_bad_input_is_one_line_with_its_exit_code(tmp_path: Path, argv: list[str], code: int, expected: str) -> None:
    assert_one_line(run_conclave(*argv, home=tmp_path, env=FAKE_KEYS), code, expected)


# -------------------------------------------------------------------------------- a port another program holds

@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        yield holder.getsockname()[1]


@pytest.mark.parametrize("command", [["serve"], ["mcp", "--http"], ["browse", "--no-open"]])
def test_a_port_in_use_is_one_line_naming_the_option(tmp_path: Path, busy_port: int, command: list[str]) -> None:
    proc = run_conclave(*command, "--port", str(busy_port), home=tmp_path)
    line = assert_one_line(proc, USAGE, f"--port: cannot listen on 127.0.0.1:{busy_port}")
    assert line.endswith("Address already in use"), line


# ------------------------------------------------------------------- the user's own settings file is broken

SETTINGS_CASES = [
    (b"rounds: 2\n# caf\xe9 in Latin-1\n", "not UTF-8 text (byte 0xe9 at offset 15); save it as UTF-8"),
    (b"rounds: [\n", "invalid YAML in"),
    (b"rounds: 9\n", "rounds: input should be less than or equal to 4 (got 9)"),
]


@pytest.mark.parametrize("command", [["Q?"], ["doctor"], ["show-prompt", "1", "Q?"]])
@pytest.mark.parametrize(("content", "expected"), SETTINGS_CASES, ids=["latin-1", "yaml", "value"])
def test_a_broken_user_settings_file_is_one_line_naming_it(tmp_path: Path, command: list[str], content: bytes,
                                                           expected: str) -> None:
    settings = tmp_path / "conf" / "user" / "settings.yaml"
    settings.parent.mkdir(parents=True)
    settings.write_bytes(content)
    line = assert_one_line(run_conclave(*command, home=tmp_path, env=FAKE_KEYS), USAGE, expected)
    assert str(settings) in line


def test_a_user_config_group_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    panel = tmp_path / "conf" / "agents" / "mine.yaml"
    panel.parent.mkdir(parents=True)
    panel.write_bytes(b"a:\n  persona: caf\xe9\n")
    line = assert_one_line(run_conclave("Q?", "agents=mine", home=tmp_path, env=FAKE_KEYS), USAGE,
                           "not UTF-8 text")
    assert line.startswith(f"conclave: {panel}:"), line


# ------------------------------------------------------------------------------ an existing consultation

def test_bad_input_about_a_recorded_consultation(debates: Any) -> None:
    home, cid = debates.home, debates.converge
    cases = [
        (["show", cid, "--round", "9"], f"--round: 9 is not a round of {cid}; rounds with artifacts: 1, 2, 3, 4"),
        (["show", cid, "-o", "/nonexistent/dir/report.md"],
         "--output: cannot write /nonexistent/dir/report.md: No such file or directory"),
        (["show", "c-"], "'c-' is ambiguous:"),
        (["show-prompt", "9", "--from", cid], "no round '9' in the converge plan"),
        (["show-prompt", "1", "--from", cid, "--agent", "nobody"], "--agent: 'nobody' is not on the panel"),
        (["show-prompt", "2", "--from", cid, "--agent", "security"], "--agent: this round is played by the judge"),
        (["resume", cid], f"consultation {cid} already ended (complete); nothing to resume"),
    ]
    for argv, expected in cases:
        assert_one_line(run_conclave(*argv, home=home, cwd=home.parent), USAGE, expected)


# ------------------------------------------------------------------------------------- input that is not UTF-8

def _run_bytes(home: Path, *args: str, stdin: bytes | None = None, shell_stdin: str = "") -> Any:
    """The CLI with raw bytes on stdin, or (``shell_stdin``) a shell redirection of stdin such as ``<&-``."""
    import shlex
    import subprocess

    command = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "conclave", *args))
    return subprocess.run(["sh", "-c", f"exec {command} {shell_stdin}"], input=stdin, capture_output=True,
                          env=clean_env(home, FAKE_KEYS), cwd=home, timeout=120)


def test_a_question_on_stdin_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    done = _run_bytes(tmp_path, "-", stdin="Caf\u00e9 or tea?".encode("latin-1"))
    assert_one_line(_decoded(done), USAGE, "conclave: the question on stdin is not UTF-8 text (at offset 3)")


def test_a_question_read_from_a_closed_stdin_is_one_line(tmp_path: Path) -> None:
    done = _run_bytes(tmp_path, "-", shell_stdin="<&-")
    assert_one_line(_decoded(done), USAGE, "conclave: the question is - (read it from stdin), but stdin is closed")


def test_an_eval_set_that_is_not_utf8_is_one_line_naming_it(tmp_path: Path) -> None:
    eval_set = tmp_path / "set.jsonl"
    eval_set.write_bytes('{"question": "Caf\u00e9?", "answer": "1"}\n'.encode("latin-1"))
    done = run_conclave("eval", str(eval_set), home=tmp_path, env=FAKE_KEYS)
    assert_one_line(done, USAGE, f"conclave: eval set '{eval_set}': not UTF-8 text (byte 0xe9 at offset 17)")


def _decoded(done: Any) -> Any:
    done.stdout, done.stderr = done.stdout.decode(), done.stderr.decode()
    return done


def test_the_stdio_mcp_server_with_stdin_closed_is_one_line(tmp_path: Path) -> None:
    done = _decoded(_run_bytes(tmp_path, "mcp", shell_stdin="<&-"))
    assert_one_line(done, USAGE, "conclave mcp: the stdio transport needs stdin and stdout open")


# ------------------------------------------------- wrong statuses and logged tracebacks of the long-running commands

WEB_TOKEN = "web-token-for-tests-only"
JUDGE = "gpt-4.1"  # distinct from the default panel's agent models, so the judge's replies can be scripted apart


class _FormFields(HTMLParser):
    """The hidden fields of the page's start form (whatever the page needs posted back with it)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        fields = dict(attrs)
        if tag == "input" and fields.get("type") == "hidden" and fields.get("name"):
            self.hidden[str(fields["name"])] = fields.get("value") or ""


@contextlib.asynccontextmanager
async def serving(home: Path, env: dict[str, str]) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """``conclave serve --port 0``: yields the process and its base URL once it listens."""
    process = await asyncio.create_subprocess_exec(
        *CLI, "serve", "--port", "0", env=clean_env(home, {**env, "CONCLAVE_WEB_TOKEN": WEB_TOKEN}), cwd=home,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert process.stderr is not None
    try:
        base = None
        while base is None:
            line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
            assert line, "conclave serve exited before listening"
            found = re.search(r"live view at (http://127\.0\.0\.1:\d+)/", line)
            base = found.group(1) if found else None
        yield process, base
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_an_invalid_id_in_the_live_view_is_404_without_a_traceback(tmp_path: Path) -> None:
    import aiohttp

    async with serving(tmp_path, {}) as (process, base), aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        for cid in ("!bad", ".hidden", "-x", "a" * 200, "a%20b", "%00"):
            for suffix in ("", "/events"):
                async with session.get(f"{base}/c/{cid}{suffix}?token={WEB_TOKEN}") as response:
                    assert response.status == 404, (cid, suffix, response.status)
        process.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(process.communicate(), 60)
    assert "Traceback" not in err.decode(), err.decode()


async def test_serve_stopped_by_sigterm_says_so_and_saves_its_consultation_as_partial(
        tmp_path: Path, fake_provider_server: FakeProviderServer) -> None:
    import aiohttp

    fake = fake_provider_server
    fake.script(JUDGE, lambda request: Reply(json=instance_for(request.schema), latency=60))  # round 2 hangs
    settings = tmp_path / "conf" / "user" / "settings.yaml"
    settings.parent.mkdir(parents=True)
    settings.write_text(yaml.safe_dump({"providers": fake.providers_config(), "judge": {"model": JUDGE},
                                        "cost": {"always_allow_under": 100.0}}))
    async with serving(tmp_path, FAKE_KEYS) as (process, base), aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        async with session.get(f"{base}/?token={WEB_TOKEN}") as page:
            form = _FormFields()
            form.feed(await page.text())
        async with session.post(f"{base}/consult?token={WEB_TOKEN}", data={**form.hidden, "question": "Should we shard?"},
                                headers={"Origin": base}, allow_redirects=False) as started:
            assert started.status == 303, await started.text()
            cid = started.headers["Location"].rsplit("/", 1)[-1]
        for _ in range(600):  # until round 2 is under way: round 1's answers are journaled
            if fake.requests_for(JUDGE):
                break
            await asyncio.sleep(0.05)
        assert fake.requests_for(JUDGE), "round 2 never started"
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 60)
    stderr = err.decode()
    assert "Traceback" not in stderr, stderr
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "conclave serve: stopped"
    records = read_journal(StoreLayout(tmp_path).journal_path(cid)).records
    ended = [r["data"] for r in records if r["type"] == "consultation:completed"]
    assert [e["status"] for e in ended] == ["partial"]  # saved and resumable; a killed run would read interrupted
    assert ended[0]["result"]["completed_rounds"] == 1


async def test_a_client_leaving_the_http_mcp_server_logs_no_traceback_and_sigterm_stops_it_saying_so(
        tmp_path: Path) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    process = await asyncio.create_subprocess_exec(
        *CLI, "mcp", "--http", "--port", "0", env=clean_env(tmp_path, {"CONCLAVE_MCP_TOKEN": WEB_TOKEN}),
        cwd=tmp_path, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    assert process.stderr is not None
    try:
        url = None
        while url is None:
            line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
            assert line, "the server exited before listening"
            found = re.search(r"listening on (http://\S+)", line)
            url = found.group(1) if found else None
        for _ in range(3):  # each client initializes, lists the tools and leaves (ending its session)
            client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {WEB_TOKEN}"})
            async with client, Client(streamable_http_client(url, http_client=client),
                                      mode="legacy") as session:
                assert (await session.list_tools()).tools
        await asyncio.sleep(1.0)  # what the server logs about a client that left, it logs by now
    finally:
        process.terminate()  # SIGTERM
        _, err = await asyncio.wait_for(process.communicate(), 60)
    stderr = err.decode()
    assert "Traceback" not in stderr and "ClosedResourceError" not in stderr, stderr
    assert process.returncode == 130 and stderr.strip().splitlines()[-1] == "conclave mcp: stopped", stderr


async def test_a_failed_round_1_counts_no_completed_round_in_the_result_and_the_index(
        tmp_path: Path, fake_provider_server: FakeProviderServer) -> None:
    fake = fake_provider_server
    for model in ("claude-sonnet-4-5", "gemini-2.5-pro"):  # one agent of three answers: too few to debate
        fake.script(model, Fault.auth_rejected())
    process = await asyncio.create_subprocess_exec(
        *CLI, "Should we shard?", *fake.overrides(), "cost.auto_approve=true", "output.format=json",
        env=clean_env(tmp_path, FAKE_KEYS), cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode == 1, err.decode()
    result = json.loads(out)
    assert result["status"] == "partial" and list(result["artifacts"]["round_1"]) == ["architect"]
    assert result["completed_rounds"] == 0
    index = sqlite3.connect(tmp_path / "index.db")
    try:
        (indexed,) = index.execute("select rounds_completed from consultations where id = ?",
                                   (result["consultation_id"],)).fetchone()
    finally:
        index.close()
    assert indexed == 0


def test_an_id_ending_in_a_newline_is_refused() -> None:
    """Ids become file names and log lines: ``$`` also matched before a trailing newline, so "c1\\n" passed."""
    for check in (check_consultation_id, check_run_id):
        assert check("c-mx0jeyy7myx7") == "c-mx0jeyy7myx7"
        for bad in ("c1\n", "c1\r\n", "\nc1", "c1\nc2"):
            with pytest.raises(UsageError):
                check(bad)
