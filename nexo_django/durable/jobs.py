"""rq job entry points. They take ids only; the database holds everything else."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.db import close_old_connections
from rq.timeouts import UnixSignalDeathPenalty

from ..models import AgentRun
from .journal import JobTimeout, crash_point
from .outbox import deliver
from .runs import execute_run
from .schedules import tick


class RunFailed(Exception):
    """A run's job ends with this when the run failed (``failed``, with why), so that rq files the
    job as failed: the run is then in rq's failed job registry (django-rq's failed jobs), not
    among its finished jobs, and the worker's log says so at ERROR (docs/deployment.md)."""


def continue_run(run_id: str) -> str:
    crash_point("job_started")
    _timeout_fails_the_run()
    # A job is to a worker what a request is to a web server: a SimpleWorker runs every job in
    # one process, and a connection broken by a database restart would fail all later jobs.
    close_old_connections()
    try:
        outcome = execute_run(run_id)
        if outcome == "failed":
            error = AgentRun.objects.filter(pk=run_id).values_list("error", flat=True).first()
            raise RunFailed(f"run {run_id} failed: {error}")
        return outcome
    finally:
        close_old_connections()


def _timeout_fails_the_run() -> None:
    """Under rq's own workers (``rqworker``: ``Worker``, ``SimpleWorker``) a job's timeout is
    SIGALRM raising rq's ``JobTimeoutException``, an ``Exception``: landing in a tool, the tool's
    error handling made it the call's result, and the run went on past its timeout and finished
    as if nothing had happened. The handler rq set for this job is replaced by one raising a
    :class:`JobTimeout` (a ``RunInterrupted``, which nothing swallows) at the same moment: the
    run fails with it, and rq files the job as failed. rq takes its handler away after the job."""
    if threading.current_thread() is not threading.main_thread():
        return  # the concurrent worker's threads have their own (ThreadDeathPenalty)
    penalty = getattr(signal.getsignal(signal.SIGALRM), "__self__", None)
    if not isinstance(penalty, UnixSignalDeathPenalty):
        return
    message = f"the job exceeded its timeout ({penalty._timeout} seconds)"

    def timed_out(signum: int, frame: Any) -> None:
        raise JobTimeout(message)

    signal.signal(signal.SIGALRM, timed_out)


def deliver_notices(keys: list[str]) -> dict[str, str]:
    """Deliver the outbox's notices ``keys`` (sent when the change that wrote them committed)."""
    close_old_connections()
    try:
        return deliver(keys)
    finally:
        close_old_connections()


def tick_schedules() -> str:
    """Fire the schedules whose slot has come (what rq's cron enqueues: ``durable/schedule_cron.py``)."""
    close_old_connections()
    try:
        return str(tick())
    finally:
        close_old_connections()
