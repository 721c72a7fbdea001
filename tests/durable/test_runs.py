"""Durable runs on the database with an inline queue (scripted models throughout)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from nexo_django import Agent
from nexo_django.core.errors import (
    AlreadyDecided,
    ConfigurationError,
    InvalidEditedArguments,
    StaleDecision,
    TransitionError,
)
from nexo_django.models import AgentRun, CallStatus, Decision, RunStatus, ToolCall, args_digest
from nexo_django.signals import approval_decided, approval_requested, run_status_changed
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.durable_agents import (
    Bumper,
    Looker,
    MixedTurn,
    ParallelScribe,
    Scribe,
    ThreeTurns,
    count,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


@pytest.fixture
def approver(db: None) -> object:
    return get_user_model().objects.create_user("ann", password="x", is_staff=True)


def test_scripted_run_suspends_on_gated_write_and_resumes_to_done(tmp_path: Path) -> None:
    run = Scribe.run("write hi", cwd=tmp_path)
    assert run.status == RunStatus.SUSPENDED
    assert not (tmp_path / "notes.txt").exists()
    [call] = run.pending_calls()
    assert (call.name, call.capability, call.args) == ("write", "write", {"path": "notes.txt", "content": "hi"})
    assert call.digest == args_digest(call.args)
    run.resume(approved=True)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert run.result == "Done."
    assert (tmp_path / "notes.txt").read_text() == "hi"


def test_scripted_resume_denied_finishes_done_without_the_file(tmp_path: Path) -> None:
    run = Scribe.run("write hi", cwd=tmp_path)
    run.resume(approved=False)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert not (tmp_path / "notes.txt").exists()
    tool_results = [m for m in run.transcript() if m["role"] == "tool"]
    assert "denied" in tool_results[0]["content"]["error"]


def test_scripted_denial_note_reaches_the_model(tmp_path: Path, approver: object) -> None:
    run = Scribe.run("write hi", cwd=tmp_path)
    run.pending_calls()[0].deny(by=approver, note="use drafts/ instead")
    run.refresh_from_db()
    result = [m for m in run.transcript() if m["role"] == "tool"][0]["content"]
    assert result == {"error": "write denied by the approver: use drafts/ instead"}
    assert run.status == RunStatus.DONE


def test_scripted_deny_and_stop_cancels_without_asking_the_model_again(tmp_path: Path) -> None:
    run = Scribe.run("write hi", cwd=tmp_path)
    assistant_turns = sum(1 for m in run.transcript() if m["role"] == "assistant")
    run.pending_calls()[0].deny(note="no", stop=True)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert sum(1 for m in run.transcript() if m["role"] == "assistant") == assistant_turns
    assert not (tmp_path / "notes.txt").exists()


def test_scripted_deny_and_stop_in_a_parallel_turn_stops_at_once_and_expires_the_rest(tmp_path: Path) -> None:
    run = ParallelScribe.run("two writes", cwd=tmp_path)
    first, second = run.pending_calls()
    first.approve()  # approved earlier: it must not run either
    second.deny(note="no", stop=True)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.error == "stopped by the approver"
    assert not (tmp_path / "a.txt").exists() and not (tmp_path / "b.txt").exists()
    statuses = {c.args["path"]: c.status for c in ToolCall.objects.filter(run=run, name="write")}
    assert statuses == {"a.txt": CallStatus.EXPIRED, "b.txt": CallStatus.DENIED}
    results = {m["tool_call_id"]: m["content"] for m in run.transcript() if m["role"] == "tool"}
    assert results[first.tool_call_id] == {"error": "write not run: the approver stopped the run"}


def test_scripted_a_call_expired_by_deny_and_stop_cannot_be_approved_later(tmp_path: Path) -> None:
    run = ParallelScribe.run("two writes", cwd=tmp_path)
    first, second = run.pending_calls()
    first.deny(stop=True)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED  # at once: the second call's decision is not awaited
    with pytest.raises(AlreadyDecided):
        ToolCall.objects.get(pk=second.pk).approve()
    assert ToolCall.objects.get(pk=second.pk).status == CallStatus.EXPIRED
    assert not (tmp_path / "a.txt").exists() and not (tmp_path / "b.txt").exists()


def test_scripted_nothing_that_ran_runs_again(counter: Path) -> None:
    model = ScriptedModel(
        [tool_call("bump", label="first"), tool_call("bump", label="second"), reply("ok")]
    )
    run = Bumper.run("bump twice", permissions="auto", model=model)
    assert run.status == RunStatus.DONE
    assert count(counter) == ["first", "second"]
    assert len(model.requests) == 3


def test_scripted_resume_runs_only_the_pending_call(counter: Path) -> None:
    run = MixedTurn.run("mixed")
    assert run.status == RunStatus.SUSPENDED
    assert count(counter) == []
    names = sorted(c.name for c in run.pending_calls())
    assert names == ["bump", "write"]
    glob_results = [m for m in run.transcript() if m["role"] == "tool"]
    assert [m["name"] for m in glob_results] == ["glob"]  # the ungated sibling ran and kept its result
    run.resume(approved=True)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert count(counter) == ["x"]
    assert [m["name"] for m in run.transcript() if m["role"] == "tool"] == ["glob", "bump", "write"]
    assert run.workspace["files"] == {"w.txt": "W"}


def test_scripted_each_call_decided_on_its_own(tmp_path: Path) -> None:
    run = ParallelScribe.run("two writes", cwd=tmp_path)
    first, second = run.pending_calls()
    first.approve()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED  # still waits for the second call
    second.deny(note="not b")
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert (tmp_path / "a.txt").read_text() == "A"
    assert not (tmp_path / "b.txt").exists()


def test_scripted_edited_arguments_run_instead(tmp_path: Path) -> None:
    run = Scribe.run("write hi", cwd=tmp_path)
    call = run.pending_calls()[0]
    decision = call.approve(args={"path": "drafts/notes.txt", "content": "edited"})
    assert decision.args == {"path": "drafts/notes.txt", "content": "edited"}
    assert decision.digest == args_digest(decision.args)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert (tmp_path / "drafts" / "notes.txt").read_text() == "edited"
    assert not (tmp_path / "notes.txt").exists()


@pytest.mark.parametrize(
    "args",
    [
        {"path": "x.txt"},  # missing content
        {"path": "x.txt", "content": 3},  # ill-typed
        {"path": "../outside.txt", "content": "x"},  # out of the sandbox
        {"path": ".git/config", "content": "x"},  # a protected name
    ],
)
def test_scripted_invalid_edited_arguments_are_refused_and_nothing_changes(tmp_path: Path, args: dict) -> None:
    run = Scribe.run("write hi", cwd=tmp_path)
    call = run.pending_calls()[0]
    with pytest.raises(InvalidEditedArguments):
        call.approve(args=args)
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL
    assert not Decision.objects.exists()
    assert not (tmp_path.parent / "outside.txt").exists()


def test_scripted_second_decision_is_refused(tmp_path: Path) -> None:
    run = Scribe.run("write hi", cwd=tmp_path)
    call = run.pending_calls()[0]
    call.approve()
    with pytest.raises(AlreadyDecided):
        ToolCall.objects.get(pk=call.pk).approve()
    with pytest.raises(AlreadyDecided):
        ToolCall.objects.get(pk=call.pk).deny()
    assert Decision.objects.count() == 1


def test_scripted_stale_digest_is_refused(tmp_path: Path) -> None:
    run = Scribe.run("write hi", cwd=tmp_path)
    call = run.pending_calls()[0]
    with pytest.raises(StaleDecision):
        call.approve(digest=args_digest({"path": "notes.txt", "content": "something else"}))
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL
    call.approve(digest=call.digest)
    assert ToolCall.objects.get(pk=call.pk).status == CallStatus.SUCCEEDED


def test_decisions_are_immutable(tmp_path: Path, approver: object) -> None:
    run = Scribe.run("write hi", cwd=tmp_path)
    decision = run.pending_calls()[0].approve(by=approver, note="fine")
    decision.note = "rewritten"
    with pytest.raises(ValueError):
        decision.save()
    with pytest.raises(ValueError):
        decision.delete()
    stored = Decision.objects.get(pk=decision.pk)
    assert (stored.note, stored.decided_by, stored.verdict) == ("fine", approver, "approved")


def test_resume_without_pending_calls_is_an_error(tmp_path: Path) -> None:
    run = Scribe.run("write hi", cwd=tmp_path)
    run.resume(approved=True)
    with pytest.raises(TransitionError):
        run.resume(approved=True)


def test_scripted_run_later_returns_queued_and_runs_at_commit(tmp_path: Path) -> None:
    from django.db import transaction

    with transaction.atomic():
        run = Scribe.run_later("write hi", cwd=tmp_path)
        assert run.status == RunStatus.QUEUED
        assert AgentRun.objects.get(pk=run.pk).status == RunStatus.QUEUED
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.SUSPENDED


def test_run_later_refuses_non_json_arguments(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not JSON"):
        Scribe.run_later("x", cwd=tmp_path, model=ScriptedModel([reply("x")]))
    assert not AgentRun.objects.exists()


def test_run_refuses_unknown_arguments() -> None:
    with pytest.raises(TypeError, match="colour"):
        Scribe.run("x", colour="red")


def test_cancel_expires_pending_calls(tmp_path: Path) -> None:
    run = Scribe.run("write hi", cwd=tmp_path)
    call = run.pending_calls()[0]
    assert run.cancel() is True
    assert run.status == RunStatus.CANCELLED
    call.refresh_from_db()
    assert call.status == CallStatus.EXPIRED
    with pytest.raises(AlreadyDecided):
        call.approve()
    assert run.cancel() is False


def test_scripted_signals_fire(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []

    def on_status(sender: object, run: AgentRun, old: str, new: str, **kw: object) -> None:
        seen.append(("status", f"{old}>{new}"))

    def on_requested(sender: object, tool_call: ToolCall, run: AgentRun, **kw: object) -> None:
        seen.append(("requested", tool_call.name))

    def on_decided(sender: object, tool_call: ToolCall, decision: Decision, **kw: object) -> None:
        seen.append(("decided", decision.verdict))

    run_status_changed.connect(on_status)
    approval_requested.connect(on_requested)
    approval_decided.connect(on_decided)
    try:
        run = Scribe.run("write hi", cwd=tmp_path)
        run.resume(approved=True)
    finally:
        run_status_changed.disconnect(on_status)
        approval_requested.disconnect(on_requested)
        approval_decided.disconnect(on_decided)
    assert ("requested", "write") in seen
    assert ("decided", "approved") in seen
    statuses = [s for kind, s in seen if kind == "status"]
    assert statuses == [
        "queued>running", "running>suspended", "suspended>queued", "queued>running", "running>done",
    ]


def test_scripted_events_record_every_step_capped(tmp_path: Path) -> None:
    run = ThreeTurns.run("three")
    run.resume(approved=True)
    types = list(run.events.order_by("id").values_list("type", flat=True))
    for expected in ("created", "model_request", "model_reply", "tool_call", "tool_result", "suspended",
                     "decision", "done"):
        assert expected in types


def test_scripted_failure_is_recorded(tmp_path: Path) -> None:
    model = ScriptedModel([tool_call("read", path="../../etc/passwd")])
    run = Scribe.run("escape", cwd=tmp_path, model=model)
    assert run.status == RunStatus.FAILED
    assert "SecurityError" in run.error


def test_scripted_max_turns_fails_the_run_with_a_clear_error() -> None:
    class Loop(ThreeTurns):
        max_turns = 1
        permissions = "auto"

    run = Loop.run("x", model=ScriptedModel([tool_call("glob", pattern="*"), tool_call("glob", pattern="*")]))
    assert run.status == RunStatus.FAILED
    assert "max_turns" in run.error


def test_scripted_duplicate_job_is_a_no_op(tmp_path: Path, counter: Path) -> None:
    from nexo_django.durable.runs import execute_run

    run = Bumper.run("bump")
    run.resume(approved=True)
    assert count(counter) == ["one"]
    assert execute_run(str(run.pk)) == "skipped"
    assert count(counter) == ["one"]


def test_a_queued_run_whose_agent_cannot_be_rebuilt_fails_with_the_reason() -> None:
    from nexo_django.durable.runs import execute_run

    run = AgentRun.objects.create(agent="tests.no_such_module.Agent", prompt="x", status=RunStatus.QUEUED)
    assert execute_run(str(run.pk)) == "failed"
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "cannot import agent 'tests.no_such_module.Agent'" in run.error
    assert execute_run(str(run.pk)) == "skipped"


def test_a_queued_run_that_cannot_be_rebuilt_reports_queued_to_failed() -> None:
    from nexo_django.durable.runs import execute_run

    seen: list[str] = []

    def on_status(sender: object, run: AgentRun, old: str, new: str, **kw: object) -> None:
        seen.append(f"{old}>{new}")

    run = AgentRun.objects.create(agent="tests.no_such_module.Agent", prompt="x", status=RunStatus.QUEUED)
    run_status_changed.connect(on_status)
    try:
        assert execute_run(str(run.pk)) == "failed"
    finally:
        run_status_changed.disconnect(on_status)
    assert seen == ["queued>failed"]  # it was never running: nothing claimed it


def test_scripted_idempotent_gated_call(counter: Path) -> None:
    run = Looker.run("look")
    assert run.status == RunStatus.SUSPENDED
    run.resume(approved=True)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert count(counter) == ["lookup:k"]
    assert ToolCall.objects.get(run=run).status == CallStatus.SUCCEEDED


@pytest.mark.parametrize(("start", "stored"), [("run_later", RunStatus.RUNNING), ("run", None)])
def test_pending_calls_appear_only_with_the_suspended_status(tmp_path: Path, start: str, stored: str | None) -> None:
    """No decision can land while the run still says running (it could never wake the run).
    A run started with run() is not even stored before its suspension commits."""
    from nexo_django.durable.journal import DbJournal

    seen: list[tuple[str | None, int]] = []
    original = DbJournal.suspend

    def spy(self: DbJournal, pending: list) -> None:
        original(self, pending)
        run = AgentRun.objects.first()
        seen.append((run and run.status, ToolCall.objects.filter(status=CallStatus.PENDING_APPROVAL).count()))

    DbJournal.suspend = spy  # type: ignore[method-assign]
    try:
        run = getattr(Scribe, start)("write hi", cwd=tmp_path)
    finally:
        DbJournal.suspend = original  # type: ignore[method-assign]
    run.refresh_from_db()
    assert seen == [(stored, 0)]
    assert run.status == RunStatus.SUSPENDED and run.pending_calls().count() == 1


def test_decide_updates_the_callers_object(tmp_path: Path) -> None:
    run = Scribe.run("write hi", cwd=tmp_path)
    call = run.pending_calls()[0]
    call.deny(note="no")
    assert call.status == CallStatus.DENIED


def test_wake_checks_pending_calls_with_and_without_further_conditions(tmp_path: Path) -> None:
    from django.db.models import Q

    from nexo_django.durable.runs import wake

    run = Scribe.run("write hi", cwd=tmp_path)
    assert not wake(run, RunStatus.SUSPENDED, unless_pending=True)
    assert not wake(run, RunStatus.SUSPENDED, Q(agent=run.agent), unless_pending=True)
    assert not wake(run, RunStatus.SUSPENDED, Q(agent="elsewhere"))
    run.refresh_from_db()
    assert (run.status, run.generation) == (RunStatus.SUSPENDED, 1)
    # Woken with its call undecided, the run (inline queue) asks for the same decision again.
    assert wake(run, RunStatus.SUSPENDED, Q(agent=run.agent))
    run.refresh_from_db()
    assert (run.status, run.generation, run.pending_calls().count()) == (RunStatus.SUSPENDED, 2, 1)


class AutoWriter(Agent):
    """Scripted: an ungated write in the virtual sandbox, then an answer (done in one run())."""

    model = ScriptedModel([tool_call("write", path="a.txt", content="A"), reply("Written.")])
    sandbox = "virtual"
    permissions = "auto"


class OutOfScript(Agent):
    """Scripted with nothing to say: the run fails."""

    model = ScriptedModel([])
    sandbox = "virtual"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("agent", [ThreeTurns, AutoWriter, OutOfScript], ids=lambda a: a.__name__)
def test_the_run_object_run_returns_is_its_row_without_reading_it_back(agent: type[Agent]) -> None:
    with CaptureQueriesContext(connection) as queries:
        run = agent.run("go")
    assert run.status in (RunStatus.SUSPENDED, RunStatus.DONE, RunStatus.FAILED)
    assert not [q for q in queries.captured_queries if q["sql"].startswith("SELECT") and "agentrun" in q["sql"]]
    stored = AgentRun.objects.get(pk=run.pk)
    fields = [f.attname for f in AgentRun._meta.concrete_fields]
    assert {f: getattr(run, f) for f in fields} == {f: getattr(stored, f) for f in fields}
    assert not run._state.adding and run._state.db == "default"


# --- the workspace a run started in (pinned) -------------------------------------------------------


def _flip(link: Path, target: Path) -> None:
    """Point ``link`` at ``target`` in one rename, as a deploy script flips a "current" link."""
    new = link.with_name(link.name + ".new")
    new.symlink_to(target)
    new.replace(link)


@pytest.mark.parametrize("how", ["run", "run_later"])
def test_scripted_approved_write_refuses_a_workspace_link_flipped_while_it_waited(how: str, tmp_path: Path) -> None:
    staging, production = tmp_path / "staging", tmp_path / "production"
    staging.mkdir()
    production.mkdir()
    (production / "keep.txt").write_text("production data")
    link = tmp_path / "current"
    link.symlink_to(staging)
    start = Scribe.run if how == "run" else Scribe.run_later
    run = start("write hi", cwd=link)
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED, run.error
    with transaction.atomic():  # flipped after the approval, before the run goes on
        run.pending_calls().get().approve()
        _flip(link, production)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "SecurityError" in run.error and str(staging) in run.error and str(production) in run.error
    assert sorted(p.name for p in production.iterdir()) == ["keep.txt"]  # nothing landed there
    assert not (staging / "notes.txt").exists()
    assert run.events.filter(type="security").count() == 1  # audited
    assert (run.lease_owner, run.lease_expires_at) == (None, None)


def test_scripted_approved_write_refuses_a_workspace_folder_replaced_under_its_name(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    run = Scribe.run("write hi", cwd=ws)
    with transaction.atomic():  # replaced after the approval, before the run goes on
        run.pending_calls().get().approve()
        ws.rename(tmp_path / "old-ws")
        ws.mkdir()  # same path, another directory (another inode)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "SecurityError" in run.error
    assert list(ws.iterdir()) == [] and list((tmp_path / "old-ws").iterdir()) == []


def test_scripted_run_resumes_in_its_pinned_workspace_through_the_same_link(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    link = tmp_path / "current"
    link.symlink_to(staging)
    run = Scribe.run_later("write hi", cwd=link)
    assert run.options["_workspace"]["root"] == str(staging)
    run.pending_calls().get().approve()
    run.refresh_from_db()
    assert run.status == RunStatus.DONE, run.error
    assert (staging / "notes.txt").read_text() == "hi"


def test_scripted_edited_arguments_in_a_flipped_workspace_are_refused_not_an_error(tmp_path: Path) -> None:
    from nexo_django.admin.previews import call_preview

    staging, production = tmp_path / "staging", tmp_path / "production"
    staging.mkdir()
    production.mkdir()
    link = tmp_path / "current"
    link.symlink_to(staging)
    run = Scribe.run("write hi", cwd=link)
    _flip(link, production)
    call = run.pending_calls().get()
    with pytest.raises(InvalidEditedArguments, match="different workspace"):
        call.approve(args={"path": "notes.txt", "content": "edited"})
    preview = call_preview(run, call)
    assert preview.kind == "unavailable" and "SecurityError" in preview.workspace
    assert list(production.iterdir()) == [] and list(staging.iterdir()) == []
    assert ToolCall.objects.get(pk=call.pk).status == CallStatus.PENDING_APPROVAL
