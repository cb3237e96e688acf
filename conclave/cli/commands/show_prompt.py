"""``conclave show-prompt ROUND ["question"] [overrides] [--from ID] [--agent NAME] [--json]``: the exact system
and user messages a round would send, without calling any provider.

ROUND is a round type's name (``independent``, ``synthesis``, ``cross_exam_replies``, ``cross_exam``, ``verdict``,
or a strategy's own) or a round number of the plan. The question and overrides compose the configuration as for
a consultation. The inputs that earlier rounds would produce are shown as ``<placeholder: what goes here>``; with
``--from ID`` they are taken from that past consultation's journal (its configuration too), so the messages are
exactly what was — or, for a round not yet played, would be — sent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

from conclave.api import compose_settings
from conclave.cli.commands.arguments import CommandParser
from conclave.cli.main import _is_override
from conclave.cli.task import name_user_settings
from conclave.config.home import default_home
from conclave.engine.extraction import json_instruction
from conclave.engine.inputs import prepare_inputs
from conclave.engine.interaction import Interaction
from conclave.engine.labels import JudgeLabels
from conclave.engine.play import call_spec, own_inputs, participants, shared_inputs
from conclave.engine.restore import restore_rounds
from conclave.engine.rounds import Plan, RoundType
from conclave.engine.session import Session, prompt_json
from conclave.engine.session_layers import with_layers
from conclave.errors import ConfigError, UsageError
from conclave.events import EventBus
from conclave.plugin_manager import get_plugins
from conclave.quality.objection import OBJECTION, objection_round
from conclave.store.paths import StoreLayout
from conclave.store.resume_points import load_resume_point


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave show-prompt", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("round", help="round type name or round number")
    parser.add_argument("rest", nargs="*", help='the question (first non-override) and Hydra overrides')
    parser.add_argument("--from", dest="source", metavar="ID", help="take config and inputs from this consultation")
    parser.add_argument("--agent", help="on the agents' seat: only this agent's call")
    parser.add_argument("--json", action="store_true", help="print the calls as JSON")
    args = parser.parse_args(argv)
    calls = render(args.round, args.rest, source=args.source, agent=args.agent)
    if args.json:
        print(json.dumps(calls, ensure_ascii=False, indent=2))
        return 0
    for call in calls:
        print(f"# {call['round_type']} · round {call['round_number']} · {call['who']} "
              f"({call['provider']}/{call['model']})")
        print(f"# template {call['template']} · schema {call['schema']} · max_tokens {call['max_tokens']}")
        print("\n## system\n")
        print(call["system"])
        print("\n## user\n")
        print(call["user"])
        print()
    return 0


def render(round_name: str, rest: list[str], *, source: str | None = None, agent: str | None = None
           ) -> list[dict[str, Any]]:
    """The calls round ``round_name`` would make (one per agent on the agents' seat, one for the judge)."""
    plugins = get_plugins()
    resume_from: dict[str, Any] = {}
    if source is not None:
        if rest:
            raise UsageError("--from ID takes its question and config from that consultation; "
                             "drop the question and overrides")
        point = load_resume_point(StoreLayout(default_home()), source, resumable=False)
        settings, resume_from = point.settings, point.resume_from
        question = settings.question or ""
    else:
        words = [a for a in rest if not _is_override(a)]
        if len(words) > 1:
            raise UsageError(f"takes one question; quote it (got {len(words)} words: {words[0]!r}, …)")
        question = words[0] if words else "<the question>"
        overrides = [a for a in rest if _is_override(a)]
        try:
            settings = compose_settings(question, overrides, plugins)
        except ConfigError as exc:  # a bad value from the user's settings file says it comes from there
            raise ConfigError(name_user_settings(exc.problems, lambda: overrides)) from None
    question, context = _inputs(settings, question)
    strategy = plugins.strategies.get(settings.mode.strategy)(settings.mode.options)
    labels = JudgeLabels(settings.agents, int(resume_from.get("shuffle_seed") or 0), resume_from.get("labels"))
    session = with_layers(Session(settings=settings, plugins=plugins, strategy=strategy,
                                  pool=None,  # type: ignore[arg-type]
                                  bus=EventBus("show-prompt"), labels=labels, question=question,
                                  context_text=context))
    if source is not None:
        session.plan = Plan(strategy.plan)  # every round of the strategy, played or not (rounds=N cut it)
        session.quality.groupthink.replay_plan(session.plan, resume_from)  # objection rounds it played
    restored = restore_rounds(session, resume_from)
    steps = session.plan.steps()

    if round_name == OBJECTION.name and all(s.type.name != OBJECTION.name for s in steps):
        # never planned: shown where a groupthink firing after the first round puts it
        first = session.plan.types[0]
        session.plan.types.insert(1, objection_round(first.name, first.stage))
        steps = session.plan.steps()
    chosen = [s for s in steps if s.type.name == round_name or str(s.number) == round_name]
    if not chosen:
        names = ", ".join(dict.fromkeys(f"{s.type.name} ({s.number})" for s in steps))
        raise UsageError(f"no round {round_name!r} in the {settings.mode.strategy} plan; one of: {names}")
    chosen = chosen if round_name.isdigit() else chosen[:1]  # a number: every step of that round
    if agent is not None:
        if agent not in settings.agents:
            raise UsageError(f"--agent: {agent!r} is not on the panel; one of: {', '.join(settings.agents)}")
        if all(s.type.seat == "judge" for s in chosen):
            raise UsageError("--agent: this round is played by the judge")
        chosen = [s for s in chosen if s.type.seat == "agents"]  # round 3 --agent: its replies, not the judge step
    # the debate state as it stood when the round was sent: the rounds before it, and the steps of its own round
    # played before a judge step (the round-3 judge sees the replies' claims)
    session.quality.rebuild(session, {n for n in restored if n < chosen[0].number})
    calls = []
    for step in chosen:
        round_type = step.type
        for earlier in steps[:steps.index(step)]:
            if earlier.number == step.number and earlier.number in restored:
                session.quality.after_step(session, earlier)

        def shown(round_type: RoundType = round_type, number: int = step.number) -> dict[str, str]:
            """The values every call of the round gets, under the labels of whoever is asked (``seen_by``)."""
            values = {"question": question, "panel": session.labels.panel(), "absent": session.absent_notice(),
                      **session.quality.template_values(strategy.template(round_type.template).text)}
            for placeholder, spec in round_type.inputs.items():
                if spec.take == "own":
                    continue
                produced = (session.record.judged(spec.source) if spec.take == "judge"
                            else session.record.by_agent(spec.source))
                if produced:
                    values[placeholder] = shared_inputs(session, round_type, number)[placeholder]
                else:
                    values[placeholder] = _describe(placeholder, spec)
            return values

        who = [None] if round_type.seat == "judge" else (participants(session, round_type) or list(settings.agents))
        if agent is not None:
            who = [agent]
        for name in who:
            # an agent's prompt shows the panel under its own labels, as the engine sends it
            with session.seen_by(name) if name is not None else contextlib.nullcontext():
                values = shown()
                mine = dict(values)
                if name is not None:
                    mine.update(own_inputs(session, round_type, name, values))
                    for placeholder, spec in round_type.inputs.items():
                        if spec.take == "own" and mine.get(placeholder) == prompt_json(None):
                            mine[placeholder] = _describe(placeholder, spec)
                spec_ = call_spec(session, round_type, step.number, mine, name)
            instruction = json_instruction(spec_.schema_name, session.native(spec_.provider))
            calls.append({
                "round_type": round_type.name,
                "round_number": step.number,
                "who": name or "judge",
                "provider": spec_.provider,
                "model": spec_.model,
                "template": f"{strategy.prompt_package}/{strategy.prompt_dir}/{round_type.template}.md",
                "schema": round_type.schema,
                "max_tokens": round_type.max_tokens,
                "system": spec_.system,
                "user": f"{spec_.user.rstrip()}\n\n{instruction}",  # as the call sends it
            })
    return calls


def _describe(placeholder: str, spec: Any) -> str:
    what = {
        "own": f"this agent's own {spec.source} answer, in full",
        "each": f"every present agent's {spec.source} answer, a JSON list under neutral labels",
        "each_by_label": f"every present agent's {spec.source} answer, a JSON object keyed by label",
        "judge": f"the judge's {spec.source} artifact",
    }[spec.take]
    if spec.filtered:
        what += f", filtered with filtering.{spec.filtered}"
    return f"<{placeholder}: {what}>"


def _inputs(settings: Any, question: str) -> tuple[str, str]:
    """The question and context a consultation would send: scrubbed, context files and project summary loaded."""
    inputs = prepare_inputs(settings, Interaction.non_interactive(), None)
    return (inputs.question if settings.question else question), inputs.context
