"""``max_tokens``: a per-run token budget across all model turns (issue 24, item 9). Scripted model:
its usage is one input token a message and one output token a call or text."""

from __future__ import annotations

import pytest

from nexo_django import Agent
from nexo_django.core.agent import tokens_spent
from nexo_django.core.errors import MaxTurnsExceeded, TokenBudgetExceeded
from nexo_django.testing import ScriptedModel, reply, tool_call


def _globber(budget: int | None) -> type[Agent]:
    class Globber(Agent):
        model = ScriptedModel([tool_call("glob", pattern="*")] * 5 + [reply("Listed.")])
        sandbox = "virtual"
        max_tokens = budget

    return Globber


def test_a_run_stops_with_a_clear_error_once_its_tokens_are_spent_scripted() -> None:
    agent = _globber(10)()
    with pytest.raises(TokenBudgetExceeded, match=r"spent \d+ of its 10 tokens \(max_tokens\)") as info:
        agent.prompt("list the files")
    assert isinstance(info.value, MaxTurnsExceeded)  # one of the run's own limits
    asked = agent.llm.requests  # type: ignore[attr-defined]
    spent = tokens_spent(asked[-1]["messages"])
    assert spent < 10  # the last request was made under the budget; none after it


def test_without_a_budget_or_within_it_the_run_finishes_scripted() -> None:
    assert _globber(None)().prompt("list").content == "Listed."
    assert _globber(1000)().prompt("list").content == "Listed."


def test_tokens_spent_counts_input_and_output_of_each_reply() -> None:
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "usage": {"input_tokens": 3, "output_tokens": 2, "cached": 9}},
        {"role": "assistant", "content": "y", "usage": {"input_tokens": 5, "output_tokens": 1}},
    ]
    assert tokens_spent(messages) == 11
