"""Workflows in process: steps recorded once, agents and questions inside, versioning, answers
(once, validated, by someone allowed), cancel, expiry, the reconciler's backstop. Inline queue;
the agents inside use scripted models. Cross-process behaviour: test_workflow_workers.py."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from django.db import close_old_connections
from django.utils import timezone

from nexo_django import Workflow
from nexo_django.durable.recovery import reconcile
from nexo_django.durable.workflow_questions import open_questions
from nexo_django.durable.workflow_runs import WorkflowRun
from nexo_django.errors import AlreadyDecided, InvalidAnswer, WorkflowError
from nexo_django.models import AgentRun, CallStatus, RunStatus, StepStatus, WorkflowStep
from tests.admin.support import make_user
from tests.durable_agents import count
from tests.workflows_for_tests import EVOLVING, Ask, Evolving, Failing, Release, Twice

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

DECIDE = "nexo_django.decide_toolcall"


@pytest.fixture
def boss() -> Any:
    return make_user("boss", DECIDE)


def test_release_runs_each_step_once_across_suspensions_and_finishes_scripted(counter: Path, boss: Any) -> None:
    run = Release.run({"version": "1.2"})
    assert run.status == RunStatus.SUSPENDED  # the agent inside waits for its write's approval
    [call] = run.pending_calls()
    assert (call.name, call.args["path"]) == ("write", "notes.md")
    call.approve(by=boss)  # the agent finishes; its end wakes the workflow, which asks
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED and run.pending_calls().count() == 0
    [question] = run.questions()
    assert (question.key, question.question) == ("channel", "Where should this go?")
    run.answer("channel", "blog", by=boss)
    run.refresh_from_db()
    assert (run.status, run.error) == (RunStatus.DONE, "")
    assert run.result == {"published_to": "blog", "files": ["notes.md"]}  # the agent wrote in the workflow's files
    # Four passes, and each step's function ran once.
    assert count(counter) == ["collect", "publish:blog"]
    steps = [(s.seq, s.name, s.kind, s.status) for s in run.steps()]
    assert steps == [(0, "collect", "checkpoint", "done"), (1, "Drafter", "agent", "done"),
                     (2, "channel", "question", "answered"), (3, "publish", "checkpoint", "done"),
                     (4, "files", "checkpoint", "done")]
    agent_step = run.steps().get(name="Drafter")
    assert agent_step.result == "Drafted." and agent_step.child_run.parent_id == run.pk
    assert run.steps().get(name="channel").answered_by == boss


def test_run_later_returns_a_workflow_run_kept_current_with_an_inline_queue(counter: Path) -> None:
    run = Ask.run_later({"version": "2.0"})
    assert isinstance(run, WorkflowRun) and run.status == RunStatus.SUSPENDED
    assert AgentRun.objects.get(pk=run.pk).kind == "workflow"
    assert [q.pk for q in open_questions()] == [q.pk for q in run.questions()]


def test_a_step_name_twice_in_one_pass_is_a_clear_error(counter: Path) -> None:
    run = Twice.run()
    assert run.status == RunStatus.FAILED
    assert "'same' was reached twice in one pass" in run.error
    assert count(counter) == ["collect"]


def test_a_workflow_changed_while_it_waited_is_refused_on_resume(counter: Path, boss: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    run = Evolving.run()
    assert run.status == RunStatus.SUSPENDED
    monkeypatch.setitem(EVOLVING, "first", "gather")  # a deploy renamed the first step
    run.answer("ok", True, by=boss)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.error.startswith("WorkflowChanged: tests.workflows_for_tests.Evolving changed while run")
    assert "step 1 is now the checkpoint 'gather', but the checkpoint 'collect' was recorded there" in run.error
    assert count(counter) == ["collect"]  # the stored result was not fed to 'gather', nor 'gather' run


def test_an_answer_outside_the_schema_is_refused_with_the_reason_and_nothing_recorded(counter: Path, boss: Any) -> None:
    run = Ask.run({})
    with pytest.raises(InvalidAnswer, match="the answer to 'channel' was refused: 'tv' is not one of"):
        run.answer("channel", "tv", by=boss)
    step = WorkflowStep.objects.get(run_id=run.pk, name="channel")
    assert (step.status, step.result, step.answered_by) == (StepStatus.WAITING, None, None)
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    run.answer("channel", "mail", by=boss)
    run.refresh_from_db()
    assert run.result == {"published_to": "mail"}


def test_two_answers_at_once_record_one_and_tell_the_other_who_answered(counter: Path) -> None:
    run = Ask.run({})
    people = [make_user("ann", DECIDE), make_user("bob", DECIDE)]
    start = threading.Barrier(2)
    outcomes: dict[str, Any] = {}

    def answer(person: Any, value: str) -> None:
        try:
            start.wait()
            run.answer("channel", value, by=person)
            outcomes[person.username] = "recorded"
        except AlreadyDecided as exc:
            outcomes[person.username] = exc
        finally:
            close_old_connections()

    threads = [threading.Thread(target=answer, args=(p, v)) for p, v in zip(people, ["blog", "mail"], strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(type(v).__name__ if not isinstance(v, str) else v for v in outcomes.values()) == \
        ["AlreadyDecided", "recorded"]
    [winner] = [name for name, v in outcomes.items() if v == "recorded"]
    [refused] = [v for v in outcomes.values() if v != "recorded"]
    assert f"already answered by {winner}" in str(refused)
    step = WorkflowStep.objects.get(run_id=run.pk, name="channel")
    assert step.answered_by.username == winner
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert run.result == {"published_to": step.result}
    assert len([c for c in count(counter) if c.startswith("publish")]) == 1


def test_answering_needs_the_decide_permission_and_four_eyes(counter: Path, settings: Any) -> None:
    settings.NEXO = {"SELF_APPROVAL": False}
    starter = make_user("sam", DECIDE)
    run = Ask.run({}, user=starter)
    with pytest.raises(PermissionDenied, match="decide_toolcall"):
        run.answer("channel", "blog", by=make_user("nobody"))
    with pytest.raises(PermissionDenied, match="started this workflow and cannot answer"):
        run.answer("channel", "blog", by=starter)
    with pytest.raises(WorkflowError, match="has asked no question 'nope'"):
        run.answer("nope", "blog", by=make_user("olga", DECIDE))
    assert WorkflowStep.objects.get(run_id=run.pk, name="channel").status == StepStatus.WAITING


def test_a_question_past_its_deadline_ends_as_no_answer(counter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Ask, "approval_timeout", 60, raising=False)
    run = Ask.run({})
    step = WorkflowStep.objects.get(run_id=run.pk, name="channel")
    assert step.expires_at is not None
    report = reconcile(now=timezone.now() + timedelta(seconds=61))
    assert report.expired == [str(run.pk)]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.error.startswith("NoAnswer: question 'channel' ended at") and "without an answer" in run.error
    assert WorkflowStep.objects.get(pk=step.pk).status == StepStatus.EXPIRED
    assert count(counter) == ["collect"]


def test_cancel_stops_the_agents_inside_and_ends_the_questions_scripted(counter: Path, boss: Any) -> None:
    run = Release.run({"version": "1"})
    [call] = run.pending_calls()
    assert run.cancel(by=boss) is True
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    child = AgentRun.objects.get(parent_id=run.pk)
    call.refresh_from_db()
    assert (child.status, call.status) == (RunStatus.CANCELLED, CallStatus.EXPIRED)


def test_an_agent_stopped_by_its_approver_fails_the_workflow_with_why_scripted(counter: Path, boss: Any) -> None:
    run = Release.run({"version": "1"})
    [call] = run.pending_calls()
    call.deny(by=boss, note="not now", stop=True)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.error.startswith("StepFailed: agent step 'Drafter': Drafter run") and "cancelled" in run.error


def test_a_failing_workflow_keeps_its_recorded_steps_and_retry_does_not_redo_them(counter: Path, boss: Any) -> None:
    run = Failing.run()
    assert (run.status, run.error) == (RunStatus.FAILED, "ValueError: no release today")
    assert run.agent_run.retry(by=boss) is True
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert count(counter) == ["collect"]  # the retried pass got the step's result from storage


def test_the_reconciler_wakes_a_workflow_whose_wake_up_was_lost(counter: Path, boss: Any) -> None:
    run = Ask.run({})
    run.answer("channel", "blog", by=boss)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    # As if the process died between the answer's commit and the wake-up: answered, still suspended.
    other = Ask.run({})
    WorkflowStep.objects.filter(run_id=other.pk, name="channel").update(status=StepStatus.ANSWERED, result="mail")
    assert str(other.pk) in reconcile().requeued
    other.refresh_from_db()
    assert other.result == {"published_to": "mail"}


def test_steps_need_a_durable_run() -> None:
    class Loose(Workflow):
        def call(self, payload: Any) -> Any:
            return self.checkpoint("a", str, 1)

    with pytest.raises(WorkflowError, match=r"Loose.checkpoint\(\) runs inside a durable run"):
        Loose().call(None)


def test_an_answer_that_lands_while_the_pass_suspends_is_not_lost(counter: Path, boss: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The answer commits after the pass found the question waiting and before its suspension
    # commits: its wake-up finds the run still running and queues nothing. The pass looks again
    # once suspended, and queues the run itself.
    from nexo_django.durable import workflow_runs

    original = workflow_runs._close
    woke: list[bool] = []

    def close_after_an_answer(run: AgentRun, token: str, new: str, *args: Any, **kwargs: Any) -> bool:
        if new == RunStatus.SUSPENDED and not woke:
            assert AgentRun.objects.get(pk=run.pk).status == RunStatus.RUNNING
            step = WorkflowStep.objects.get(run_id=run.pk, name="channel")
            woke.append(workflow_runs.parents.wake(run.pk))  # what the answer's own wake-up finds
            workflow_runs.answer(AgentRun.objects.get(pk=run.pk), step.name, "blog", by=boss)
        return original(run, token, new, *args, **kwargs)

    monkeypatch.setattr(workflow_runs, "_close", close_after_an_answer)
    run = Ask.run({})
    assert woke == [False]  # the run was running: the answer's wake-up queued nothing
    run = WorkflowRun.get(run.pk)
    assert run.status == RunStatus.DONE and run.result == {"published_to": "blog"}
