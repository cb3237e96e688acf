"""A real OpenAI-compatible server vs the in-process local provider: the same 2-round consultation, and first-try
validity of the full schema vs OpenAI's strict variant.

Starts ``python -m llama_cpp.server`` with the packaged Gemma 3 270M on 127.0.0.1 and runs one 2-round consultation
through ``agents=openai_only providers.openai.base_url=…`` (structured output negotiated from scratch, one slot),
then the same panel (three agents and the judge, same personas) on the in-process ``local`` provider, and reports
the wall-time ratio (goal: server ≤ 1.5× local). Then it sends ``--tries`` round-1 requests to the server as
``json_object`` with the full artifact schema as conclave sends it to a grammar server (bounded numbers as values,
array and string lengths fitted to the round's budget) and as many with the strict variant (constraints only in
descriptions), and counts the answers that validate on the first try (no repair, no re-ask).

    python bench/openai_compatible.py [--tries 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

GOAL = 1.5
QUESTION = "Should a three-person team store a small internal tool's data in SQLite or in Postgres?"
LOCAL_PANEL = [f"{seat}.{key}={value}" for seat in ("agents.security", "agents.architect", "agents.pragmatist",
                                                    "judge")
               for key, value in (("provider", "local"), ("model", "gemma-3-270m"))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(model: Path, threads: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host",
                                   "127.0.0.1", "--port", str(port), "--n_ctx", "8192", "--n_threads", str(threads),
                                   "--seed", "1"],
                                  stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/models", timeout=2):
                return server, url
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise SystemExit(f"llama_cpp.server did not start; see {log}")


def consult(home: Path, overrides: list[str]) -> tuple[float, dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(home), CONCLAVE_PROGRESS="0")
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "conclave", QUESTION, "rounds=2", "cost.auto_approve=true",
                           "output.format=json", *overrides], capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"consultation failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed, json.loads(proc.stdout)


def round1_request(strict: bool) -> dict[str, Any]:
    from conclave_plugins.openai import strict_variant

    from conclave.engine.extraction import json_instruction, request_schema
    from conclave.engine.rounds import INDEPENDENT
    from conclave.providers.schema_hints import (
        anchored_patterns_only,
        bounded_lengths,
        bounded_numbers_as_choices,
        describe_constraints,
    )

    sys.path.insert(0, str(Path(__file__).parent))
    from local import round1_messages  # the real round-1 prompt, shared with bench/local.py

    schema = request_schema("independent")
    # what conclave sends a grammar server (the full schema: unanchored patterns only described, bounded numbers as
    # values, lengths fitted to the round's max_tokens), or OpenAI's strict variant (constraints in descriptions)
    budget = INDEPENDENT.max_tokens
    sent = (strict_variant(describe_constraints(schema)) if strict else
            bounded_lengths(bounded_numbers_as_choices(anchored_patterns_only(schema)), max_tokens=budget))
    messages = round1_messages()
    messages[-1]["content"] += "\n\n" + json_instruction("independent", True)
    return {"model": "gpt-4o", "messages": messages, "max_tokens": budget,
            "response_format": {"type": "json_object", "schema": sent}}


async def first_try_valid(url: str, tries: int, strict: bool) -> int:
    import aiohttp

    from conclave.engine.extraction import extract, header_for

    valid = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as http:
        for _ in range(tries):
            async with http.post(url + "/chat/completions", json=round1_request(strict)) as resp:
                answer = await resp.json()
            text = answer["choices"][0]["message"]["content"] or ""
            result = extract(text, None, "independent", header_for("independent", 1, "security"))
            valid += result.ok and result.status == "valid"
    return valid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=3, help="round-1 requests per schema variant")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads, server and local alike")
    args = parser.parse_args()
    from conclave_plugins.local.model import PackagedModel, ensure_assembled

    work = Path(tempfile.mkdtemp(prefix="conclave-bench-oai-"))
    model = ensure_assembled(PackagedModel.from_package(), Path(tempfile.gettempdir()) / "conclave-bench-home" /
                             "models")
    os.environ["CONCLAVE_LOCAL_THREADS"] = str(args.threads)  # the same thread count on both sides
    server, url = start_server(model, args.threads, work / "server.log")
    # figures are printed as they are measured: the strict-variant tries can each run to the token cap
    print(__doc__.splitlines()[0], flush=True)
    print(f"{'run':<44}{'wall s':>9}{'status':>12}", flush=True)
    try:
        (work / "server-home").mkdir()
        server_s, server_result = consult(work / "server-home", [
            "agents=openai_only", f"providers.openai.base_url={url}", "providers.openai.grammar_lengths=fit",
            "providers.openai.timeout_s=1800"])
        print(f"{'llama_cpp.server, openai provider (1 slot)':<44}{server_s:>9.1f}{server_result['status']:>12}",
              flush=True)
        (work / "local-home").mkdir()  # the server idles meanwhile
        os.symlink(model.parent, work / "local-home" / "models")
        local_s, local_result = consult(work / "local-home", ["agents=openai_only", *LOCAL_PANEL,
                                                              "providers.local.timeout_s=1800"])
        print(f"{'in-process local provider':<44}{local_s:>9.1f}{local_result['status']:>12}", flush=True)
        ratio = server_s / local_s
        print(f"server / local wall time: {ratio:.2f}x (goal <= {GOAL}x: {'met' if ratio <= GOAL else 'NOT met'})",
              flush=True)
        for strict, label in ((False, "full schema (grammar variant)"), (True, "strict variant")):
            started = time.perf_counter()
            valid = asyncio.run(first_try_valid(url, args.tries, strict=strict))
            print(f"round-1 artifacts valid on the first try, json_object + {label}: {valid}/{args.tries} "
                  f"({(time.perf_counter() - started) / args.tries:.0f} s per answer)", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)

if __name__ == "__main__":
    main()
