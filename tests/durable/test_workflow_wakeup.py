"""The wake-up race of a workflow (scripted, inline queue): an answer that arrives while a pass of
its run is going — after the pass read the recorded steps (the question still waiting in what it
read), before it reaches the question — finds the run running, so its own wake-up queues nothing.
The pass must not take its stale view for the truth: once its suspension is committed it looks
again, and the run continues with the answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nexo_django.durable import parents, workflow_runs
from nexo_django.durable.workflow_runs import WorkflowRun
from nexo_django.models import AgentRun, RunStatus, StepStatus, WorkflowStep
from tests.admin.support import make_user
from tests.durable_agents import count
from tests.workflows_for_tests import Ask

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def test_an_answer_during_a_pass_that_read_the_question_waiting_is_not_lost(
        counter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run = Ask.run({})
    assert run.status == RunStatus.SUSPENDED and count(counter) == ["collect"]
    original = workflow_runs.Pass.__init__
    answered: list[bool] = []

    def read_then_an_answer_lands(self: Any, run: AgentRun, *args: Any, **kwargs: Any) -> None:
        original(self, run, *args, **kwargs)
        if not answered:  # the pass holds the recorded steps: the question is waiting in them
            assert [s.status for s in self.recorded] == [StepStatus.DONE, StepStatus.WAITING]
            assert AgentRun.objects.get(pk=run.pk).status == RunStatus.RUNNING
            WorkflowRun.get(run.pk).answer("channel", "mail", by=boss)  # its wake-up finds the run running
            answered.append(True)

    monkeypatch.setattr(workflow_runs.Pass, "__init__", read_then_an_answer_lands)
    # A pass while the question waits (a reconciler's wake-up, a worker's retry): inline, it runs now.
    assert parents.wake(run.pk)
    assert answered == [True]
    run = WorkflowRun.get(run.pk)
    assert run.status == RunStatus.DONE and run.result == {"published_to": "mail"}
    assert count(counter) == ["collect", "publish:mail"]  # each step's function once
    assert WorkflowStep.objects.get(run_id=run.pk, name="channel").result == "mail"  # answered once, kept
