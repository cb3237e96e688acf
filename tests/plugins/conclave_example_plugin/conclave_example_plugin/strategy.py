"""A devil's-advocate strategy: every agent must attack the most popular answer."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from conclave.engine.strategy import Strategy


class DevilsAdvocateOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ferocity: int = 1


class DevilsAdvocateStrategy(Strategy):
    name = "devil"
    prompt_package = "conclave_example_plugin"
    prompt_dir = "prompts"
    allows_early_termination = False
    all_rounds_notice = "Devil's advocate mode: every round runs"
    Options = DevilsAdvocateOptions
