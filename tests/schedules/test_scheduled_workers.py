"""Runs at a time and schedules with real Redis, real ``rqworker --with-scheduler`` processes
and rq's own cron scheduler (``manage.py rqcron``); scripted models."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from rq.registry import ScheduledJobRegistry

from nexo_django.durable import dispatch
from nexo_django.durable.queue_health import queue_warning, waiting_runs
from nexo_django.durable.recovery import reconcile
from nexo_django.models import AgentRun
from nexo_django.schedule_models import ScheduleSlot
from tests.conftest import _worker_env
from tests.durable_agents import Bumper, count
from tests.schedules.helpers import make
from tests.servers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable, pytest.mark.redis]

REPO = Path(__file__).resolve().parents[2]
SCHEDULER = ["--with-scheduler"]


def scheduled_ids() -> list[str]:
    return list(ScheduledJobRegistry(queue=dispatch.get_queue()).get_job_ids())


def wait_done(run: AgentRun, timeout: float = 40.0) -> AgentRun:
    return wait_until(lambda: AgentRun.objects.filter(pk=run.pk, status__in=("done", "failed")).first(),
                      timeout=timeout, what=f"run {run.pk} to finish")


def test_a_run_at_a_time_waits_in_rqs_scheduler_and_the_reconciler_leaves_it(redis_queue_settings: Any) -> None:
    at = timezone.now() + timedelta(hours=2)
    run = Bumper.run_later("go", permissions="auto", at=at)
    assert run.status == "queued" and run.not_before == at
    assert scheduled_ids() == [dispatch.job_id(run.pk, 1)]
    # Aged as if it had been stored an hour ago: still not waiting, not lost, not stuck.
    AgentRun.objects.filter(pk=run.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    report = reconcile(stale_after=0)
    assert (report.resent, report.requeued, report.failed, report.warnings) == ([], [], [], [])
    assert waiting_runs() == (0, None)
    assert queue_warning() is None
    assert queue_warning(run=AgentRun.objects.get(pk=run.pk)) is None
    assert AgentRun.objects.get(pk=run.pk).generation == 1


def test_a_due_run_whose_scheduled_job_redis_lost_is_sent_again(redis_queue_settings: Any) -> None:
    run = Bumper.run_later("go", permissions="auto", at=timezone.now() + timedelta(hours=2))
    redis_queue_settings.server.flushall()  # Redis restarted empty: the scheduled job is gone
    assert reconcile(stale_after=0).resent == []  # not due yet: left alone
    AgentRun.objects.filter(pk=run.pk).update(not_before=timezone.now() - timedelta(minutes=5),
                                              updated_at=timezone.now() - timedelta(hours=1))
    assert reconcile(stale_after=0).resent == [str(run.pk)]
    assert dispatch.job_pending(run.pk, 2)  # in the queue itself now, for the next worker


def test_a_worker_with_the_scheduler_runs_it_at_its_time_once(rq_worker: Any, counter: Path) -> None:
    rq_worker(extra_args=SCHEDULER)
    at = timezone.now() + timedelta(seconds=4)
    run = Bumper.run_later("go", permissions="auto", at=at)
    time.sleep(1.5)
    assert AgentRun.objects.get(pk=run.pk).status == "queued"
    done = wait_done(run)
    assert done.status == "done", done.error
    started = done.events.filter(type="claimed").values_list("created_at", flat=True).first() or done.updated_at
    assert started >= at
    assert count(counter) == ["one"]


def test_a_scheduled_job_survives_a_worker_restart_and_runs_once(rq_worker: Any, counter: Path) -> None:
    workers = rq_worker(extra_args=SCHEDULER)
    run = Bumper.run_later("go", permissions="auto", at=timezone.now() + timedelta(seconds=5))
    workers.stop()  # the worker (and its scheduler) shut down before the time
    assert scheduled_ids() == [dispatch.job_id(run.pk, 1)]
    rq_worker(extra_args=SCHEDULER)  # another one, later
    done = wait_done(run)
    assert done.status == "done", done.error
    time.sleep(2)
    assert count(counter) == ["one"]
    assert scheduled_ids() == []


def test_rqs_cron_ticks_the_schedules_and_two_cron_schedulers_give_one_run_per_slot(
        rq_worker: Any, redis_queue_settings: Any, settings: Any, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    settings.NEXO = {**settings.NEXO, "SCHEDULE_TICK": 1}
    rq_worker(count=2)
    now = timezone.now()
    make(name="every-minute", cron="* * * * *", now=now - timedelta(minutes=1, seconds=1))
    crons = []

    env = _worker_env(request, redis_queue_settings)
    for n in range(2):
        with (tmp_path / f"cron-{n}.log").open("wb") as log:
            crons.append(subprocess.Popen(
                [sys.executable, "-m", "django", "rqcron", "nexo_django.durable.schedule_cron"],
                env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        first = wait_until(lambda: ScheduleSlot.objects.filter(outcome="started").first(), timeout=60,
                           what="rq's cron to tick the schedule")
        run = wait_done(AgentRun.objects.get(pk=first.run_id))
        assert run.status == "done", run.error
        time.sleep(3)  # several more ticks of both cron schedulers
    finally:
        for proc in crons:
            proc.terminate()
        for proc in crons:
            proc.wait(10)
    slots = list(ScheduleSlot.objects.filter(outcome="started").values_list("slot", flat=True))
    assert len(slots) == len(set(slots)) == AgentRun.objects.count()
    logs = "".join((tmp_path / f"cron-{n}.log").read_text() for n in range(2))
    assert "tick_schedules" in logs, logs



def test_a_run_at_a_time_whose_worker_was_killed_runs_once_under_the_next(rq_worker: Any, counter: Path) -> None:
    """SIGKILL, as a lost machine: the scheduled job stays in Redis, but the dead worker's scheduler
    lock stays too, until its TTL (rq: the scheduler's interval + 60 s), and rq's other workers try
    to take it again every 10 minutes. The database knows the run's time: once it is due (and the
    grace passed) the reconciler sends its job to the queue, and the next worker runs it once. The
    old scheduled job, moved later, finds the run done."""
    workers = rq_worker(extra_args=SCHEDULER)
    time.sleep(1.5)  # its scheduler has taken the queue's lock
    at = timezone.now() + timedelta(seconds=3)
    run = Bumper.run_later("go", permissions="auto", at=at)
    workers.kill(0)
    assert scheduled_ids() == [dispatch.job_id(run.pk, 1)]
    rq_worker(extra_args=SCHEDULER)
    assert reconcile(stale_after=1).resent == []  # not due yet: left alone
    wait_until(lambda: timezone.now() > at + timedelta(seconds=1.5), timeout=10, what="the run's time")
    assert reconcile(stale_after=1).requeued == [str(run.pk)]  # its job is still "scheduled": sent now
    done = wait_done(run)
    assert done.status == "done", done.error
    assert count(counter) == ["one"]
    assert scheduled_ids() == [dispatch.job_id(run.pk, 1)]  # the old job, harmless: the run is done
