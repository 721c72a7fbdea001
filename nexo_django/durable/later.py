"""``run_later(..., at=when)``: a run stored now whose job waits in rq's scheduled job registry
until ``when`` (``Queue.enqueue_at``; a worker started with ``--with-scheduler`` moves it to the
queue then). The run's ``not_before`` holds the time in the database, the source of truth: the
reconciler and the queue's health leave the run alone until then, and a job Redis lost is sent
again once it is due."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from ..core.errors import ConfigurationError
from . import dispatch


def not_before(name: str, at: datetime | None, now: datetime | None = None) -> datetime | None:
    """The time a run started by ``name(..., at=at)`` waits for: None for no ``at`` or a time
    already past (the run is sent at commit, as without it). A naive datetime, a value that is
    not a datetime, or a future time on an inline queue (which runs jobs at commit and has no
    scheduler) is refused with the fix."""
    if at is None:
        return None
    if not isinstance(at, datetime):
        raise TypeError(f"{name}(at={at!r}): give a datetime, e.g. timezone.now() + timedelta(hours=1)")
    if timezone.is_naive(at):
        raise ConfigurationError(
            f"{name}(at={at!r}): the datetime has no timezone; give an aware one, e.g. "
            "timezone.now() + timedelta(hours=1) or datetime(..., tzinfo=ZoneInfo('Europe/Berlin'))")
    if at <= (now or timezone.now()):
        return None
    if dispatch.is_inline():
        raise ConfigurationError(
            f"{name}(at=...): the queue {dispatch.queue_name()!r} is inline (\"ASYNC\": False) and runs jobs at "
            "commit, so it cannot wait; point it at Redis and start `manage.py rqworker --with-scheduler`")
    return at
