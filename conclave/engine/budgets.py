"""Output budgets per kind of call: the ``max_tokens`` each request carries, and what the cost estimate assumes.

Using the cap as the expected output makes the estimate an upper bound for every planned call (re-asks,
retries, hedges and a judge fallback come on top), so the in-flight abort at ``cost.abort_ratio`` × estimate
fires on runaway spending, not on an ordinary long answer. Judges get more room: their artifacts summarise the
whole panel.
"""

from __future__ import annotations

MAX_OUTPUT_TOKENS = {
    "independent": 2048,
    "synthesis": 4096,
    "cross_exam_reply": 2048,
    "cross_exam": 4096,
    "verdict": 4096,
}

#: tokens a chat API adds around the system and user messages of one call (role markers, separators)
MESSAGE_OVERHEAD_TOKENS = 16
