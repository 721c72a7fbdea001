"""Is anyone listening? Queued runs that age on a queue no rq worker listens on wait forever, so
the reconciler, the run pages and a system check say so (with the command that fixes it).

An inline queue (``"ASYNC": False``) needs no worker: nothing here touches Redis for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Min, Q
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from ..core.errors import ConfigurationError
from ..models import AgentRun, RunStatus
from . import dispatch

#: A run queued for longer than this (seconds since its last change) counts as waiting.
WAITING_AFTER = 60


@dataclass(frozen=True)
class QueueWarning:
    queue: str
    waiting: int  # queued runs older than the threshold
    oldest: datetime
    unreachable: str | None = None  # why Redis could not be asked, if it could not

    def __str__(self) -> str:
        age = timezone.now() - self.oldest
        minutes = max(1, int(age.total_seconds() // 60))
        head = f"{self.waiting} run(s) have waited in queue {self.queue!r} for up to {minutes} min"
        if self.unreachable:
            return f"{head}, and Redis cannot be asked whether a worker listens: {self.unreachable}"
        return (
            f'{head} and no rq worker listens on it. Start one on the queue NEXO["QUEUE"] names: '
            f"`python manage.py rqworker {self.queue}` (a worker on another queue never sees these runs)."
        )


def due_before(cutoff: datetime) -> Q:
    """Runs due before ``cutoff``: all but those started with ``run_later(at=...)`` for a later
    time (their job waits in rq's scheduled registry, not in the queue)."""
    return Q(not_before__isnull=True) | Q(not_before__lt=cutoff)


def waiting_runs(*, now: datetime | None = None, after: float = WAITING_AFTER) -> tuple[int, datetime | None]:
    """How many runs are queued since longer than ``after`` seconds, and the oldest change among them."""
    cutoff = (now or timezone.now()) - timedelta(seconds=after)
    found = AgentRun.objects.filter(due_before(cutoff), status=RunStatus.QUEUED, updated_at__lt=cutoff).aggregate(
        # A run started with run_later(at=...) has waited since its time, not since it was stored.
        n=Count("pk"), oldest=Min(Greatest("updated_at", Coalesce("not_before", "updated_at")))
    )
    return int(found["n"]), found["oldest"]


def queue_warning(
    *, now: datetime | None = None, after: float = WAITING_AFTER, run: AgentRun | None = None
) -> QueueWarning | None:
    """A warning when runs (or just ``run``) wait on the run queue and no worker listens on it;
    None when nothing waits, the queue is inline, or a worker listens."""
    try:
        if dispatch.is_inline():
            return None
    except ConfigurationError:
        return None  # a queue missing from RQ_QUEUES: check E003 says so
    now = now or timezone.now()
    if run is not None:
        cutoff = now - timedelta(seconds=after)
        if run.status != RunStatus.QUEUED or run.updated_at >= cutoff or (run.not_before is not None and run.not_before >= cutoff):
            return None
        waiting, oldest = 1, max(run.updated_at, run.not_before or run.updated_at)
    else:
        waiting, found = waiting_runs(now=now, after=after)
        if found is None:
            return None
        oldest = found
    try:
        if dispatch.workers_listening():
            return None
    except ConnectionError as exc:
        return QueueWarning(dispatch.queue_name(), waiting, oldest, unreachable=str(exc))
    return QueueWarning(dispatch.queue_name(), waiting, oldest)
