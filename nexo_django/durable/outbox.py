"""The transactional outbox: every notice to a channel (``NEXO["CHANNELS"]``) is a ``Notice`` row
written in the transaction of the change that causes it, then delivered, with retries.

Written by: the suspending commit of a run (``approval.requested``, one per waiting call and
channel: :func:`on_close`, a step of the journal's batch), a decision's batch
(``approval.decided`` / ``approval.expired``: :func:`on_decided`), the closing commit of a run that
ends (``run.done`` / ``run.failed``), a cancel's (``run.cancelled``), a workflow's question asked, answered
or expired (``question.*``: :func:`on_question`), and the reconciler (``approval.reminder``). So a notice exists
if and only if its change committed: none is lost when Redis, the worker or the receiver is down.

Delivered by: a job sent at commit (:func:`wake`: an rq job, or inline at commit on an inline
queue) and by the reconciler (:func:`deliver_due`), whichever comes first. Each delivery claims the
notice first (a compare-and-set that pushes ``next_attempt_at`` past the send's time), so a notice
is sent by one process at a time; a failure is retried with exponential backoff (``BACKOFF`` seconds
doubled per attempt, at most an hour; a receiver's ``Retry-After`` is honoured) until
``MAX_ATTEMPTS``, then the notice is ``failed`` with its last error (the admin lists it and can send
it again). A process that dies between the send and its record leaves the claim to expire, and the
notice is sent again **with the same idempotency key** (``Notice.key``): a receiver that honours the
key sees it once.

The channels themselves are named, not imported (``BACKENDS`` or a dotted path): this layer calls
the class the setting names, as :mod:`dispatch` names its jobs.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F, Q, QuerySet
from django.utils import timezone
from django.utils.module_loading import import_string

from ..conf import nexo_settings
from ..core.errors import ConfigurationError, NexoError
from ..models import (
    AgentRun,
    CallStatus,
    Notice,
    NoticeStatus,
    RunStatus,
    StepKind,
    StepStatus,
    ToolCall,
    WorkflowStep,
)
from . import dispatch

log = logging.getLogger("nexo_django.outbox")

#: every kind of notice, in the order of a call's life
KINDS = ("approval.requested", "approval.reminder", "approval.escalated", "approval.progress", "approval.decided",
         "approval.expired", "run.done", "run.failed", "run.cancelled", "question.asked", "question.reminder",
         "question.answered", "question.expired", "schedule.paused")
#: the channels the app ships, by their short name in ``BACKEND``
BACKENDS = {
    "slack": "nexo_django.channels.slack.SlackChannel",
    "webhook": "nexo_django.channels.webhook.WebhookChannel",
}
#: the channel of NOTIFY["EMAIL"] (a name no configured channel may take)
EMAIL = "email"
EMAIL_BACKEND = "nexo_django.durable.email_channel.EmailNotices"
#: options every channel takes, and their defaults
COMMON: dict[str, Any] = {"BACKEND": None, "EVENTS": list(KINDS), "MAX_ATTEMPTS": 12, "BACKOFF": 5, "REMIND_AFTER": None}
#: how long one delivery may take before another process may claim the notice again
CLAIM = timedelta(seconds=60)
MAX_DELAY = timedelta(hours=1)
#: notices a reconciler round delivers at most, for about this long, taking this many at a time
ROUND = 500
ROUND_SECONDS = 30.0
CHUNK = 50
COLUMNS = ("channel", "kind", "key", "run_id", "tool_call_id", "payload", "status", "attempts", "next_attempt_at",
           "claim", "last_error", "created_at")


class DeliveryFailed(NexoError):
    """A channel could not deliver a notice now; it is tried again (after ``retry_after`` seconds
    when the receiver said so)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NothingToSay(NexoError):
    """A channel has nothing to deliver for this notice (e.g. the request of a call decided before
    it was announced): the notice is ``skipped``, with this reason."""


class Refused(NexoError):
    """A request from outside failed a channel's verification; nothing of it was read."""


# --- configuration ---------------------------------------------------------------------------


