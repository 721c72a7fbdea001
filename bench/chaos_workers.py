"""rq worker classes for bench/chaos.py: a worker that may be killed right after it took a job.

While the file named by NEXO_CHAOS_DIE_FILE exists, a worker SIGKILLs itself, with the
probability written in that file, right after it dequeued a job and before the job runs: the
job is gone from the queue, and no one will run it. (Killing workers from outside rarely lands
in that window.) With the probability in the file NEXO_CHAOS_BOUNDARY_FILE names, it dies at a workflow's step boundary (right after a
step's record committed: ``crash_point("workflow_step_recorded")``) and between a notice's send
and its record (``outbox.record_delivered``: a Slack post made, its receipt not written).
"""

from __future__ import annotations

import os
import random
import signal
from typing import Any

from rq.worker import SimpleWorker, Worker


def maybe_die() -> None:
    _install()
    path = os.environ.get("NEXO_CHAOS_DIE_FILE")
    if not path:
        return
    try:
        with open(path) as f:
            rate = float(f.read().strip() or 0)
    except (OSError, ValueError):
        return
    if random.random() < rate:
        os.kill(os.getpid(), signal.SIGKILL)


_installed = False


def _install() -> None:
    """Wrap the workflow's step boundary and the outbox's record in this process (the apps are
    loaded by the time a job runs; a forked work horse inherits it)."""
    global _installed
    if _installed:
        return
    _installed = True
    from nexo_django.durable import outbox, workflow_runs

    boundary, record = workflow_runs.crash_point, outbox.record_delivered

    def at_boundary(name: str) -> None:
        if name == "workflow_step_recorded":
            maybe_die_now("step")
        boundary(name)

    def record_or_die(mine: Any, receipt: Any) -> None:
        maybe_die_now("notice")
        record(mine, receipt)

    workflow_runs.crash_point = at_boundary  # type: ignore[assignment]
    outbox.record_delivered = record_or_die  # type: ignore[assignment]


def maybe_die_now(where: str) -> None:
    """SIGKILL this process with the probability in NEXO_CHAOS_BOUNDARY_FILE (none once it is gone)."""
    path = os.environ.get("NEXO_CHAOS_BOUNDARY_FILE")
    try:
        with open(path or "") as f:
            rate = float(f.read().strip() or 0)
    except (OSError, ValueError):
        return
    if random.random() < rate:
        log = os.environ.get("NEXO_CHAOS_KILL_LOG")
        if log:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, f"{where}\n".encode())
            os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


class DyingWorker(Worker):
    def execute_job(self, job: Any, queue: Any) -> Any:
        maybe_die()
        return super().execute_job(job, queue)


class DyingSimpleWorker(SimpleWorker):
    def execute_job(self, job: Any, queue: Any) -> Any:
        maybe_die()
        return super().execute_job(job, queue)
