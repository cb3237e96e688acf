"""The command line: verbatim questions, Hydra's flags, no stdout noise, no output directories."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from cli_helpers import clean_env, run_conclave
from hypothesis import given, settings
from hypothesis import strategies as st

from conclave.cli import _split_question, hydra_quote
from conclave.store.journal import read_journal
from conclave.store.paths import StoreLayout
from conclave.testing.fake_server import FakeProviderServer, Fault, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for

AWKWARD_QUESTIONS = [
    "Should we use X, or Y?",
    "What's best for 'billing'?",
    'He said "ship it"',
    "ratio a=b, c == d",
    "lists [a, b] and maps {k: v}",
    "x # not a comment",
    "time 10:30, key: value",
    "first line\nsecond line\n\tindented",
    "ends with a backslash \\",
    "C:\\path\\to\\",
    "use ${oc.env:HOME} and ${oc.env:OPENAI_API_KEY}",
    "shell-escaped \\${oc.env:HOME} and \\\\${oc.env:HOME}",
    "nested ${a.${b}} and $HOME and `cmd` ; | &",
    "42",
    "true",
    "null",
    "  padded with spaces  ",
]


@pytest.mark.parametrize("question", AWKWARD_QUESTIONS)
def test_question_reaches_config_verbatim(tmp_path: Path, question: str) -> None:
    proc = run_conclave(question, "--cfg", "job", "--resolve", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    composed = yaml.safe_load(proc.stdout)
    assert composed["question"] == question
    assert isinstance(composed["question"], str)


def test_interpolation_in_question_is_not_expanded(tmp_path: Path) -> None:
    proc = run_conclave("leak ${oc.env:SECRET_FOR_TEST}?", "--cfg", "job", "--resolve", home=tmp_path,
                        env={"SECRET_FOR_TEST": "hunter2-value"})
    assert proc.returncode == 0, proc.stderr
    assert "hunter2-value" not in proc.stdout + proc.stderr
    assert yaml.safe_load(proc.stdout)["question"] == "leak ${oc.env:SECRET_FOR_TEST}?"


def test_question_from_stdin(tmp_path: Path) -> None:
    proc = run_conclave("-", "--cfg", "job", "--resolve", home=tmp_path, stdin="Piped, with 'quotes' = ok\n")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["question"] == "Piped, with 'quotes' = ok"


def test_question_after_double_dash_may_look_like_a_subcommand(tmp_path: Path) -> None:
    proc = run_conclave("--", "plugins", "--cfg", "job", "--resolve", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["question"] == "plugins"


def test_split_question_keeps_flag_values_with_their_flags() -> None:
    flags, overrides, question = _split_question(
        ["-cd", "/tmp/x", "Q?", "mode=explore", "-p", "agents", "--cfg", "job", "rounds=2"]
    )
    assert question == "Q?"
    assert flags == ["-cd", "/tmp/x", "-p", "agents", "--cfg", "job"]
    assert overrides == ["mode=explore", "rounds=2"]


def test_flags_may_follow_the_question_and_overrides(tmp_path: Path) -> None:
    proc = run_conclave("Q?", "mode=explore", "--cfg", "job", "agents=default", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    composed = yaml.safe_load(proc.stdout)
    assert composed["mode"]["strategy"] == "explore" and composed["question"] == "Q?"


_ESCAPE_ALPHABET = "\\$${}\"',=[]#: ab\n"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=_ESCAPE_ALPHABET, max_size=24))
def test_hydra_quote_round_trips_any_text_without_interpolating(text: str) -> None:
    """Whatever the user types — backslashes before ${, quotes, trailing backslashes — the question Hydra and
    OmegaConf hand back is exactly that text, never an interpolation's value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    value = OverridesParser.create().parse_override("question=" + hydra_quote(text)).value()
    assert OmegaConf.to_container(OmegaConf.create({"question": value}), resolve=True)["question"] == text


def test_escaped_interpolation_in_question_cannot_leak_a_variable(tmp_path: Path) -> None:
    question = 'echo "\\${oc.env:DB_PASSWORD}" and \\\\${oc.env:DB_PASSWORD}'
    proc = run_conclave(question, "--cfg", "job", "--resolve", "agents=default", home=tmp_path,
                        env={"DB_PASSWORD": "hunter2-prod-Secret"})
    assert proc.returncode == 0, proc.stderr
    assert "hunter2" not in proc.stdout
    assert yaml.safe_load(proc.stdout)["question"] == question


def test_hydra_quote_escapes_interpolation_and_quotes() -> None:
    assert hydra_quote('a "b" ${c}') == '"a \\"b\\" \\${c}"'
    assert hydra_quote("trail\\") == '"trail\\\\"'


def test_cfg_job_prints_composed_config_with_overrides(tmp_path: Path) -> None:
    proc = run_conclave("--cfg", "job", "mode=explore", "filtering.round3.tensions=1",
                        "agents.security.model=gpt-4o-mini", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    composed = yaml.safe_load(proc.stdout)
    assert composed["mode"]["strategy"] == "explore"
    assert composed["filtering"]["round3"] == {"consensus_points": 3, "tensions": 1}
    assert composed["agents"]["security"]["model"] == "gpt-4o-mini"
    assert composed["early_termination"] == {"threshold": 0.9, "non_interactive": "accept"}


def test_help_is_ours_and_lists_groups(tmp_path: Path) -> None:
    proc = run_conclave("--help", home=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.startswith("conclave — put a question to a panel of LLMs")
    assert "mode: adversarial, answer, converge, devils_advocate, explore" in proc.stdout
    agents_line = next(line for line in proc.stdout.splitlines() if line.startswith("agents: "))
    assert {"default", "local", "openai_only", "mixed_anthropic_openai"} <= set(agents_line[8:].split(", "))
    assert "early_termination.threshold" in proc.stdout


def test_info_searchpath_shows_packaged_config(tmp_path: Path) -> None:
    proc = run_conclave("--info", "searchpath", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "pkg://conclave.conf" in proc.stdout


def test_package_flag_prints_one_node(tmp_path: Path) -> None:
    proc = run_conclave("--cfg", "job", "-p", "judge", "agents=default", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout) == {"provider": "openai", "model": "gpt-4o"}


def test_config_dir_flag_adds_user_groups(tmp_path: Path) -> None:
    conf = tmp_path / "myconf" / "agents"
    conf.mkdir(parents=True)
    (conf / "duo.yaml").write_text(
        "alice: {persona: skeptic, provider: openai, model: gpt-4o-mini}\n"
        "bob: {persona: creative, provider: mistral, model: mistral-large-latest}\n"
    )
    proc = run_conclave("-cd", str(tmp_path / "myconf"), "--cfg", "job", "agents=duo", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert set(yaml.safe_load(proc.stdout)["agents"]) == {"alice", "bob"}


def test_config_name_flag_selects_primary_config(tmp_path: Path) -> None:
    confdir = tmp_path / "alt"
    confdir.mkdir()
    (confdir / "tiny.yaml").write_text("defaults:\n  - config\n  - _self_\nrounds: 2\n")
    proc = run_conclave("-cd", str(confdir), "-cn", "tiny", "--cfg", "job", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["rounds"] == 2


def test_user_settings_under_home_override_defaults(tmp_path: Path) -> None:
    user = tmp_path / "conf" / "user"
    user.mkdir(parents=True)
    (user / "settings.yaml").write_text("cost:\n  always_allow_under: 2.0\n")
    proc = run_conclave("--cfg", "job", "--resolve", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["cost"]["always_allow_under"] == 2.0
    # and the command line still wins over the user file
    proc = run_conclave("--cfg", "job", "cost.always_allow_under=0.1", home=tmp_path)
    assert yaml.safe_load(proc.stdout)["cost"]["always_allow_under"] == 0.1


def test_single_run_creates_no_outputs_dir_and_keeps_stdout_clean(tmp_path: Path) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    proc = run_conclave("Is this clean?", "rounds=7", home=tmp_path, cwd=work)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert list(work.iterdir()) == []


def test_empty_question_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_conclave("-", home=tmp_path, stdin="   \n")
    assert proc.returncode == 2
    assert "the question is empty" in proc.stderr


def test_missing_question_names_the_fix(tmp_path: Path) -> None:
    proc = run_conclave("mode=explore", "agents=default", home=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        'conclave: question: missing — pass the question as the first argument, e.g. conclave "Should we …?"'
    ]


def test_a_panel_file_brings_its_own_judge(tmp_path: Path) -> None:
    proc = run_conclave("--cfg", "job", "agents=local", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    composed = yaml.safe_load(proc.stdout)
    assert composed["judge"] == {"provider": "local", "model": "gemma-3-270m"}
    assert {a["provider"] for a in composed["agents"].values()} == {"local"}
    # and the command line still overrides the panel's judge
    proc = run_conclave("--cfg", "job", "agents=local", "judge.model=other", home=tmp_path)
    assert yaml.safe_load(proc.stdout)["judge"]["model"] == "other"


def test_zero_config_panel_follows_the_keys_present(tmp_path: Path) -> None:
    def panel(env: dict[str, str], *extra: str) -> dict:
        proc = run_conclave("--cfg", "job", *extra, home=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        return yaml.safe_load(proc.stdout)

    no_keys = panel({})
    assert {a["provider"] for a in no_keys["agents"].values()} == {"local"}
    only_openai = panel({"OPENAI_API_KEY": "sk-test"})
    assert {a["provider"] for a in only_openai["agents"].values()} == {"openai"}
    assert only_openai["judge"]["provider"] == "openai"
    every_key = panel({"OPENAI_API_KEY": "a", "ANTHROPIC_API_KEY": "b", "GEMINI_API_KEY": "c"})
    assert {a["provider"] for a in every_key["agents"].values()} == {"openai", "anthropic", "gemini"}
    # a panel named on the command line always wins
    assert {a["provider"] for a in panel({}, "agents=default")["agents"].values()} == {"openai", "anthropic", "gemini"}


def test_offline_panel_notice_is_printed_once_for_a_valid_run(tmp_path: Path) -> None:
    from conclave.panel import LOCAL_PANEL_NOTICE

    invalid = run_conclave("Q?", "rounds=9", home=tmp_path)  # a config error stays one line, notice or not
    assert invalid.stderr.splitlines() == ["conclave: rounds: input should be less than or equal to 4 (got 9)"]
    # a valid config whose model file is not a GGUF: the run starts (notice once), then fails fast at load
    not_a_model = tmp_path / "not-a-model.gguf"
    not_a_model.write_text("this is not a GGUF file")
    valid = run_conclave("Q?", "rounds=1", f"providers.local.model_path={not_a_model}", home=tmp_path)
    assert valid.returncode == 1
    assert valid.stderr.count(LOCAL_PANEL_NOTICE) == 1, valid.stderr
    inspect = run_conclave("--cfg", "job", home=tmp_path)
    assert LOCAL_PANEL_NOTICE not in inspect.stderr


@pytest.mark.parametrize("text", ["\\\n", "a\\\n", "\\\\\n", "${x}\\\n"])
def test_backslash_before_a_final_newline_round_trips(text: str) -> None:
    """Regression: Python's ``$`` matches before a trailing newline, which once doubled this backslash."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    value = OverridesParser.create().parse_override("question=" + hydra_quote(text)).value()
    assert OmegaConf.to_container(OmegaConf.create({"question": value}), resolve=True)["question"] == text


# ----------------------------------------------------------------- long-running commands: how they stop, what they log

CLI = [sys.executable, "-m", "conclave"]
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


async def test_a_client_leaving_the_http_mcp_server_logs_no_traceback(tmp_path: Path) -> None:
    import httpx
    from mcp import ClientSession
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
            client = httpx.AsyncClient(headers={"Authorization": f"Bearer {WEB_TOKEN}"})
            async with client, streamable_http_client(url, http_client=client) as (read, write, _), \
                    ClientSession(read, write) as session:
                await session.initialize()
                assert (await session.list_tools()).tools
        await asyncio.sleep(1.0)  # what the server logs about a client that left, it logs by now
    finally:
        process.terminate()
        _, err = await asyncio.wait_for(process.communicate(), 60)
    stderr = err.decode()
    assert "Traceback" not in stderr and "ClosedResourceError" not in stderr, stderr


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
