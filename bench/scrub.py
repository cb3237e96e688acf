"""Benchmark: the scrubber's throughput on ordinary and adversarial text, how it scales, and its recall/false positives.

Measures the user's path in this process: each input is a context file, read, scrubbed and made ready to send by
``conclave.engine.inputs.prepare_inputs`` exactly as a consultation does (with three provider keys set, whose
values are scrubbed too). Per input: MB/s of CPU time (best of ``--repeat`` runs; CPU time rather than wall time,
so other processes on a shared machine disturb the figures less), the same as a multiple of the goal, and the
time ratio of the input at twice the size (linear work gives ~2.0, quadratic ~4.0), all measured in this run.
Then, on the corpus of documented secret formats and look-alikes (``conclave.testing.secret_corpus``), the share
of secrets removed (recall) and the share of look-alikes changed (false positives). Goals: >= 20 MB/s on
adversarial input, recall >= 95%, false positives <= 2%.

Adversarial inputs repeat what the rules look for without completing a secret (unterminated private-key blocks,
prefixes, separators, secret words, flags), the inputs that made earlier versions backtrack, or are dense with
real secrets, repeated or each one different (a dump of credentials).

    python bench/scrub.py [--mb 2] [--repeat 3]   (--mb at most 2: a larger context file is cut to 2 MiB)
"""

from __future__ import annotations

import argparse
import os
import random
import string
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def _distinct(template: str, length: int = 12) -> Callable[[int], str]:
    """``template`` repeated with a different random secret of ``length`` characters in each copy (at ``{}``)."""
    def make(size: int) -> str:
        rng, alphabet = random.Random(11), string.ascii_letters + string.digits
        copies: list[str] = []
        length_so_far = 0
        while length_so_far < size:
            copies.append(template.format("".join(rng.choice(alphabet) for _ in range(length))))
            length_so_far += len(copies[-1])
        return "".join(copies)
    return make


DISTINCT: dict[str, Callable[[int], str]] = {
    "u:<pw>@tcp( (each one different)": _distinct("u:{}@tcp(h)/d "),
    "x://a:<pw>@h (each different)": _distinct("x://a:{}@h "),
    "curl -u a:<pw> (each different)": _distinct("curl -u a:{} "),
    "sshpass -p <pw> (each different)": _distinct("sshpass -p {} "),
    "ghp_<token> (each different)": _distinct("ghp_{} ", 36),
    "Bearer <token> (each different)": _distinct("Bearer {} ", 24),
    "password=<pw> lines (each diff.)": _distinct("password={}\n"),
}

# provider keys set in the environment the consultation sees: their values are scrubbed from the context too
_ENVIRON = {"OPENAI_API_KEY": "sk-proj-" + "Zx8Cv7Bn6Mq5Wl4Ek3Rt2Yu1Io0Pa9Sd",
            "ANTHROPIC_API_KEY": "sk-ant-api03-" + "Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz9Xc",
            "MISTRAL_API_KEY": "Lk9Jh8Gf7Ds6Ap5Ow4Ie3Ur2Yt1Re0Wq"}


class _UserPath:
    """A consultation's settings with one context file, whose content each measurement replaces."""

    def __init__(self, home: Path) -> None:
        os.environ["CONCLAVE_HOME"] = str(home)
        from conclave.api import compose_settings
        from conclave.engine.interaction import Interaction

        self.path = home / "context.txt"
        self.path.write_text("")
        self.settings: Any = compose_settings("Is it safe to share this log?", [f"context=[{self.path}]"])
        self.interaction = Interaction.non_interactive()

    def seconds(self, text: str, repeat: int) -> float:
        from conclave.engine.inputs import prepare_inputs

        self.path.write_text(text, encoding="utf-8")
        best = float("inf")
        for _ in range(repeat):
            started = time.process_time()
            prepare_inputs(self.settings, self.interaction, environ=_ENVIRON)
            best = min(best, time.process_time() - started)
        return best


def _row(user: _UserPath, name: str, make: Callable[[int], str], size: int, repeat: int) -> tuple[float, float]:
    small, large = make(size // 2)[: size // 2], make(size)[:size]
    t_small, t_large = user.seconds(small, repeat), user.seconds(large, repeat)
    mbps = len(large.encode()) / 1e6 / t_large
    ratio = t_large / t_small if t_small > 0 else float("nan")
    print(f"| {name:<34} | {mbps:9.2f} | {mbps / GOAL_MBPS:6.2f} | {ratio:10.2f} |")
    return mbps, ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=2.0, help="size of each input in MB (default 2)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per input; the best is kept (default 3)")
    args = parser.parse_args()
    size = int(min(args.mb, 2.0) * 1_000_000)

    print("Scrubbing a context file on the user's path (prepare_inputs): MB/s at full size, that / the goal, and\n"
          "scaling (time at full size / time at half size), all measured in this run.")
    # CPU time is what is measured, but other processes still compete for the caches and cores
    print("machine load (1, 5, 15 min): " + ", ".join(f"{load:.2f}" for load in os.getloadavg()) + "\n")
    print(f"| {'input':<34} | {'MB/s':>9} | {'x goal':>6} | {'2x / 1x':>10} |")
    print(f"|{'-' * 36}|{'-' * 11}|{'-' * 8}|{'-' * 12}|")
    worst, worst_ratio, worst_distinct = float("inf"), 0.0, float("inf")
    with tempfile.TemporaryDirectory() as home:
        user = _UserPath(Path(home))
        normal, _ = _row(user, "ordinary text with some secrets", _normal, size, args.repeat)
        for name, make in ADVERSARIAL.items():
            mbps, ratio = _row(user, name, make, size, args.repeat)
            worst, worst_ratio = min(worst, mbps), max(worst_ratio, ratio)
        for name, make in DISTINCT.items():
            mbps, ratio = _row(user, name, make, size, args.repeat)
            worst_distinct, worst_ratio = min(worst_distinct, mbps), max(worst_ratio, ratio)

    missed = [p for p in POSITIVES if any(secret in scrub(p.text)[0] for secret in p.secrets)]
    changed = [n for n in NEGATIVES if scrub(n.text)[0] != n.text]
    recall = 1 - len(missed) / len(POSITIVES)
    fp = len(changed) / len(NEGATIVES)

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    print()
    print(f"ordinary text:           {normal:8.1f} MB/s")
    print(f"adversarial, slowest:    {worst:8.1f} MB/s   goal >= {GOAL_MBPS:.0f} MB/s: {verdict(worst >= GOAL_MBPS)}")
    print(f"distinct secrets, slowest:{worst_distinct:7.1f} MB/s   goal >= {GOAL_MBPS:.0f} MB/s: "
          f"{verdict(worst_distinct >= GOAL_MBPS)}")
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
