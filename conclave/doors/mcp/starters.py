"""MCP prompts: starters a user picks in their agent ("decide between options", "review this diff", "stress-test this
plan"). Each fills a consultation's question and mode and asks the agent to call ``conclave_consult`` with them;
nothing runs and nothing is spent until the agent makes that call."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field


@dataclass(frozen=True)
class Starter:
    """What one prompt fills: the consultation's question and mode."""

    question: str
    mode: str

    def arguments(self) -> dict[str, Any]:
        return {"question": self.question, "mode": self.mode}

    def message(self) -> str:
        """The user message the prompt puts in the agent's conversation."""
        return ("Put this to a panel of LLMs with the conclave_consult tool, with exactly these arguments "
                "(add context items for any files the panel should read):\n"
                + json.dumps(self.arguments(), indent=2, ensure_ascii=False))


def decide(options: str, goal: str | None = None) -> Starter:
    lines = [line.strip(" -*\t") for line in options.splitlines() if line.strip(" -*\t")]
    listed = "\n".join(f"- {line}" for line in lines) if len(lines) > 1 else options.strip()
    question = "Which of these options should we choose, and why?\n" + listed
    if goal:
        question += f"\nThe goal: {goal.strip()}"
    return Starter(question, "converge")


def review(diff: str, focus: str | None = None) -> Starter:
    question = ("Review this diff: is it correct, safe and ready to merge? Name every defect with the line it is on, "
                "and what to change.")
    if focus:
        question += f" Focus on: {focus.strip()}."
    return Starter(question + "\n\n```diff\n" + diff.strip("\n") + "\n```", "adversarial")


def stress_test(plan: str) -> Starter:
    question = ("Stress-test this plan: argue against it, find the assumptions that fail, the risks it ignores and "
                "what would make it fail; then say whether to go ahead.\n\n" + plan.strip())
    return Starter(question, "devils_advocate")


def register_prompts(server: Any) -> None:
    """Register the three prompts on ``server`` (an MCPServer)."""

    @server.prompt(name="decide_between_options", title="Decide between options",
                   description="A panel debate that picks one of your options (mode converge: one verdict).")
    def decide_between_options(
        options: Annotated[str, Field(description="The options, one per line.")],
        goal: Annotated[str | None, Field(description="What the choice should achieve.")] = None,
    ) -> str:
        return decide(options, goal).message()

    @server.prompt(name="review_this_diff", title="Review this diff",
                   description="A panel review of a diff (mode adversarial: the agents challenge each other).")
    def review_this_diff(
        diff: Annotated[str, Field(description="The unified diff to review.")],
        focus: Annotated[str | None, Field(description="What to look at most (e.g. security).")] = None,
    ) -> str:
        return review(diff, focus).message()

    @server.prompt(name="stress_test_this_plan", title="Stress-test this plan",
                   description="A panel that argues against your plan (mode devils_advocate).")
    def stress_test_this_plan(
        plan: Annotated[str, Field(description="The plan, as text.")],
    ) -> str:
        return stress_test(plan).message()
