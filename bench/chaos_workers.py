"""rq worker classes for bench/chaos.py: a worker that may be killed right after it took a job.

While the file named by NEXO_CHAOS_DIE_FILE exists, a worker SIGKILLs itself, with the
probability written in that file, right after it dequeued a job and before the job runs: the
job is gone from the queue, and no one will run it. (Killing workers from outside rarely lands
in that window.)
"""

from __future__ import annotations

import os
import random
import signal
from typing import Any

from rq.worker import SimpleWorker, Worker


def maybe_die() -> None:
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


class DyingWorker(Worker):
    def execute_job(self, job: Any, queue: Any) -> Any:
        maybe_die()
        return super().execute_job(job, queue)


class DyingSimpleWorker(SimpleWorker):
    def execute_job(self, job: Any, queue: Any) -> Any:
        maybe_die()
        return super().execute_job(job, queue)
