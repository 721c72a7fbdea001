"""A durable run with ``max_tokens`` fails with a clear error once it spent them (issue 24,
item 9), its budget counted over the turns of every worker that drove it. Scripted model."""

from __future__ import annotations

import pytest

from nexo_django import Agent
from nexo_django.models import RunStatus
from nexo_django.testing import ScriptedModel, reply, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


class Spender(Agent):
    """Scripted: lists files turn after turn, under a budget it runs out of."""

    model = ScriptedModel([tool_call("glob", pattern="*")] * 6 + [reply("Listed.")])
    sandbox = "virtual"
    max_tokens = 12


def test_a_durable_run_stops_when_its_budget_is_spent_scripted() -> None:
    run = Spender.run("list the files")
    assert run.status == RunStatus.FAILED
    assert "TokenBudgetExceeded" in run.error and "of its 12 tokens (max_tokens)" in run.error
    assert run.usage["input_tokens"] + run.usage["output_tokens"] >= 12
