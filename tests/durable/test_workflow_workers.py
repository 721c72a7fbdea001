"""Workflows across processes: real redis-server, real rqworker processes (one SIGKILLed right after
a step was recorded), the reconciler; the agents inside use scripted models. The step functions
count their calls in a file, so calls in any process are counted."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from nexo_django.durable.recovery import reconcile
from nexo_django.models import AgentRun, RunStatus, StepStatus, WorkflowStep
from tests.admin.support import make_user
from tests.durable_agents import count
from tests.servers import wait_until
from tests.workflows_for_tests import Release

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable, pytest.mark.redis]

WAIT = 60


def wait_status(run: Any, *statuses: str) -> AgentRun:
    return wait_until(lambda: AgentRun.objects.filter(pk=run.pk, status__in=statuses).first(), timeout=WAIT,
                      what=f"run {run.pk} to be {' or '.join(statuses)}")


def test_a_step_runs_once_across_a_killed_worker_an_agent_inside_and_a_question_scripted(
    rq_worker: Any, monkeypatch: pytest.MonkeyPatch, counter: Path, tmp_path: Path
) -> None:
    # The work horse is SIGKILLed right after the "collect" step's record committed, once.
    monkeypatch.setenv("NEXO_TEST_CRASH_AT", "workflow_step_recorded")
    monkeypatch.setenv("NEXO_TEST_CRASH_ONCE", str(tmp_path / "crashed-once"))
    rq_worker(1)
    run = Release.run_later({"version": "9"})
    wait_until(lambda: (tmp_path / "crashed-once").exists(), timeout=WAIT, what="the crash")
    wait_until(lambda: WorkflowStep.objects.filter(run_id=run.pk, name="collect").exists(), timeout=WAIT,
               what="the step's record")
    time.sleep(0.3)
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.RUNNING  # its worker is dead, its lease says running
    AgentRun.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert reconcile().requeued == [str(run.pk)]
    # The next pass took the stored result and started the agent, which waits for its write's
    # approval in the inbox: the workflow waits with it.
    wait_status(run, RunStatus.SUSPENDED)
    call = wait_until(lambda: run.pending_calls().first(), timeout=WAIT, what="the agent's call in the inbox")
    assert count(counter) == ["collect"]
    boss = make_user("boss", "nexo_django.decide_toolcall")
    call.approve(by=boss)  # the worker resumes the agent; its end wakes the workflow, which asks
    wait_until(lambda: WorkflowStep.objects.filter(run_id=run.pk, name="channel").exists(), timeout=WAIT,
               what="the question")
    wait_status(run, RunStatus.SUSPENDED)
    run.answer("channel", "mail", by=boss)
    done = wait_status(run, RunStatus.DONE, RunStatus.FAILED)
    run.refresh_from_db()
    assert (done.status, done.error, done.recoveries) == (RunStatus.DONE, "", 1)
    assert run.result == {"published_to": "mail", "files": ["notes.md"]}
    # Across the crash, the agent's suspension and the question, each step's function ran once.
    assert count(counter) == ["collect", "publish:mail"]
    assert WorkflowStep.objects.get(run_id=run.pk, name="Drafter").status == StepStatus.DONE
