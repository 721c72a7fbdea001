"""The reconciler: brings runs back from the database alone after a worker or Redis was lost.

Run it on a schedule (``manage.py nexo_reconcile``). It is safe to run on several machines at once:
every change is a compare-and-set.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from ..conf import nexo_settings
from ..models import (
    AgentRun,
    CallStatus,
    RunEvent,
    RunKind,
    RunMessage,
    RunStatus,
    ToolCall,
    WorkflowStep,
)
from . import dispatch, outbox, parents, probe, workflow_questions, workflow_runs
from .expiry import expire_overdue, overdue_calls
from .policy import escalation, reviewer
from .queue_health import due_before, queue_warning
from .runs import transition, wake

__all__ = ["Report", "reconcile"]

if TYPE_CHECKING:
    from django.db.models import QuerySet

log = logging.getLogger("nexo_django.recovery")


@dataclass
class Report:
    requeued: list[str] = field(default_factory=list)
    needs_attention: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)
    #: the run of each call expired without a decision; the outbox's requests and reminders delivered
    expired: list[str] = field(default_factory=list)
    notified: int = 0
    reminded: int = 0
    #: notices of the outbox delivered this round
    delivered: int = 0
    #: Problems a person must fix, e.g. no worker listening on the run queue.
    warnings: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        text = (
            f"requeued={len(self.requeued)} needs_attention={len(self.needs_attention)} "
            f"failed={len(self.failed)} resent={len(self.resent)}"
        )
        lifecycle = {"expired": len(self.expired), "notified": self.notified, "reminded": self.reminded,
                     "delivered": self.delivered}
        return " ".join([text, *(f"{k}={v}" for k, v in lifecycle.items() if v)])


#: The suspended runs a round looks at are those with a call that changed this recently (at least
#: ten rounds' worth); ``reconcile(full=True)`` looks at every suspended run.
RECENT = timedelta(hours=1)
BATCH = 500


def reconcile(
    *, now: datetime | None = None, stale_after: float | None = None, full: bool = False,
    log_warnings: bool = True,
) -> Report:
    """Recover runs whose worker died (expired lease), whose job will never claim them (queued,
    and their job is not waiting in Redis: lost, taken by a killed worker, failed), or that were
    left suspended with nothing pending; expire calls past their approval deadline; email the
    notices and reminders due (``NEXO["NOTIFY"]``). A round reads only the runs that may need it
    (indexed), so its cost does not grow with the number of suspended or finished runs. Warnings
    are in ``Report.warnings`` and, unless ``log_warnings=False`` (a caller that shows them itself,
    such as ``manage.py nexo_reconcile``), logged to ``nexo_django.recovery``."""
    now = now or timezone.now()
    report = Report()
    grace = timedelta(seconds=stale_after if stale_after is not None else int(nexo_settings.LEASE_SECONDS))
    since = None if full else now - max(RECENT, 10 * grace)
    expired = expired_leases(now)
    queued = _queued_before(now - grace)
    # One statement first: which parts have anything to look at (on a healthy installation, none).
    steps, children = workflow_runs.changed_since(since) if since is not None else (None, None)
    due = probe.existing({
        "expired": expired, "overdue": overdue_calls(now), "questions": workflow_questions.overdue_questions(now),
        "notices": outbox.pending_due(now), "purge": outbox.purgeable(now), "queued": queued,
        "policy": escalation.to_look_at(),
        "calls": None if since is None else _changed_calls(since), "steps": steps, "children": children,
    })
    if due["expired"]:
        for run in expired:
            _recover_expired(run, now, report)
    # Calls past their deadline are expired (a decision each: their runs wake as decisions do).
    report.expired = (expire_overdue(now) if due["overdue"] else []) + (
        workflow_questions.expire_questions(now) if due["questions"] else [])
    # What those did (notices, calls changed, runs ended) is not in the probe: after any of them,
    # every later part looks for itself, as without the probe.
    acted = due["expired"] or due["overdue"] or due["questions"]
    # The outbox: reminders due, then every notice whose time has come (a receiver was down, the
    # job was lost with Redis, a worker died mid-send): emails to the approvers included.
    # And the calls an approval policy escalates (durable.policy.escalation): told to its groups.
    reminded = outbox.remind(now)
    if due["policy"]:  # calls an approval policy routes: reviewed, escalated when due (durable.policy)
        reviewer.review_due(now)
        reminded += escalation.escalate_due(now)
    if due["notices"] or acted or reminded:
        _count_deliveries(outbox.deliver_due(now), report)
    if due["purge"] or acted:
        outbox.purge(now)
    if due["queued"] or acted:
        _resend_lost_jobs(queued, report)
    if due["calls"] or acted:
        _wake_forgotten(since, report)
    if due["steps"] or due["children"] or acted:
        report.requeued += workflow_runs.wake_forgotten(since)
    _warn_if_nobody_listens(report, now, log_warnings)
    if report.requeued or report.needs_attention or report.failed or report.resent or report.expired:
        log.info("reconcile: %s", report)
    return report


def _count_deliveries(statuses: dict[str, str], report: Report) -> None:
    delivered = [key for key, status in statuses.items() if status == "delivered"]
    report.delivered = len(delivered)
    report.notified = sum(1 for key in delivered if key.startswith("approval.requested:"))
    report.reminded = sum(1 for key in delivered if key.startswith("approval.reminder:"))


def expired_leases(now: datetime) -> QuerySet[AgentRun]:
    """The running runs whose lease had expired at ``now``: their worker is gone."""
    return AgentRun.objects.filter(status=RunStatus.RUNNING, lease_expires_at__lt=now).order_by()


def _queued_before(before: datetime) -> QuerySet[AgentRun]:
    """The runs queued since before ``before``: their job should have claimed them by now. A run
    started with ``run_later(at=...)`` counts from its time: until then its job waits in rq's
    scheduled registry, and a job Redis lost is sent again once the run is due."""
    return AgentRun.objects.filter(due_before(before), status=RunStatus.QUEUED, updated_at__lt=before).order_by()


def _changed_calls(since: datetime) -> QuerySet[ToolCall]:
    """The calls changed since ``since``: only such a call can have left its run with nothing
    pending (:func:`_wake_forgotten`)."""
    return ToolCall.objects.filter(updated_at__gte=since).order_by()


def _resend_lost_jobs(queued: QuerySet[AgentRun], report: Report) -> None:
    from redis.exceptions import RedisError

    for run in queued:
        try:
            if dispatch.job_pending(run.pk, run.generation):
                continue
            status = dispatch.job_status(run.pk, run.generation)
        except (RedisError, OSError) as exc:
            log.warning("reconcile: Redis is unreachable (%s); queued runs are checked next round", exc)
            return
        with transaction.atomic():
            if status in (None, "started"):
                # Lost with Redis (flushed, restarted empty), never sent, or taken by a worker that
                # has not claimed the run by now: it may have been killed (a SimpleWorker leaves its
                # job "started"), or be slow; a second job is safe, the claim is a compare-and-set.
                if _new_job(run):
                    report.resent.append(str(run.pk))
            else:
                # The job ended without claiming the run (claimed by its first commit): its work
                # horse died, or it failed (the database was down). A recovery, counted like an
                # expired lease, so a run that kills every worker before its first commit gives up.
                _recover_queued(run, report)


def _new_job(run: AgentRun, **fields: object) -> bool:
    """A new generation, so a new job id: the old job stays as it is. Should it run after all,
    it finds the run claimed (or its generation gone) and does nothing."""
    if not AgentRun.objects.filter(pk=run.pk, status=RunStatus.QUEUED, generation=run.generation).update(
        generation=F("generation") + 1, updated_at=timezone.now(), **fields
    ):
        return False
    dispatch.enqueue_run(run.pk, run.generation + 1)
    return True


def _recover_queued(run: AgentRun, report: Report) -> None:
    recoveries = _count_recovery(run, RunStatus.QUEUED, report)
    if recoveries is not None and _new_job(run, recoveries=recoveries):
        report.requeued.append(str(run.pk))


def _count_recovery(run: AgentRun, status: str, report: Report) -> int | None:
    """Record one recovery of ``run`` (in ``status``) and return its new count, or give the run up
    (failed, None) after ``MAX_RECOVERIES`` in a row. Only recoveries without progress count: a
    long run whose workers are killed now and then, but that gets further each time, goes on."""
    messages = RunMessage.objects.filter(run_id=run.pk).count()
    if run.kind == RunKind.WORKFLOW:  # a workflow's progress is its recorded steps
        messages += WorkflowStep.objects.filter(run_id=run.pk).count()
    last = (
        RunEvent.objects.filter(run_id=run.pk, type="recovered").order_by("-id").values_list("data", flat=True).first()
    )
    streak = run.recoveries
    if isinstance(last, dict) and isinstance(last.get("messages"), int) and messages > last["messages"]:
        streak = 0
    if streak >= int(nexo_settings.MAX_RECOVERIES):
        if transition(run, status, RunStatus.FAILED, finished_at=timezone.now(),
                      error=f"gave up after {streak} recoveries without progress: the worker running it kept dying"):
            RunEvent.objects.create(run_id=run.pk, type="gave_up", data={"recoveries": streak})
            parents.child_ended(run)
            report.failed.append(str(run.pk))
        return None
    RunEvent.objects.create(run_id=run.pk, type="recovered", data={"recoveries": streak + 1, "messages": messages})
    return streak + 1


def _wake_forgotten(since: datetime | None, report: Report) -> None:
    pending = ToolCall.objects.filter(run=OuterRef("pk"), status=CallStatus.PENDING_APPROVAL)
    # Workflow runs wait for their steps, not for calls: workflow_runs.wake_forgotten.
    suspended = AgentRun.objects.filter(status=RunStatus.SUSPENDED, kind=RunKind.AGENT).exclude(Exists(pending)).order_by()
    if since is None:
        batches: Iterable[QuerySet[AgentRun]] = [suspended]
    else:
        # Only a call that left pending_approval can leave a run with nothing pending: look at
        # the runs of the calls that changed lately (an index), not at every suspended run. The
        # ids are read first: given a subquery, SQLite walks every suspended run instead.
        # (No DISTINCT either: SQLite would rather walk another index in run order for it.)
        recent = sorted(set(_changed_calls(since).values_list("run_id", flat=True)))
        batches = (suspended.filter(pk__in=recent[i : i + BATCH]) for i in range(0, len(recent), BATCH))
    for batch in batches:
        for run in batch:
            with transaction.atomic():
                if wake(run, RunStatus.SUSPENDED, unless_pending=True):
                    report.requeued.append(str(run.pk))


def _recover_expired(run: AgentRun, now: datetime, report: Report) -> None:
    with transaction.atomic():
        # Take the run from the dead worker: clearing the lease fences off any late write of its.
        # The expiry is checked again here: a heartbeat may have renewed it since the run was read.
        if not AgentRun.objects.filter(
            pk=run.pk, status=RunStatus.RUNNING, lease_owner=run.lease_owner, lease_expires_at__lt=now
        ).update(lease_owner=None, updated_at=timezone.now()):
            return
        executing = list(ToolCall.objects.filter(run_id=run.pk, status=CallStatus.EXECUTING))
        unsafe = [c for c in executing if not c.idempotent]
        safe = [c for c in executing if c.idempotent]
        if safe:
            ToolCall.objects.filter(pk__in=[c.pk for c in safe]).update(status=CallStatus.APPROVED)
        if unsafe:
            ToolCall.objects.filter(pk__in=[c.pk for c in unsafe]).update(status=CallStatus.OUTCOME_UNKNOWN)
            names = ", ".join(f"{c.name} ({c.tool_call_id})" for c in unsafe)
            transition(run, RunStatus.RUNNING, RunStatus.NEEDS_ATTENTION,
                       error=f"the worker stopped while {names} ran; its outcome is unknown and it was not "
                       "run again. A person must decide.")
            RunEvent.objects.create(run_id=run.pk, type="outcome_unknown", data={"calls": [c.tool_call_id for c in unsafe]})
            report.needs_attention.append(str(run.pk))
            return
        recoveries = _count_recovery(run, RunStatus.RUNNING, report)
        if recoveries is None:
            return
        run.recoveries = recoveries
        AgentRun.objects.filter(pk=run.pk).update(recoveries=recoveries)
        if wake(run, RunStatus.RUNNING):
            report.requeued.append(str(run.pk))


def _warn_if_nobody_listens(report: Report, now: datetime, log_warnings: bool) -> None:
    warning = queue_warning(now=now)
    if warning is not None:
        report.warnings.append(str(warning))
        if log_warnings:
            log.warning("reconcile: %s", warning)
