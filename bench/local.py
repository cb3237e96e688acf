"""Local model decode speed: unconstrained vs grammar-constrained, on llama.cpp's engine (xllamacpp).

Same model, same round-1 prompt, same token budget (``--max-tokens``). Decode tokens/s excludes prompt evaluation.
A constrained answer ends when its JSON object closes, so each unconstrained run is held to the length of the
constrained run before it: decoding slows as the context grows, and longer runs would flatter the constrained
side. Goal: constrained >= 0.5x unconstrained.

    python bench/local.py [--runs 3] [--max-tokens 256] [--model-path FILE.gguf]
"""

from __future__ import annotations

import argparse
import json
import string
import sys
from importlib import resources
from pathlib import Path

GOAL = 0.5
SCHEMA = "independent"
QUESTION = "Should a small team store user passwords with bcrypt or with argon2?"


def round1_messages() -> list[dict[str, str]]:
    """The converge strategy's real round-1 prompt for the security persona."""

    def template(name: str) -> str:
        text = resources.files("conclave_plugins").joinpath(f"prompts/converge/{name}.md").read_text("utf-8")
        return text.split("---", 2)[2].strip()  # drop the version front matter

    system = string.Template(template("agent_system")).safe_substitute(
        persona_name="Security Expert", persona_focus="You judge every proposal by its attack surface.")
    user = string.Template(template("round1")).safe_substitute(question=QUESTION)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def model_file(model_path: str | None) -> Path:
    from conclave_plugins.local.model import resolve_model_path

    return resolve_model_path(model_path)  # the packaged model: the one shared copy every home uses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--model-path", default=None)
    args = parser.parse_args()

    from conclave_plugins.local import GenerationJob, LocalRuntime

    from conclave.artifacts import schema_registry as artifacts

    runtime = LocalRuntime(model_file(args.model_path))
    messages = round1_messages()
    schema = artifacts.get_schema(SCHEMA)
    rows: dict[str, tuple[int, float, str]] = {}

    def measure(label: str, grammar_schema: dict | None, budgets: list[int]) -> list[int]:
        tokens, seconds, lengths = 0, 0.0, []
        for budget in budgets:
            out = runtime.generate(GenerationJob(messages, grammar_schema, budget, temperature=0.7))
            tokens += out.output_tokens
            seconds += out.decode_s
            lengths.append(max(out.output_tokens, 1))
            if grammar_schema is not None:
                assert artifacts.validate(SCHEMA, json.loads(out.text)) == [], out.text
        rows[label] = (tokens, seconds, "")
        return lengths

    lengths = measure("constrained", schema, [args.max_tokens] * args.runs)
    measure("unconstrained", None, lengths)
    rows = {label: rows[label] for label in ("unconstrained", "constrained")}

    base = rows["unconstrained"][0] / rows["unconstrained"][1]
    print(f"model {runtime.path.name} · {runtime.threads} thread(s) · {args.runs} run(s) · schema {SCHEMA}")
    print(f"{'mode':<32} {'tokens':>7} {'decode s':>9} {'tok/s':>7} {'vs unconstrained':>17}  notes")
    for label, (tokens, seconds, note) in rows.items():
        rate = tokens / seconds if seconds else 0.0
        print(f"{label:<32} {tokens:>7} {seconds:>9.2f} {rate:>7.1f} {rate / base:>16.2f}x  {note}")
    ours = rows["constrained"]
    ratio = ours[0] / ours[1] / base
    print(f"constrained / unconstrained = {ratio:.2f} (goal >= {GOAL}): {'ok' if ratio >= GOAL else 'BELOW GOAL'}")
    sys.exit(0 if ratio >= GOAL else 1)


if __name__ == "__main__":
    main()
