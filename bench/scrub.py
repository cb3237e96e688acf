"""Benchmark: the scrubber's throughput on ordinary and adversarial text, how it scales, and its recall/false positives.

Measures ``conclave.scrub.scrub`` in this process: MB/s of CPU time on each input (best of ``--repeat`` runs; CPU
time rather than wall time, so other processes on a shared machine disturb the figures less), the time ratio
of the same input at twice the size (linear work gives ~2.0, quadratic ~4.0), and, on the corpus of documented
secret formats and look-alikes (``conclave.testing.secret_corpus``), the share of secrets removed (recall) and
the share of look-alikes changed (false positives). Goals: >= 20 MB/s on adversarial input, recall >= 95%, false
positives <= 2%.

Adversarial inputs repeat what the rules look for without completing a secret (unterminated private-key blocks,
prefixes, separators, secret words, flags), the inputs that made earlier versions backtrack.

    python bench/scrub.py [--mb 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import string
import time
from collections.abc import Callable

from conclave.scrub import scrub
from conclave.testing.secret_corpus import NEGATIVES, POSITIVES

GOAL_MBPS, GOAL_RECALL, GOAL_FP = 20.0, 0.95, 0.02


def _repeat(unit: str) -> Callable[[int], str]:
    return lambda size: unit * (size // len(unit) + 1)


def _normal(size: int) -> str:
    """Prose, code and config lines with a secret every ~50 lines, like a pasted project."""
    rng = random.Random(7)
    words = ["the", "billing", "service", "reduces", "query", "latency", "for", "our", "team", "and", "audit",
             "trail", "depends", "on", "read", "model", "while", "nightly", "batch", "job", "changes", "schema"]
    code = ["def handler(event, context):", "    return {'status': 200, 'body': json.dumps(result)}",
            "import os, sys, json", "for i in range(10):", "    total += price * quantity  # 12.5% tax",
            "SELECT id, name FROM customers WHERE created_at > '2024-01-01';", "timeout: 30s\nretries: 3",
            "https://example.com/docs/api?page=2", "commit 3f786850e387550fdab836ed7e6dc881de23001b",
            "max_tokens = 1000", "cache_key = user:123:profile"]
    lines, length = [], 0
    while length < size:
        pick = rng.random()
        if pick < 0.02:
            line = rng.choice(POSITIVES).text
        elif pick < 0.5:
            line = rng.choice(code)
        else:
            line = " ".join(rng.choice(words) for _ in range(rng.randint(6, 18))) + "."
        lines.append(line)
        length += len(line) + 1
    return "\n".join(lines)


def _base64_lines(size: int) -> str:
    rng = random.Random(3)
    alphabet = string.ascii_letters + string.digits + "+/"
    return "\n".join("".join(rng.choice(alphabet) for _ in range(64)) for _ in range(size // 65 + 1))


ADVERSARIAL: dict[str, Callable[[int], str]] = {
    "BEGIN PRIVATE KEY lines, no END": _repeat("-----BEGIN RSA PRIVATE KEY-----\n"),
    "one BEGIN, key lines, no END": lambda size: "-----BEGIN PRIVATE KEY-----\n" + _base64_lines(size),
    "BEGIN blocks, one END at the end": lambda size: _repeat("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n")(size)
    + "-----END PRIVATE KEY-----",
    "base64 lines": _base64_lines,
    "a.": _repeat("a."),
    "ab-": _repeat("ab-"),
    "sk-": _repeat("sk-"),
    "eyJ-": _repeat("eyJ-"),
    "eyJaaaaaaaa.": _repeat("eyJaaaaaaaa."),
    "x://": _repeat("x://"),
    "a:b@": _repeat("a:b@"),
    "u:p@tcp(": _repeat("u:p@tcp("),
    "password": _repeat("password"),
    "password: ": _repeat("password: "),
    "pass_": _repeat("pass_"),
    "a_key": _repeat("a_key"),
    "secret_key_base=": _repeat("secret_key_base="),
    "token=": _repeat("token="),
    "Bearer ": _repeat("Bearer "),
    "Authorization: Basic ": _repeat("Authorization: Basic "),
    "machine a login b ": _repeat("machine a login b "),
    '"auth": "': _repeat('"auth": "'),
    "curl -u a:": _repeat("curl -u a:"),
    "sshpass -p ": _repeat("sshpass -p "),
    "h:5432:d:u:": _repeat("h:5432:d:u:"),
    "Private-Lines: 1\\n": _repeat("Private-Lines: 1\n"),
    "hooks.slack.com/services/": _repeat("hooks.slack.com/services/"),
    "A" * 8: _repeat("A"),
    "SK0": _repeat("SK0"),
}


def _seconds(text: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        scrub(text)
        best = min(best, time.process_time() - started)
    return best


def _row(name: str, make: Callable[[int], str], size: int, repeat: int) -> tuple[float, float]:
    small, large = make(size // 2)[: size // 2], make(size)[:size]
    t_small, t_large = _seconds(small, repeat), _seconds(large, repeat)
    mbps = len(large.encode()) / 1e6 / t_large
    ratio = t_large / t_small if t_small > 0 else float("nan")
    print(f"| {name:<34} | {mbps:9.2f} | {ratio:10.2f} |")
    return mbps, ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=2.0, help="size of each input in MB (default 2)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per input; the best is kept (default 3)")
    args = parser.parse_args()
    size = int(args.mb * 1_000_000)

    print("Scrubber throughput (MB/s at full size) and scaling (time at full size / time at half size).\n")
    print(f"| {'input':<34} | {'MB/s':>9} | {'2x / 1x':>10} |")
    print(f"|{'-' * 36}|{'-' * 11}|{'-' * 12}|")
    normal, _ = _row("ordinary text with some secrets", _normal, size, args.repeat)
    worst, worst_ratio = float("inf"), 0.0
    for name, make in ADVERSARIAL.items():
        mbps, ratio = _row(name, make, size, args.repeat)
        worst, worst_ratio = min(worst, mbps), max(worst_ratio, ratio)

    missed = [p for p in POSITIVES if any(secret in scrub(p.text)[0] for secret in p.secrets)]
    changed = [n for n in NEGATIVES if scrub(n.text)[0] != n.text]
    recall = 1 - len(missed) / len(POSITIVES)
    fp = len(changed) / len(NEGATIVES)

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    print()
    print(f"ordinary text:           {normal:8.1f} MB/s")
    print(f"adversarial, slowest:    {worst:8.1f} MB/s   goal >= {GOAL_MBPS:.0f} MB/s: {verdict(worst >= GOAL_MBPS)}")
    print(f"adversarial, worst 2x/1x:{worst_ratio:8.2f}        (linear ~2, quadratic ~4)")
    print(f"recall:                  {recall:8.1%}        ({len(POSITIVES) - len(missed)}/{len(POSITIVES)} formats) "
          f"goal >= {GOAL_RECALL:.0%}: {verdict(recall >= GOAL_RECALL)}")
    print(f"false positives:         {fp:8.1%}        ({len(changed)}/{len(NEGATIVES)} look-alikes) "
          f"goal <= {GOAL_FP:.0%}: {verdict(fp <= GOAL_FP)}")
    for p in missed:
        print(f"  missed: {p.name}")
    for n in changed:
        print(f"  changed: {n.name}")


if __name__ == "__main__":
    main()
