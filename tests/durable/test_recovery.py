"""The reconciler, from the database alone (scripted models, inline queue)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from nexo_django.core.errors import TransitionError
from nexo_django.durable.recovery import reconcile
from nexo_django.models import AgentRun, CallStatus, Decision, RunStatus, ToolCall
from tests.durable_agents import Bumper, Looker, count

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def die_while_executing(run: AgentRun) -> ToolCall:
    """Put the run where a worker killed inside the call leaves it: running, an executing call,
    a lease that has expired. (The real SIGKILL version is in test_workers.py.)"""
    call = run.pending_calls()[0]
    Decision.objects.create(tool_call=call, verdict="approved", digest=call.digest)
    ToolCall.objects.filter(pk=call.pk).update(status=CallStatus.EXECUTING)
    AgentRun.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING, lease_owner="dead-worker", lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    return call


def test_non_idempotent_call_caught_executing_becomes_outcome_unknown(counter: Path) -> None:
    run = Bumper.run("bump")
    call = die_while_executing(run)
    report = reconcile()
    assert report.needs_attention == [str(run.pk)]
    run.refresh_from_db()
    call.refresh_from_db()
    assert run.status == RunStatus.NEEDS_ATTENTION
    assert "outcome is unknown" in run.error
    assert call.status == CallStatus.OUTCOME_UNKNOWN
    assert count(counter) == []  # never re-run silently


def test_outcome_unknown_rerun_after_a_person_decides(counter: Path) -> None:
    run = Bumper.run("bump")
    call = die_while_executing(run)
    reconcile()
    with pytest.raises(TransitionError):
        run.retry()
    call.resolve_unknown(rerun=True, note="checked: it did not run")
    assert run.retry() is True
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert count(counter) == ["one"]


def test_outcome_unknown_not_rerun_tells_the_model(counter: Path) -> None:
    run = Bumper.run("bump")
    call = die_while_executing(run)
    reconcile()
    call.resolve_unknown(rerun=False, note="it did run")
    run.retry()
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert count(counter) == []
    result = [m for m in run.transcript() if m["role"] == "tool"][0]["content"]
    assert "outcome unknown" in result["error"] and "it did run" in result["error"]


def test_idempotent_call_caught_executing_is_retried(counter: Path) -> None:
    run = Looker.run("look")
    die_while_executing(run)
    report = reconcile()
    assert report.requeued == [str(run.pk)]
    run.refresh_from_db()
    assert run.status == RunStatus.DONE  # the inline queue ran it again at once
    assert run.recoveries == 1
    assert count(counter) == ["lookup:k"]


def test_live_lease_is_left_alone(counter: Path) -> None:
    run = Bumper.run("bump")
    AgentRun.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING, lease_owner="alive", lease_expires_at=timezone.now() + timedelta(minutes=5)
    )
    assert str(reconcile()) == "requeued=0 needs_attention=0 failed=0 resent=0"
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.RUNNING


def test_a_run_that_keeps_dying_stops_retrying(settings: object) -> None:
    run = Looker.run("look")
    AgentRun.objects.filter(pk=run.pk).update(recoveries=3)
    die_while_executing(run)
    report = reconcile()
    assert report.failed == [str(run.pk)]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "gave up after 3 recoveries" in run.error


def test_lost_job_of_a_queued_run_is_sent_again(counter: Path) -> None:
    run = Bumper.run("bump")
    run.resume(approved=True)
    # As if the job had been lost with Redis: the run is queued in the database only.
    run2 = Bumper.run("bump")
    AgentRun.objects.filter(pk=run2.pk).update(status=RunStatus.QUEUED, updated_at=timezone.now() - timedelta(hours=1))
    ToolCall.objects.filter(run=run2).delete()
    report = reconcile()
    assert report.resent == [str(run2.pk)]
    assert AgentRun.objects.get(pk=run2.pk).status == RunStatus.SUSPENDED


def test_suspended_run_with_nothing_pending_is_woken(counter: Path) -> None:
    run = Bumper.run("bump")
    call = run.pending_calls()[0]
    # As if the decision committed but the wake-up was lost.
    Decision.objects.create(tool_call=call, verdict="approved", digest=call.digest)
    ToolCall.objects.filter(run=run).update(status=CallStatus.APPROVED)
    report = reconcile()
    assert report.requeued == [str(run.pk)]
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert count(counter) == ["one"]


def test_reconcile_command_prints_its_report(capsys: pytest.CaptureFixture[str]) -> None:
    call_command("nexo_reconcile")
    assert "requeued=0" in capsys.readouterr().out


def test_late_write_of_a_dead_worker_is_fenced_off(counter: Path) -> None:
    from nexo_django.core.errors import LeaseLost
    from nexo_django.durable.journal import DbJournal
    from nexo_django.durable.runs import build_agent

    run = Bumper.run("bump")
    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, lease_owner="old-token")
    journal = DbJournal(AgentRun.objects.get(pk=run.pk), "old-token", build_agent(run))
    AgentRun.objects.filter(pk=run.pk).update(lease_owner="new-token")  # another worker took over
    journal.append({"role": "user", "content": "late"})
    with pytest.raises(LeaseLost):
        journal.flush()
    assert not run.messages.filter(data__content="late").exists()


def test_heartbeat_keeps_a_slow_but_live_run_from_being_taken(settings: object) -> None:
    import threading
    import time

    from django.db import connections

    from tests.durable_agents import Sleeper

    settings.NEXO = {**settings.NEXO, "LEASE_SECONDS": 1}  # type: ignore[attr-defined]
    started: list[AgentRun] = []

    def start() -> None:
        try:
            started.append(Sleeper.run("rest"))
        finally:
            connections.close_all()

    thread = threading.Thread(target=start)
    thread.start()
    time.sleep(1.6)  # longer than the lease: only the heartbeat keeps it
    report = reconcile()
    thread.join(timeout=30)
    assert report.requeued == [] and report.needs_attention == []
    run = AgentRun.objects.get()
    assert run.status == RunStatus.DONE and run.recoveries == 0


def test_takeover_rechecks_the_lease_a_heartbeat_renewed_meanwhile(counter: Path) -> None:
    from nexo_django.durable.recovery import Report, _recover_expired

    run = Looker.run("look")
    die_while_executing(run)
    stale = AgentRun.objects.get(pk=run.pk)  # what a reconciler read: the lease had expired
    # ... and then the worker's heartbeat renewed it, before the takeover.
    AgentRun.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() + timedelta(minutes=5))
    report = Report()
    _recover_expired(stale, timezone.now(), report)
    assert str(report) == "requeued=0 needs_attention=0 failed=0 resent=0"
    fresh = AgentRun.objects.get(pk=run.pk)
    assert (fresh.status, fresh.lease_owner, fresh.recoveries) == (RunStatus.RUNNING, "dead-worker", 0)


def test_recoveries_after_progress_do_not_count_towards_giving_up(counter: Path) -> None:
    from nexo_django.models import RunEvent

    run = Looker.run("look")
    # Three recoveries so far, the last one when the transcript was shorter than it is now.
    AgentRun.objects.filter(pk=run.pk).update(recoveries=3)
    RunEvent.objects.create(run=run, type="recovered", data={"recoveries": 3, "messages": run.messages.count() - 1})
    die_while_executing(run)
    report = reconcile()
    assert report.requeued == [str(run.pk)] and report.failed == []
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert run.recoveries == 1  # counted from the progress on


def test_recoveries_without_progress_still_give_up(counter: Path) -> None:
    from nexo_django.models import RunEvent

    run = Looker.run("look")
    AgentRun.objects.filter(pk=run.pk).update(recoveries=3)
    RunEvent.objects.create(run=run, type="recovered", data={"recoveries": 3, "messages": run.messages.count()})
    die_while_executing(run)
    report = reconcile()
    assert report.failed == [str(run.pk)]
    assert "gave up after 3 recoveries without progress" in AgentRun.objects.get(pk=run.pk).error


def test_a_round_looks_only_at_suspended_runs_with_a_recent_change(counter: Path) -> None:
    run = Bumper.run("bump")
    call = run.pending_calls()[0]
    # Decided by hand long ago, and the wake-up lost: a round leaves it; a full round finds it.
    Decision.objects.create(tool_call=call, verdict="approved", digest=call.digest)
    ToolCall.objects.filter(run=run).update(status=CallStatus.APPROVED, updated_at=timezone.now() - timedelta(days=2))
    assert reconcile().requeued == []
    assert reconcile(full=True).requeued == [str(run.pk)]
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.DONE
    assert count(counter) == ["one"]


def test_reconcile_command_full(capsys: pytest.CaptureFixture[str]) -> None:
    call_command("nexo_reconcile", "--full")
    assert "requeued=0" in capsys.readouterr().out


@pytest.mark.postgresql_only
def test_settling_an_unknown_outcome_takes_the_runs_row_lock_first(counter: Path) -> None:
    """Every writer of a run's events holds the run's row lock until it commits (the live
    stream's event ids are in commit order because of it): settling an unknown outcome waits
    for another holder of the run's row, as a decision does."""
    import threading

    from django.db import connection, connections

    run = Bumper.run("bump")
    call = die_while_executing(run)
    reconcile()
    done = threading.Event()

    def settle() -> None:
        try:
            ToolCall.objects.get(pk=call.pk).resolve_unknown(rerun=False, note="it did run")
            done.set()
        finally:
            connections.close_all()

    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute("SELECT id FROM nexo_django_agentrun WHERE id = %s FOR NO KEY UPDATE", [run.pk])  # as a worker holds it
        worker = threading.Thread(target=settle)
        worker.start()
        assert not done.wait(0.5)  # it waits for the run's row
        cursor.execute("COMMIT")
    worker.join(10)
    assert done.is_set()
    call.refresh_from_db()
    assert call.status == CallStatus.FAILED