def configured() -> dict[str, dict[str, Any]]:
    """``NEXO["CHANNELS"]`` with the common defaults filled in (the checks say what is wrong)."""
    given = nexo_settings.CHANNELS
    found = {name: {**COMMON, **options} for name, options in (given if isinstance(given, dict) else {}).items()
             if isinstance(options, dict)}
    notify = nexo_settings.NOTIFY
    if isinstance(notify, dict) and notify.get("EMAIL"):
        # The approvers' emails (durable/notify.py): one per suspension, listing its calls.
        found[EMAIL] = {**COMMON, "BACKEND": EMAIL_BACKEND, "EVENTS": ["approval.requested", "approval.reminder",
                                                                      "approval.escalated", "question.asked",
                                                                      "question.reminder", "schedule.paused"],
                        "GROUPED": True, "REMIND_AFTER": notify.get("REMIND_AFTER")}
    return found


def backend_path(options: dict[str, Any]) -> str:
    backend = options.get("BACKEND")
    if not isinstance(backend, str) or not backend:
        raise ConfigurationError('each NEXO["CHANNELS"] entry needs "BACKEND": "slack", "webhook" or a dotted path')
    return BACKENDS.get(backend, backend)


_instances: dict[tuple[str, str], Any] = {}


def channel(name: str) -> Any:
    """The channel object named ``name`` in ``NEXO["CHANNELS"]`` (``LookupError`` if none is)."""
    options = configured().get(name)
    if options is None:
        raise LookupError(f'no channel {name!r} in NEXO["CHANNELS"]')
    key = (name, repr(sorted(options.items(), key=lambda kv: kv[0])))
    found = _instances.get(key)
    if found is None:
        try:
            cls = import_string(backend_path(options))
        except ImportError as exc:
            raise ConfigurationError(f'NEXO["CHANNELS"][{name!r}]["BACKEND"]: cannot import it ({exc})') from exc
        found = _instances[key] = cls(name, options)
    return found


