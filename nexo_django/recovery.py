"""The reconciler: brings runs back from the database alone after a worker or Redis was lost.

Run it on a schedule (``manage.py nexo_reconcile``). It is safe to run on several machines at once:
every change is a compare-and-set.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from . import dispatch
from .conf import nexo_settings
from .models import AgentRun, CallStatus, RunEvent, RunStatus, ToolCall
from .runs import transition, wake

log = logging.getLogger("nexo_django.recovery")


@dataclass
class Report:
    requeued: list[str] = field(default_factory=list)
    needs_attention: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)
    #: Problems a person must fix, e.g. no worker listening on the run queue.
    warnings: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"requeued={len(self.requeued)} needs_attention={len(self.needs_attention)} "
            f"failed={len(self.failed)} resent={len(self.resent)}"
        )


def reconcile(*, now: datetime | None = None, stale_after: float | None = None) -> Report:
    """Recover runs whose worker died (expired lease), whose job was lost (queued with no job in
    Redis), or that were left suspended with nothing pending."""
    now = now or timezone.now()
    report = Report()
    expired = AgentRun.objects.filter(status=RunStatus.RUNNING, lease_expires_at__lt=now)
    for run in expired:
        _recover_expired(run, report)
    grace = timedelta(seconds=stale_after if stale_after is not None else int(nexo_settings.LEASE_SECONDS))
    for run in AgentRun.objects.filter(status=RunStatus.QUEUED, updated_at__lt=now - grace):
        status = dispatch.job_status(run.pk, run.generation)
        if status is None:
            with transaction.atomic():
                AgentRun.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(updated_at=timezone.now())
                dispatch.enqueue_run(run.pk, run.generation)
            report.resent.append(str(run.pk))
        elif status not in dispatch.LIVE_JOB_STATUSES:
            # Its job ended and the run is still queued: the worker died (or the job failed)
            # before the run's first commit claimed it. A recovery, like an expired lease.
            _recover_queued(run, report)
    pending = ToolCall.objects.filter(run=OuterRef("pk"), status=CallStatus.PENDING_APPROVAL)
    for run in AgentRun.objects.filter(status=RunStatus.SUSPENDED).exclude(Exists(pending)):
        with transaction.atomic():
            if wake(run, RunStatus.SUSPENDED):
                report.requeued.append(str(run.pk))
    _warn_if_nobody_listens(report, now)
    if report.requeued or report.needs_attention or report.failed or report.resent:
        log.info("reconcile: %s", report)
    return report


def _recover_queued(run: AgentRun, report: Report) -> None:
    with transaction.atomic():
        if run.recoveries >= int(nexo_settings.MAX_RECOVERIES):
            if transition(run, RunStatus.QUEUED, RunStatus.FAILED, finished_at=timezone.now(),
                          error=f"gave up after {run.recoveries} recoveries: the worker running it kept dying"):
                RunEvent.objects.create(run_id=run.pk, type="gave_up", data={"recoveries": run.recoveries})
                report.failed.append(str(run.pk))
            return
        # A new generation: a new job id, so the dead job's record does not hide the new one.
        if not AgentRun.objects.filter(pk=run.pk, status=RunStatus.QUEUED, generation=run.generation).update(
            recoveries=F("recoveries") + 1, generation=F("generation") + 1, updated_at=timezone.now()
        ):
            return
        RunEvent.objects.create(run_id=run.pk, type="recovered", data={"recoveries": run.recoveries + 1})
        dispatch.enqueue_run(run.pk, run.generation + 1)
        report.requeued.append(str(run.pk))


def _warn_if_nobody_listens(report: Report, now: datetime) -> None:
    from .queue_health import queue_warning

    warning = queue_warning(now=now)
    if warning is not None:
        report.warnings.append(str(warning))
        log.warning("reconcile: %s", warning)


def _recover_expired(run: AgentRun, report: Report) -> None:
    with transaction.atomic():
        # Take the run from the dead worker: clearing the lease fences off any late write of its.
        if not AgentRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING, lease_owner=run.lease_owner).update(
            lease_owner=None, updated_at=timezone.now()
        ):
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
        if run.recoveries >= int(nexo_settings.MAX_RECOVERIES):
            transition(run, RunStatus.RUNNING, RunStatus.FAILED, finished_at=timezone.now(),
                       error=f"gave up after {run.recoveries} recoveries: the worker running it kept dying")
            RunEvent.objects.create(run_id=run.pk, type="gave_up", data={"recoveries": run.recoveries})
            report.failed.append(str(run.pk))
            return
        run.recoveries += 1
        AgentRun.objects.filter(pk=run.pk).update(recoveries=run.recoveries)
        RunEvent.objects.create(run_id=run.pk, type="recovered", data={"recoveries": run.recoveries})
        if wake(run, RunStatus.RUNNING):
            report.requeued.append(str(run.pk))
