"""The outbox's built-in ``email`` channel (``NEXO["NOTIFY"]["EMAIL"]``): a notice of calls waiting
or of a workflow's question becomes emails to the people who may decide (:mod:`.notify`, the one
module of notices' text)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from ..models import CallStatus, StepStatus, ToolCall, WorkflowStep
from . import notify, schedule_notices, workflow_questions
from .outbox import DeliveryFailed, NothingToSay
from .policy import reviewer


class EmailNotices:
    """What :mod:`nexo_django.durable.outbox` calls to deliver a notice of ``NOTIFY["EMAIL"]``."""

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        self.name = name
        self.options = options

    def send(self, notice: Any) -> dict[str, Any]:
        if notice.kind == schedule_notices.KIND:
            return {"sent": schedule_notices.send_email(notice)}
        if notice.kind in ("question.asked", "question.reminder"):
            return self._question(notice)
        reminder = notice.kind == "approval.reminder"
        ids = (notice.payload or {}).get("calls") or [notice.tool_call_id]
        calls = list(ToolCall.objects.filter(run_id=notice.run_id, tool_call_id__in=ids,
                                             status=CallStatus.PENDING_APPROVAL).select_related("run")
                     .order_by("created_at", "id"))
        if not calls:
            raise NothingToSay("no call of it waits for a decision any more")
        if notice.kind == "approval.requested" and not all(reviewer.before_notice(c) for c in calls):
            raise DeliveryFailed("the reviewer agent is still reviewing a call of it", retry_after=2)
        escalated = notice.kind == "approval.escalated"  # to the escalation groups (durable.policy.escalation)
        sent = notify.send_emails(calls[0].run, calls, reminder=reminder, escalated=escalated)
        if escalated:
            return {"sent": sent}
        field = "reminded_at" if reminder else "notified_at"
        ToolCall.objects.filter(pk__in=[c.pk for c in calls], **{field: None}).update(**{field: timezone.now()})
        return {"sent": sent}

    def _question(self, notice: Any) -> dict[str, Any]:
        step = workflow_questions.step_of(notice)
        if step is None or step.status != StepStatus.WAITING:
            raise NothingToSay("the question was answered or ended before it was emailed")
        sent = notify.send_question_emails(step, reminder=notice.kind == "question.reminder")
        if notice.kind == "question.asked":
            WorkflowStep.objects.filter(pk=step.pk, notified_at=None).update(notified_at=timezone.now())
        return {"sent": sent}
