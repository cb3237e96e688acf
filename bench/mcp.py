"""What the MCP door costs: a consultation through ``conclave mcp`` (stdio, official SDK client) vs the same through
the library API against the fake server at a fixed latency, and the round trip of a ``conclave_sessions`` call.

Both sides run the same 4-round consultation with the same overrides, alternating, against one fake server process
answering every call after L seconds; the MCP server is started once (warm, like an agent's long-lived server)
and its journal/index writes count on both sides. Goals: wall ratio MCP ÷ library ≤ 1.03, sessions p50 ≤ 20 ms
(timed over a bare JSON-RPC pipe; the official Python client's own figure, which adds its per-call meta-schema
check of the output schema, is shown beside it).

    python bench/mcp.py [--latency 0.2] [--runs 5] [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# This script is named like the SDK: keep its directory off the import path so `import mcp` finds the SDK.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("e2e_overhead", HERE / "e2e_overhead.py")
assert _spec is not None and _spec.loader is not None
e2e_overhead = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e_overhead)
QUESTION, fake_server_process = e2e_overhead.QUESTION, e2e_overhead.fake_server_process


async def library_run(overrides: list[str]) -> float:
    import conclave

    started = time.perf_counter()
    result = await conclave.consult_async(QUESTION, overrides)
    wall = time.perf_counter() - started
    assert result.status == "complete", result.abort_reason
    return wall


async def measure(latency: float, runs: int, calls: int) -> dict[str, list[float]]:
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    with fake_server_process(latency) as fake_overrides, tempfile.TemporaryDirectory() as home:
        os.environ["CONCLAVE_HOME"] = home
        os.environ["CONCLAVE_PROGRESS"] = "0"
        for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
            os.environ.setdefault(var, "bench-key")
        os.environ.pop("OPENAI_BASE_URL", None)
        common = ["cost.auto_approve=true", "judge.model=gpt-4.1"]
        params = StdioServerParameters(command=sys.executable, args=["-m", "conclave", "mcp", *fake_overrides],
                                       env=dict(os.environ), cwd=home)
        times: dict[str, list[float]] = {"library": [], "mcp": [], "sessions": [], "raw": []}
        # the server's stderr (warnings only) goes to ours
        async with Client(stdio_client(params, errlog=sys.stderr), mode="legacy") as session:
            await library_run([*fake_overrides, *common])  # warm-up: imports, tokenizer, schemas
            await session.call_tool("conclave_consult", {"question": QUESTION, "overrides": common})
            for _ in range(runs):
                times["library"].append(await library_run([*fake_overrides, *common]))
                started = time.perf_counter()
                result = await session.call_tool("conclave_consult", {"question": QUESTION, "overrides": common})
                times["mcp"].append(time.perf_counter() - started)
                assert not result.is_error and result.structured_content["status"] == "complete"
            for _ in range(calls):
                started = time.perf_counter()
                listed = await session.call_tool("conclave_sessions", {"limit": 10})
                times["sessions"].append(time.perf_counter() - started)
                assert not listed.is_error
        times["raw"] = await raw_round_trips(calls, home)
        return times


async def raw_round_trips(calls: int, home: str) -> list[float]:
    """``conclave_sessions`` round trips over a bare JSON-RPC stdio pipe: the server's own cost, without the SDK
    client (which re-checks the tool's output schema against the JSON Schema meta-schema on every call)."""
    import json

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", "mcp", cwd=home, env=dict(os.environ),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    async def request(id_: int, method: str, params: dict[str, object]) -> dict[str, object]:
        stdin.write(json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode() + b"\n")
        await stdin.drain()
        while True:
            message = json.loads(await stdout.readline())
            if message.get("id") == id_:
                return message

    await request(0, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "bench", "version": "0"}})
    stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
    times = []
    for i in range(1, calls + 1):
        started = time.perf_counter()
        answer = await request(i, "tools/call", {"name": "conclave_sessions", "arguments": {"limit": 10}})
        times.append(time.perf_counter() - started)
        assert "result" in answer and not answer["result"].get("isError"), answer  # type: ignore[union-attr]
    stdin.close()
    await process.wait()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    times = asyncio.run(measure(args.latency, args.runs, args.calls))
    library, mcp = statistics.median(times["library"]), statistics.median(times["mcp"])
    raw = sorted(times["raw"])
    p50, p95 = statistics.median(raw) * 1000, raw[int(0.95 * (len(raw) - 1))] * 1000
    sdk = statistics.median(times["sessions"]) * 1000
    print("MCP door overhead: a 4-round consultation via `conclave mcp` (stdio) vs the library API, fake latency "
          f"{args.latency:g} s; conclave_sessions round trip")
    print(f"{'measure':<34}{'value':>12}{'goal':>10}{'met':>6}")
    print(f"{'library wall (median of ' + str(args.runs) + ')':<34}{library:>11.3f}s{'':>10}")
    print(f"{'MCP wall (median of ' + str(args.runs) + ')':<34}{mcp:>11.3f}s{'':>10}")
    ratio = mcp / library
    print(f"{'ratio MCP ÷ library':<34}{ratio:>12.3f}{'≤ 1.03':>10}{'yes' if ratio <= 1.03 else 'no':>6}")
    print(f"{'conclave_sessions p50 (JSON-RPC)':<34}{p50:>10.2f}ms{'≤ 20 ms':>10}{'yes' if p50 <= 20 else 'no':>6}")
    print(f"{'conclave_sessions p95 (JSON-RPC)':<34}{p95:>10.2f}ms{'':>10}")
    print(f"{'conclave_sessions p50 (SDK client)':<34}{sdk:>10.2f}ms{'':>10}   (re-checks the output schema)")


if __name__ == "__main__":
    main()
