"""Durable runs through real rqworker processes and a real Redis (scripted models).

The test process plays the person in "another process": it decides; the workers run.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from nexo_django.durable import dispatch
from nexo_django.durable.recovery import reconcile
from nexo_django.models import AgentRun, CallStatus, Decision, RunMessage, RunStatus, ToolCall
from tests.durable_agents import Bumper, Conversant, Scribe, ThreeTurns, Tripper, count
from tests.servers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable, pytest.mark.redis]

WAIT = 30.0


def wait_status(run: AgentRun, *statuses: str, timeout: float = WAIT) -> AgentRun:
    def reached() -> AgentRun | None:
        fresh = AgentRun.objects.get(pk=run.pk)
        return fresh if fresh.status in statuses else None

    try:
        return wait_until(reached, timeout=timeout, what=f"run {run.pk} to reach {statuses}")
    except TimeoutError:
        fresh = AgentRun.objects.get(pk=run.pk)
        raise AssertionError(f"run is {fresh.status} ({fresh.error!r}), expected {statuses}") from None


def test_seed_example_worker_suspends_and_resume_in_another_process_finishes(
    rq_worker: Any, tmp_path: Path
) -> None:
    workers = rq_worker(1)
    run = Scribe.run_later("Write 'hi' to notes.txt", cwd=tmp_path)
    assert run.status == RunStatus.QUEUED
    run = wait_status(run, RunStatus.SUSPENDED)
    assert [c.name for c in run.pending_calls()] == ["write"]
    assert not (tmp_path / "notes.txt").exists()
    run.resume(approved=True)  # here, in the test process; the worker continues the run
    run = wait_status(run, RunStatus.DONE)
    assert (tmp_path / "notes.txt").read_text() == "hi"
    assert run.result == "Done."
    assert workers.alive() == [True]


def test_seed_example_denied_finishes_done_without_the_file(rq_worker: Any, tmp_path: Path) -> None:
    rq_worker(1)
    run = wait_status(Scribe.run_later("Write 'hi'", cwd=tmp_path), RunStatus.SUSPENDED)
    run.resume(approved=False)
    wait_status(run, RunStatus.DONE)
    assert not (tmp_path / "notes.txt").exists()


def test_a_follow_up_is_run_and_resumed_by_a_worker_in_another_process_scripted(
    rq_worker: Any, tmp_path: Path
) -> None:
    rq_worker(1)
    first = wait_status(Conversant.run_later("Capital of France?", cwd=tmp_path), RunStatus.DONE)
    assert first.result == "Paris."
    second = first.follow_up("Write it down.")  # enqueued, like run_later
    assert second.status == RunStatus.QUEUED and second.previous == first
    second = wait_status(second, RunStatus.SUSPENDED)  # the worker sent the earlier transcript
    assert [c.name for c in second.pending_calls()] == ["write"]
    second.resume(approved=True)
    second = wait_status(second, RunStatus.DONE)
    assert second.result == "Noted it." and (tmp_path / "notes.txt").read_text() == "Paris"
    assert [m.role for m in RunMessage.objects.filter(run=first).order_by("seq")] == ["user", "assistant"]
    assert [m.role for m in RunMessage.objects.filter(run=second).order_by("seq")] == [
        "user", "assistant", "tool", "assistant"]  # its own rows only: nothing copied


def wait_job_status(run: AgentRun, status: str) -> None:
    """Wait until the run's current rq job has ``status`` (the worker marks a job failed a moment
    after its work horse died)."""
    def reached() -> bool:
        fresh = AgentRun.objects.get(pk=run.pk)
        return dispatch.job_status(fresh.pk, fresh.generation) == status

    wait_until(reached, timeout=WAIT, what=f"the job of run {run.pk} to be {status}")


def expire_lease(run: AgentRun) -> None:
    AgentRun.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def crash_in_worker(rq_worker: Any, monkeypatch: pytest.MonkeyPatch, point: str, once: Path | None = None) -> Any:
    monkeypatch.setenv("NEXO_TEST_CRASH_AT", point)
    if once is not None:
        monkeypatch.setenv("NEXO_TEST_CRASH_ONCE", str(once))
    return rq_worker(1)


def test_killed_during_a_non_idempotent_call_is_outcome_unknown_never_rerun(
    rq_worker: Any, monkeypatch: pytest.MonkeyPatch, counter: Path
) -> None:
    crash_in_worker(rq_worker, monkeypatch, "before_result")  # after the side effect, before its result
    run = wait_status(Bumper.run_later("bump"), RunStatus.SUSPENDED)
    run.resume(approved=True)
    wait_until(lambda: ToolCall.objects.filter(run=run, status=CallStatus.EXECUTING).exists(), timeout=WAIT,
               what="the call to be executing")
    wait_until(lambda: count(counter) == ["one"], timeout=WAIT, what="the side effect")
    time.sleep(0.5)  # the work horse is dead by now; its lease still says running
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.RUNNING
    expire_lease(run)
    report = reconcile()
    assert report.needs_attention == [str(run.pk)]
    run.refresh_from_db()
    call = ToolCall.objects.get(run=run)
    assert (run.status, call.status) == (RunStatus.NEEDS_ATTENTION, CallStatus.OUTCOME_UNKNOWN)
    reconcile()
    time.sleep(0.5)
    assert count(counter) == ["one"]  # the side effect happened once and was not repeated
    assert Decision.objects.filter(tool_call__run=run).count() == 1


def test_killed_after_marking_executing_is_outcome_unknown_too(
    rq_worker: Any, monkeypatch: pytest.MonkeyPatch, counter: Path
) -> None:
    crash_in_worker(rq_worker, monkeypatch, "executing")
    run = wait_status(Bumper.run_later("bump"), RunStatus.SUSPENDED)
    run.resume(approved=True)
    wait_until(lambda: ToolCall.objects.filter(run=run, status=CallStatus.EXECUTING).exists(), timeout=WAIT,
               what="the call to be executing")
    time.sleep(0.5)
    expire_lease(run)
    reconcile()
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.NEEDS_ATTENTION
    assert count(counter) == []


def test_killed_before_a_tool_is_recovered_and_finishes_once(
    rq_worker: Any, monkeypatch: pytest.MonkeyPatch, counter: Path, tmp_path: Path
) -> None:
    crash_in_worker(rq_worker, monkeypatch, "before_tool", once=tmp_path / "crashed-once")
    run = wait_status(Bumper.run_later("bump"), RunStatus.SUSPENDED)
    run.resume(approved=True)
    wait_until(lambda: (tmp_path / "crashed-once").exists(), timeout=WAIT, what="the crash")
    # The worker claims a resumed run in the commit that marks its call executing, after this
    # point: the run is still queued, and its job fails once the worker sees its work horse die.
    # Until then the job is "started", and the reconciler would send a second job (no recovery).
    wait_job_status(run, "failed")
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.QUEUED
    requeued = wait_until(lambda: reconcile(stale_after=0).requeued, timeout=WAIT, what="the recovery")
    assert requeued == [str(run.pk)]
    run = wait_status(run, RunStatus.DONE)
    assert run.recoveries == 1
    assert count(counter) == ["one"]


def test_a_run_whose_worker_keeps_dying_gives_up_with_the_reason(
    rq_worker: Any, monkeypatch: pytest.MonkeyPatch, counter: Path, settings: Any
) -> None:
    settings.NEXO = {**settings.NEXO, "MAX_RECOVERIES": 2}
    crash_in_worker(rq_worker, monkeypatch, "before_tool")  # every time
    run = wait_status(Bumper.run_later("bump"), RunStatus.SUSPENDED)
    run.resume(approved=True)
    def dead_job_found() -> str | None:
        report = reconcile(stale_after=0)
        return "failed" if report.failed else "requeued" if report.requeued else None

    # Each time the work horse dies before the run's first commit.
    recovered = [wait_until(dead_job_found, timeout=WAIT, what="the reconciler to find the dead job") for _ in range(3)]
    assert recovered == ["requeued", "requeued", "failed"]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "gave up after 2 recoveries" in run.error
    assert count(counter) == []


def test_jobs_lost_with_redis_are_brought_back_from_the_database(
    rq_worker: Any, redis_queue_settings: Any, counter: Path
) -> None:
    runs = [Bumper.run_later(f"bump {i}") for i in range(3)]
    # No worker yet: the jobs sit in Redis. Then Redis loses everything.
    redis_queue_settings.server.flushall()
    workers = rq_worker(1)
    time.sleep(0.5)
    assert {AgentRun.objects.get(pk=r.pk).status for r in runs} == {RunStatus.QUEUED}
    report = reconcile(stale_after=0)
    assert sorted(report.resent) == sorted(str(r.pk) for r in runs)
    for run in runs:
        wait_status(run, RunStatus.SUSPENDED)
    # Suspended runs survive a Redis restart untouched: they live in the database. An rq
    # worker caught mid-command by the restart quits (rq's choice; its supervisor starts it
    # again), so this one stops first and a fresh one comes up afterwards, as in production.
    workers.stop()
    redis_queue_settings.server.restart()
    for run in runs:
        AgentRun.objects.get(pk=run.pk).resume(approved=True)
    rq_worker(1)
    for run in runs:
        wait_status(run, RunStatus.DONE)
    assert sorted(count(counter)) == ["one", "one", "one"]


def test_duplicate_jobs_for_one_run_execute_once(rq_worker: Any, counter: Path) -> None:
    rq_worker(2)
    run = wait_status(Bumper.run_later("bump"), RunStatus.SUSPENDED)
    run.resume(approved=True)
    run.refresh_from_db()
    for _ in range(3):  # a replayed or duplicated wake-up
        dispatch.send(str(run.pk), run.generation + 10)
    wait_status(run, RunStatus.DONE)
    time.sleep(0.5)
    assert count(counter) == ["one"]


def test_killed_after_a_virtual_write_committed_keeps_the_write(
    rq_worker: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    crash_in_worker(rq_worker, monkeypatch, "after_result", once=tmp_path / "crashed-once")
    run = wait_status(ThreeTurns.run_later("three"), RunStatus.SUSPENDED)  # virtual sandbox
    run.resume(approved=True)
    wait_until(lambda: (tmp_path / "crashed-once").exists(), timeout=WAIT, what="the crash")
    time.sleep(0.5)
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.RUNNING
    assert ToolCall.objects.get(run=run, name="write").status == CallStatus.SUCCEEDED
    expire_lease(run)
    assert reconcile().requeued == [str(run.pk)]
    run = wait_status(run, RunStatus.DONE)
    assert run.workspace["files"] == {"out.txt": "three"}
    read = [m for m in run.transcript() if m.get("name") == "read"][0]["content"]
    assert read["content"] == "three"  # the resumed worker read the write back


def test_killed_during_an_idempotent_call_never_asks_the_model_twice(
    rq_worker: Any, monkeypatch: pytest.MonkeyPatch, counter: Path, tmp_path: Path
) -> None:
    crash_in_worker(rq_worker, monkeypatch, "in_tool", once=tmp_path / "crashed-once")
    run = Tripper.run_later("trip")
    wait_until(lambda: (tmp_path / "crashed-once").exists(), timeout=WAIT, what="the crash")
    time.sleep(0.5)
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.RUNNING
    expire_lease(run)
    assert reconcile().requeued == [str(run.pk)]
    run = wait_status(run, RunStatus.DONE)
    # One model request per assistant turn; the idempotent call ran again after the crash.
    assert count(counter) == ["model", "trip:t", "trip:t", "model"]
    assert sum(1 for m in run.transcript() if m["role"] == "assistant") == 2


@pytest.mark.parametrize("worker_class", ["rq.worker.Worker", "rq.worker.SimpleWorker"])
def test_job_taken_by_a_worker_killed_before_the_claim_is_sent_again(
    rq_worker: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, worker_class: str
) -> None:
    # The first job dies as soon as a worker starts it: the run is still queued, and its job
    # stays "started" (SimpleWorker: the worker died with it) or "failed" (Worker: the parent
    # saw its work horse die). Neither will ever claim the run.
    monkeypatch.setenv("NEXO_TEST_CRASH_AT", "job_started")
    monkeypatch.setenv("NEXO_TEST_CRASH_ONCE", str(tmp_path / "crashed-once"))
    workers = rq_worker(2, worker_class=worker_class)
    run = Scribe.run_later("Write 'hi'", cwd=tmp_path)
    wait_until(lambda: (tmp_path / "crashed-once").exists(), timeout=WAIT, what="the crash")
    simple = worker_class.endswith("SimpleWorker")
    wait_job_status(run, "started" if simple else "failed")
    time.sleep(0.5)
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.QUEUED
    report = reconcile(stale_after=0)
    # SimpleWorker: the job stays "started" and is sent again; Worker: the job "failed" (its work
    # horse died), which counts as a recovery. Either way a new job id, and the run goes on.
    expected = "resent" if simple else "requeued"
    assert getattr(report, expected) == [str(run.pk)]
    run = wait_status(run, RunStatus.SUSPENDED)
    assert run.generation == 2
    assert workers.alive().count(True) >= 1
