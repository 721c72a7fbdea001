"""The concurrent worker (``manage.py nexo_worker --concurrency N``, issue 26): one real worker
process carrying many runs at once, SIGKILLed, SIGTERMed, a job timing out beside others, a run
hogging the CPU beside others. Real redis-server, real worker processes, scripted (slow) models.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from nexo_django.durable import dispatch
from nexo_django.durable.recovery import reconcile
from nexo_django.models import AgentRun, CallStatus, RunStatus, ToolCall
from tests.durable_agents import Brisk, Dawdler, Patient, Spinner, count, model_gate
from tests.servers import signal_quietly, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable, pytest.mark.redis]

WAIT = 60.0


def statuses(runs: list[AgentRun]) -> dict[str, int]:
    found: dict[str, int] = {}
    for status in AgentRun.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", flat=True):
        found[status] = found.get(status, 0) + 1
    return found


def wait_all(runs: list[AgentRun], status: str, timeout: float = WAIT, *, workers: Any = None) -> None:
    try:
        wait_until(lambda: statuses(runs).get(status) == len(runs), timeout=timeout, interval=0.2,
                   what=f"{len(runs)} runs to be {status}")
    except TimeoutError:
        logs = f"\n{workers.logs()}" if workers is not None else ""
        raise AssertionError(f"runs are {statuses(runs)}, expected all {status}{logs}") from None


def recorded(queue: Any, finished: int) -> None:
    """Wait, bounded, until rq has recorded ``finished`` jobs' ends and none is still started: a
    job's end is written to Redis after its run's last commit, so a run is done in the database a
    moment before rq lists its job as finished (longer on a loaded machine)."""
    wait_until(lambda: queue.finished_job_registry.count >= finished and not queue.started_job_registry.count,
               timeout=WAIT, what=f"rq to record {finished} jobs' ends")  # fmt: skip


def bumps(runs: list[AgentRun]) -> list[str]:
    return list(ToolCall.objects.filter(run__in=[r.pk for r in runs], name="bump").values_list("status", flat=True))


def test_one_process_carries_many_runs_at_once_and_each_finishes_once_scripted(
    rq_worker: Any, counter: Path
) -> None:
    from rq import Worker
    from rq.job import Job

    workers = rq_worker(1, concurrency=20)
    runs = [Brisk.run_later(f"brisk {i}") for i in range(20)]
    # Each run waits 0.7 s on each of its two model turns: twenty of them in flight in one process.
    most = 0
    deadline = time.monotonic() + WAIT
    while statuses(runs).get(RunStatus.DONE, 0) < len(runs) and time.monotonic() < deadline:
        most = max(most, statuses(runs).get(RunStatus.RUNNING, 0))
        time.sleep(0.05)
    wait_all(runs, RunStatus.DONE, workers=workers)
    assert most >= 10, f"at most {most} runs were running at once"
    assert count(counter).count("b") == 20
    assert bumps(runs) == [CallStatus.SUCCEEDED] * 20
    # rq's own bookkeeping: every job finished, the worker listed as rq lists any worker.
    queue = dispatch.get_queue()
    recorded(queue, 20)
    assert queue.finished_job_registry.count == 20 and queue.failed_job_registry.count == 0
    assert queue.started_job_registry.count == 0
    # Each job's end as rq records a success (written for the jobs ending together at once, the
    # job's hash only where its run changed it): its data, its result, its times, its worker.
    jobs = [Job.fetch(job_id, connection=queue.connection) for job_id in queue.finished_job_registry.get_job_ids()]
    assert sorted(str(job.args[0]) for job in jobs) == sorted(str(r.pk) for r in runs)
    for job in jobs:
        assert job.get_status() == "finished" and job.return_value() == RunStatus.DONE
        assert job.func_name == dispatch.JOB_FUNC and job.worker_name == workers.names[0]
        assert job.started_at is not None and job.ended_at is not None and job.started_at <= job.ended_at
    assert [w.name for w in Worker.all(queue=queue)] == workers.names
    assert workers.alive() == [True]
    # SIGUSR2: every thread's stack in the worker's log (the threads wait for jobs), and it goes on.
    os.kill(workers.pids[0], signal.SIGUSR2)
    log = workers.log_paths[0]  # all of it: logs() keeps the last 200 lines, the stacks are longer
    # The stacks are written one thread after another: wait for all of them, not the first.
    wait_until(lambda: log.read_text().count("Thread 0x") >= 20 and "nexo_django/durable/worker.py" in log.read_text(),
               timeout=10, what="the threads' stacks (a thread per run in flight, the main one, rq's)")
    # ... and the main thread again, whatever the number of threads (faulthandler stops at 100).
    marker = "Main thread, as Python sees it"
    wait_until(lambda: "nexo_worker.py" in log.read_text().partition(marker)[2], timeout=10, what="the main thread")
    assert "in work" in log.read_text().partition(marker)[2]
    more = [Brisk.run_later("brisk again")]
    wait_all(more, RunStatus.DONE, workers=workers)
    assert workers.alive() == [True]


def test_a_burst_of_runs_past_redis_pys_hundred_connections_all_start_at_once_scripted(
    rq_worker: Any, counter: Path
) -> None:
    """130 runs already queued when the worker starts: it takes them all at once (one per free
    thread) and every thread starts its job together, where rq's bookkeeping of each once opened
    a Redis connection each and redis-py refused the 101st ("Too many connections": the job was
    dropped and its run stayed queued until the reconciler)."""
    runs = [Brisk.run_later(f"brisk {i}") for i in range(130)]
    workers = rq_worker(1, concurrency=130)
    wait_all(runs, RunStatus.DONE, timeout=120, workers=workers)
    assert count(counter).count("b") == 130
    queue = dispatch.get_queue()
    recorded(queue, 130)
    assert queue.finished_job_registry.count == 130 and queue.failed_job_registry.count == 0
    assert "Too many connections" not in workers.logs()


def test_sigkill_with_fifty_runs_in_flight_recovers_every_run_once_scripted(
    rq_worker: Any, counter: Path, settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.NEXO = {**settings.NEXO, "LEASE_SECONDS": 2}
    gate = model_gate(tmp_path, monkeypatch)
    workers = rq_worker(1, concurrency=50)
    runs = [Patient.run_later(f"patient {i}") for i in range(50)]
    # All fifty claimed and held in their first model request in the one process.
    wait_until(lambda: count(counter).count("model") == 50, timeout=WAIT, interval=0.05,
               what="fifty model requests in flight")
    workers.kill(0)
    gate.touch()  # for the worker that takes them back
    assert statuses(runs) == {RunStatus.RUNNING: 50}
    assert count(counter) == ["model"] * 50  # nothing ran: every run was waiting on its model
    requeued: set[str] = set()

    def recovered() -> bool:
        report = reconcile()
        assert not (set(report.requeued) & requeued), "a run was recovered twice"
        requeued.update(report.requeued)
        return len(requeued) == 50

    wait_until(recovered, timeout=WAIT, interval=0.2, what="the leases to expire")
    assert requeued == {str(r.pk) for r in runs}
    rq_worker(1, concurrency=50)
    wait_all(runs, RunStatus.DONE)
    assert set(AgentRun.objects.filter(pk__in=[r.pk for r in runs]).values_list("recoveries", flat=True)) == {1}
    assert count(counter).count("x") == 50  # each side effect ran once
    assert bumps(runs) == [CallStatus.SUCCEEDED] * 50
    assert reconcile().requeued == []


def test_sigterm_hands_runs_in_flight_back_at_their_next_commit_scripted(
    rq_worker: Any, counter: Path, settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.NEXO = {**settings.NEXO, "LEASE_SECONDS": 2}
    gate = model_gate(tmp_path, monkeypatch)
    workers = rq_worker(1, concurrency=10, extra_args=["--shutdown-grace", "20"])
    runs = [Patient.run_later(f"patient {i}") for i in range(10)]
    wait_until(lambda: count(counter).count("model") == 10, timeout=WAIT, interval=0.05,
               what="ten model requests in flight")
    signal_quietly(workers.pids[0], signal.SIGTERM)
    gate.touch()  # the answers come after the signal, inside the grace
    # Each run gets its model's answer, runs its call, commits the result, and stops before its
    # next model request: back in the queue, with a new job, and nothing left to the reconciler.
    proc = workers._procs[0]
    try:
        code = proc.wait(WAIT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker did not stop\n{workers.logs()}") from None
    assert code == 0, workers.logs()
    assert statuses(runs) == {RunStatus.QUEUED: 10}, workers.logs()
    assert count(counter).count("x") == 10 and count(counter).count("model") == 10
    assert bumps(runs) == [CallStatus.SUCCEEDED] * 10
    for run in AgentRun.objects.filter(pk__in=[r.pk for r in runs]):
        assert (run.generation, run.recoveries, run.lease_owner) == (2, 0, None)
        assert dispatch.job_pending(run.pk, run.generation)  # its next job waits for a worker
    rq_worker(1, concurrency=10)
    wait_all(runs, RunStatus.DONE)
    assert count(counter).count("x") == 10  # no call ran twice
    assert set(AgentRun.objects.filter(pk__in=[r.pk for r in runs]).values_list("recoveries", flat=True)) == {0}


def test_sigterm_leaves_a_run_past_the_grace_to_the_reconciler_scripted(
    rq_worker: Any, counter: Path, settings: Any
) -> None:
    settings.NEXO = {**settings.NEXO, "LEASE_SECONDS": 2}
    workers = rq_worker(1, concurrency=4, extra_args=["--shutdown-grace", "1"])
    run = Dawdler.run_later("dawdle")  # a 20 s call: longer than the grace
    wait_until(lambda: AgentRun.objects.get(pk=run.pk).status == RunStatus.RUNNING, timeout=WAIT,
               what="the run to start")
    time.sleep(0.5)  # inside its call
    signal_quietly(workers.pids[0], signal.SIGTERM)
    assert workers._procs[0].wait(WAIT) == 0
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.RUNNING  # cut off, its lease still set
    requeued = wait_until(lambda: reconcile().requeued, timeout=WAIT, interval=0.2, what="the lease to expire")
    assert requeued == [str(run.pk)]


def test_a_job_timeout_ends_one_run_and_its_cpu_hog_stalls_no_neighbour_scripted(
    rq_worker: Any, counter: Path, settings: Any
) -> None:
    # Leases of 2 s, renewed every 0.7 s, beside a run that keeps a CPU busy in pure Python.
    settings.NEXO = {**settings.NEXO, "LEASE_SECONDS": 2, "JOB_TIMEOUT": 8}
    workers = rq_worker(1, concurrency=8)
    hog = Spinner.run_later("spin")
    wait_until(lambda: AgentRun.objects.get(pk=hog.pk).status == RunStatus.RUNNING, timeout=WAIT,
               what="the hog to start")
    neighbours = [Patient.run_later(f"patient {i}") for i in range(5)]  # 4 s each, twice a lease
    stolen: list[str] = []
    deadline = time.monotonic() + WAIT
    while statuses(neighbours).get(RunStatus.DONE, 0) < 5 and time.monotonic() < deadline:
        stolen += reconcile().requeued  # an expired lease would be taken here
        time.sleep(0.2)
    wait_all(neighbours, RunStatus.DONE, workers=workers)
    assert stolen == []
    wait_until(lambda: AgentRun.objects.filter(pk=hog.pk, status=RunStatus.FAILED).exists(),
               timeout=WAIT, what="the hog's job to time out")
    hog_done = AgentRun.objects.get(pk=hog.pk)
    assert hog_done.error == "JobTimeout: the job exceeded its timeout (8 seconds)"
    # rq's own failure handling files the job a moment after the run recorded why it failed.
    wait_until(lambda: dispatch.job_status(hog.pk, hog_done.generation) == "failed", timeout=WAIT,
               what="rq to file the hog's job as failed")
    assert set(AgentRun.objects.filter(pk__in=[r.pk for r in neighbours]).values_list("recoveries", flat=True)) == {0}
    assert count(counter).count("x") == 5
    # The worker goes on taking jobs after the timeout.
    after = Brisk.run_later("after")
    wait_all([after], RunStatus.DONE, workers=workers)
    assert workers.alive() == [True]


def test_rqs_stop_job_stops_that_run_at_its_next_commit_and_no_other_scripted(
    rq_worker: Any, redis_queue_settings: Any
) -> None:
    """rq's ``stop-job`` (the dashboard's "stop") reaches the run in its thread: it fails at its
    next commit, before its next model request, with why; its neighbour goes on. (rq's own
    handler looked at one "current job" and had no work horse to kill: nothing stopped.)"""
    from rq.command import send_stop_job_command

    workers = rq_worker(concurrency=2)
    doomed, neighbour = Patient.run_later("stop me"), Brisk.run_later("go on")
    wait_all([doomed, neighbour], RunStatus.RUNNING, workers=workers)
    doomed.refresh_from_db()
    job_id = dispatch.job_id(doomed.pk, doomed.generation)
    send_stop_job_command(dispatch.get_queue().connection, job_id)
    wait_all([neighbour], RunStatus.DONE, workers=workers)
    wait_all([doomed], RunStatus.FAILED, workers=workers)
    doomed.refresh_from_db()
    assert doomed.error == "JobStopped: stopped by rq's stop-job command"
    assert RunStatus.DONE not in {doomed.status}
    wait_until(lambda: dispatch.job_status(doomed.pk, doomed.generation) == "stopped", timeout=WAIT,
               what="rq to file the job as stopped")  # fmt: skip