def listening(kind: str, channels: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """The channels (of ``channels``, by default :func:`configured`) that listen to ``kind``."""
    channels = configured() if channels is None else channels
    return [name for name, options in channels.items() if kind in (options.get("EVENTS") or ())]


# --- writing ---------------------------------------------------------------------------------


def notice_key(channel: str, kind: str, run_id: Any, subject: str = "") -> str:
    """``kind:run:subject:channel``; a subject that would make it too long is hashed."""
    if len(subject) > 64:
        subject = "h" + hashlib.sha256(subject.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{kind}:{run_id}:{subject}:{channel}"[:255]


def rows(kind: str, run_id: Any, call_ids: Sequence[str], now: datetime, payload: dict[str, Any] | None = None,
         subject: str | None = None) -> list[tuple[Any, ...]]:
    """The rows of ``kind`` for every channel that listens to it: one per call (or one for the
    run when ``call_ids`` is empty)."""
    found: list[tuple[Any, ...]] = []
    channels = configured()
    for name in listening(kind, channels):
        if channels[name].get("GROUPED") and len(call_ids) > 1:
            # One notice for every call of the turn (an email listing them), keyed by the first.
            key = notice_key(name, kind, run_id, call_ids[0])
            grouped = {**(payload or {}), "calls": list(call_ids)}
            found.append((name, kind, key, run_id, call_ids[0], grouped, NoticeStatus.PENDING, 0, now, "", "", now))
            continue
        for call_id in call_ids or [""]:
            key = notice_key(name, kind, run_id, subject if subject is not None else call_id)
            found.append((name, kind, key, run_id, call_id, payload or {}, NoticeStatus.PENDING, 0, now, "", "", now))
    return found


def wake(keys: Sequence[str]) -> None:
    """Deliver the notices ``keys`` once the current transaction commits (their job)."""
    if keys:
        dispatch.enqueue_notices(list(keys))


def on_close(batch: Any, run: AgentRun, status: str, pending: Sequence[ToolCall], now: datetime) -> list[str]:
    """Add the notices of a run's closing commit to its batch: a request per call that starts
    waiting, or the run's end. The keys, to :func:`wake` once the batch committed."""
    if status == "suspended":
        # None for a suspension on an MCP server's questions alone (their notices: durable.elicitation).
        found = rows("approval.requested", run.pk, [c.tool_call_id for c in pending], now) if pending else []
    elif status in ("done", "failed", "cancelled"):
        found = rows(f"run.{status}", run.pk, [], now, subject=end_subject(status))
    else:
        return []
    if found:
        batch.insert(Notice, COLUMNS, found)
    return [r[2] for r in found]


def end_subject(status: str) -> str:
    """A failed run may be retried and fail again: each failure is a notice of its own."""
    return "" if status == "done" else uuid.uuid4().hex[:12]


def on_ended(run_id: Any, status: str, now: datetime) -> list[str]:
    """Write the notices of a run's end (``run.done`` / ``run.failed``) inside the transaction
    that ends it (a workflow's pass), and deliver them once it commits."""
    keys = write(f"run.{status}", run_id, now, subject=end_subject(status))
    wake(keys)
    return keys


def on_decided(batch: Any, call: ToolCall, source: str, now: datetime) -> list[str]:
    """Add the notices of a decision to its batch (written only if the decision is)."""
    kind = "approval.expired" if source == "expiry" else "approval.decided"
    found = rows(kind, call.run_id, [call.tool_call_id], now, {"source": source})
    if found:
        batch.insert(Notice, COLUMNS, found)
    return [r[2] for r in found]


def write(kind: str, run_id: Any, now: datetime, *, payload: dict[str, Any] | None = None,
          subject: str | None = None, once: bool = False) -> list[str]:
    """Write a run's notice of ``kind`` now (inside the caller's transaction: with its change);
    ``once``: a notice of the same key written before is kept as it is."""
    found = rows(kind, run_id, [], now, payload, subject)
    if found:
        Notice.objects.bulk_create([Notice(**dict(zip(COLUMNS, r, strict=True))) for r in found], ignore_conflicts=once)
    return [r[2] for r in found]


def on_schedule_paused(schedule: Any, reason: str, run_id: Any, now: datetime) -> list[str]:
    """Write the notices of a schedule paused (its runs failed in a row, or what it names no longer
    imports) inside the transaction that pauses it, and deliver them once it commits. ``run_id``:
    the last failed run, if any (the notice links it)."""
    payload = {"schedule": schedule.pk, "name": schedule.name, "target": schedule.target, "reason": reason[:2000]}
    subject = uuid.uuid4().hex[:12]  # each pause is a notice of its own
    found = [Notice(channel=name, kind="schedule.paused", run_id=run_id, payload=payload, created_at=now,
                    key=notice_key(name, "schedule.paused", f"schedule-{schedule.pk}", subject), next_attempt_at=now)
             for name in listening("schedule.paused")]
    if found:
        Notice.objects.bulk_create(found)
    keys = [n.key for n in found]
    wake(keys)
    return keys


def on_question(kind: str, step: Any, now: datetime) -> list[str]:
    """Write the notices of a workflow's question (``question.asked``, ``.answered``,
    ``.expired``) inside the transaction of that change, and deliver them once it commits."""
    # Once per question and kind: a workflow asks the same question again in each pass that
    # reaches it unanswered (woken early), and it was announced the first time.
    keys = write(kind, step.run_id, now, payload={"step": step.pk, "key": step.name}, subject=step.name, once=True)
    wake(keys)
    return keys


def remind(now: datetime) -> list[str]:
    """The reconciler's reminders: one per channel with ``REMIND_AFTER`` and call (or workflow
    question) still waiting that long (the unique key makes it once, whoever else reminds at the
    same moment)."""
    keys: list[str] = []
    for name, options in configured().items():
        after = options.get("REMIND_AFTER")
        events = options.get("EVENTS") or ()
        if not after:
            continue
        since = now - timedelta(seconds=float(after))
        if "approval.reminder" in events:
            keys += _remind_calls(name, bool(options.get("GROUPED")), since, now)
        if "question.reminder" in events:
            keys += _remind_questions(name, since, now)
    return keys


def _remind_calls(name: str, grouped: bool, since: datetime, now: datetime) -> list[str]:
    waiting = ToolCall.objects.filter(status=CallStatus.PENDING_APPROVAL, created_at__lte=since)
    reminded = set(Notice.objects.filter(channel=name, kind="approval.reminder",
                                         run_id__in=waiting.values("run_id")).values_list("key", flat=True))
    by_run: dict[Any, list[str]] = {}
    for run_id, call_id in waiting.order_by("created_at", "id").values_list("run_id", "tool_call_id")[:ROUND]:
        by_run.setdefault(run_id, []).append(call_id)
    new = []
    for run_id, call_ids in by_run.items():
        for call_id in call_ids[:1] if grouped else call_ids:
            key = notice_key(name, "approval.reminder", run_id, call_id)
            if key not in reminded:
                new.append(Notice(channel=name, kind="approval.reminder", key=key, run_id=run_id,
                                  tool_call_id=call_id, payload={"calls": call_ids} if grouped else {},
                                  next_attempt_at=now, created_at=now))
    if new:
        Notice.objects.bulk_create(new, ignore_conflicts=True)
    return [n.key for n in new]


def _remind_questions(channel: str, asked_before: datetime, now: datetime) -> list[str]:
    """One ``question.reminder`` per workflow question still waiting since ``asked_before``."""
    waiting = (WorkflowStep.objects.filter(kind=StepKind.QUESTION, status=StepStatus.WAITING, created_at__lte=asked_before)
               .order_by("created_at", "id").values_list("pk", "run_id", "name")[:ROUND])
    new = [Notice(channel=channel, kind="question.reminder", key=notice_key(channel, "question.reminder", run_id, name),
                  run_id=run_id, payload={"step": pk, "key": name}, next_attempt_at=now, created_at=now)
           for pk, run_id, name in waiting]
    if not new:
        return []
    reminded = set(Notice.objects.filter(key__in=[n.key for n in new]).values_list("key", flat=True))
    new = [n for n in new if n.key not in reminded]
    Notice.objects.bulk_create(new, ignore_conflicts=True)
    return [n.key for n in new]


# --- delivering ------------------------------------------------------------------------------


def backoff(attempts: int, base: float) -> timedelta:
    return min(timedelta(seconds=float(base) * 2 ** max(attempts - 1, 0)), MAX_DELAY)


def pending_due(now: datetime) -> QuerySet[Notice]:
    """The notices waiting to be sent whose time has come (:func:`deliver_due`'s)."""
    return Notice.objects.filter(status=NoticeStatus.PENDING, next_attempt_at__lte=now)


def claim(where: Q, now: datetime, limit: int = ROUND) -> list[Notice]:
    """Take the due notices matching ``where`` (at most ``limit``), in one statement: each gets
    this delivery's token and a ``next_attempt_at`` past the send's time, so no other process
    takes it meanwhile. The notices taken."""
    token = uuid.uuid4().hex
    due = pending_due(now).filter(where)
    pks = list(due.order_by("next_attempt_at", "id").values_list("pk", flat=True)[:limit])
    if not pks:
        return []
    # The same conditions again: another process may have taken some between the read and this.
    Notice.objects.filter(pk__in=pks, status=NoticeStatus.PENDING, next_attempt_at__lte=now).update(
        claim=token, next_attempt_at=now + CLAIM, attempts=F("attempts") + 1)
    return list(Notice.objects.filter(pk__in=pks, claim=token, status=NoticeStatus.PENDING).order_by("id"))


def asked_delay(retry_after: Any) -> timedelta:
    """The wait a receiver's ``Retry-After`` asks for, at most :data:`MAX_DELAY`; nothing for one
    that is not a finite number of seconds. Capped before it becomes a timedelta: a receiver's
    ``Retry-After: 1e20`` (or ``inf``, ``nan``) raised OverflowError out of the delivery, out of
    the committing caller and out of the reconciler's round."""
    try:
        seconds = float(retry_after)
    except (TypeError, ValueError, OverflowError):
        return timedelta(0)
    if not math.isfinite(seconds) and not seconds > 0:  # nan, -inf
        return timedelta(0)
    return timedelta(seconds=min(max(seconds, 0.0), MAX_DELAY.total_seconds()))


def deliver_one(notice: Notice, now: datetime) -> str:
    """Deliver one notice this process claimed; its status afterwards."""
    mine = Notice.objects.filter(pk=notice.pk, status=NoticeStatus.PENDING, claim=notice.claim)
    try:
        target = channel(notice.channel)
        receipt = target.send(notice)
    except NothingToSay as exc:
        mine.update(status=NoticeStatus.SKIPPED, last_error=str(exc)[:2000], delivered_at=timezone.now())
        return NoticeStatus.SKIPPED
    except Exception as exc:  # a receiver or channel error fails this attempt, never the caller
        options = configured().get(notice.channel, COMMON)
        message = f"{type(exc).__name__}: {exc}"[:2000]
        if notice.attempts >= int(options.get("MAX_ATTEMPTS") or COMMON["MAX_ATTEMPTS"]):
            mine.update(status=NoticeStatus.FAILED, last_error=message)
            log.warning("outbox: %s to %s failed for good after %d attempts: %s", notice.kind, notice.channel,
                        notice.attempts, message)
            return NoticeStatus.FAILED
        delay = backoff(notice.attempts, options.get("BACKOFF") or COMMON["BACKOFF"])
        delay = min(max(delay, asked_delay(getattr(exc, "retry_after", None))), MAX_DELAY)
        mine.update(next_attempt_at=now + delay, last_error=message)
        log.info("outbox: %s to %s failed (attempt %d), again in %s: %s", notice.kind, notice.channel,
                 notice.attempts, delay, message)
        return "retry"
    record_delivered(mine, receipt)
    return NoticeStatus.DELIVERED


def record_delivered(mine: QuerySet[Notice], receipt: Any) -> None:
    """Record a send that succeeded. A process that dies before this (the crash the chaos run and
    the tests cause here) leaves the claim to expire: the notice is sent again with the same key,
    and a Slack post is found by its metadata rather than posted twice."""
    mine.update(status=NoticeStatus.DELIVERED, receipt=receipt, delivered_at=timezone.now(), last_error="")


def deliver(keys: Iterable[str]) -> dict[str, str]:
    """Deliver the notices ``keys`` that are due (the job sent at commit)."""
    keys = list(keys)
    now = timezone.now()
    found: dict[str, str] = {}
    for start in range(0, len(keys), ROUND):
        for notice in claim(Q(key__in=keys[start:start + ROUND]), now):
            found[notice.key] = deliver_one(notice, now)
    return found


def deliver_due(now: datetime | None = None, limit: int = ROUND, budget: float = ROUND_SECONDS) -> dict[str, str]:
    """The reconciler's part: the pending notices whose time has come, up to ``limit`` and for
    about ``budget`` seconds (claimed a few at a time: receivers that hang until their timeout
    hold up one round that long, not the whole backlog's worth)."""
    now = now or timezone.now()
    stop = time.monotonic() + budget
    found: dict[str, str] = {}
    while len(found) < limit and time.monotonic() < stop:
        taken = claim(Q(), now, min(CHUNK, limit - len(found)))
        if not taken:
            break
        for notice in taken:
            found[notice.key] = deliver_one(notice, now)
    return found


#: old notices the reconciler deletes at most per round
PURGE_ROUND = 1000
#: the statuses of a run whose messages may still be updated
LIVE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SUSPENDED)


def purgeable(now: datetime) -> QuerySet[Notice]:
    """The delivered and skipped notices older than ``NEXO["NOTICES_KEEP_DAYS"]`` whose run has
    finished (a live run's messages may still be updated from their receipts); none if the
    setting is None (kept for ever)."""
    days = nexo_settings.NOTICES_KEEP_DAYS
    if days is None:
        return Notice.objects.none()
    # next_attempt_at: the last claim's time, after the notice was written; the due index covers it.
    return (Notice.objects.filter(status__in=(NoticeStatus.DELIVERED, NoticeStatus.SKIPPED),
                                  next_attempt_at__lt=now - timedelta(days=int(days)))
            .exclude(run__status__in=LIVE).order_by())


def purge(now: datetime) -> int:
    """The reconciler's part: delete the :func:`purgeable` notices (failed ones stay for a
    person). How many went."""
    ids = list(purgeable(now).values_list("id", flat=True)[:PURGE_ROUND])
    return Notice.objects.filter(id__in=ids).delete()[0] if ids else 0


def retry(notices: Iterable[Notice]) -> int:
    """Send failed (or skipped) notices again, from the first attempt (the admin's action)."""
    pks = [n.pk for n in notices]
    now = timezone.now()
    updated = Notice.objects.filter(Q(status=NoticeStatus.FAILED) | Q(status=NoticeStatus.PENDING), pk__in=pks).update(
        status=NoticeStatus.PENDING, attempts=0, next_attempt_at=now
    )
    keys = list(Notice.objects.filter(pk__in=pks, status=NoticeStatus.PENDING).values_list("key", flat=True))
    wake(keys)
    return updated
