"""Reaching the approvers about workflows' questions: one email per question, never twice.

With ``NEXO["NOTIFY"]["EMAIL"]`` on, each question waiting for an answer is emailed once to the
people who may answer it (those who may decide calls: :func:`notify.approvers`, the workflow's
starter left out with ``SELF_APPROVAL`` off), with the question (shortened, hidden characters
shown, HTML escaped), its deadline and the absolute link to its answer page. Sent at the
suspension's commit, else by the reconciler; claimed first by a compare-and-set on the step's
``notified_at``, so any number of processes send it once (a failed send gives the claim back).
"""

from __future__ import annotations

import html
import logging
from datetime import datetime, timedelta

from django.core.mail import EmailMultiAlternatives
from django.db import transaction
from django.urls import reverse

from ..display import mark_hidden
from ..models import StepKind, StepStatus, WorkflowStep
from . import notify

log = logging.getLogger("nexo_django.notify")

QUESTION_CHARS = 500
#: How long the reconciler leaves a question to the suspension's own commit-time send.
GRACE = timedelta(seconds=60)


def answer_url(step: WorkflowStep) -> str:
    site = str(notify.options()["SITE_URL"]).rstrip("/")
    return site + reverse("admin:nexo_django_openquestion_change", args=[step.pk])


def message_parts(step: WorkflowStep) -> tuple[str, str, str]:
    workflow = notify.one_line(step.workflow.rsplit(".", 1)[-1])
    key = html.escape(notify.one_line(step.name))
    question = html.escape(notify.short(mark_hidden(step.question, keep="\n"), QUESTION_CHARS))
    url = answer_url(step)
    subject = notify.short(f"{workflow} run {str(step.run_id)[:8]} asks: {notify.one_line(step.name)}", 150)
    deadline = notify.deadline_text(step.expires_at).replace("decides", "answers")
    text = "\n".join([
        f"{workflow} ({html.escape(notify.one_line(step.workflow))}) asks a question ({key}):", "",
        *(f"> {line}" for line in question.splitlines() or [""]), "",
        f"Deadline: {deadline}", f"Answer: {url}", "",
        "The link opens the question's page; nothing is answered until you send its form.",
    ])
    body = (f"<p>{workflow} asks a question ({key}):</p><pre>{question}</pre><p>Deadline: {deadline}</p>"
            f'<p><a href="{html.escape(url)}">Open the question</a></p>'
            "<p>The link opens the question's page; nothing is answered until you send its form.</p>")
    return subject, text, body


def send(step: WorkflowStep, now: datetime) -> int:
    """Claim and send ``step``'s notice; the emails sent."""
    if not WorkflowStep.objects.filter(pk=step.pk, status=StepStatus.WAITING, notified_at=None).update(notified_at=now):
        return 0
    recipients = notify.approvers(step.run)
    email_field = type(recipients[0]).get_email_field_name() if recipients else ""
    subject, text, body = message_parts(step)
    sent = 0
    try:
        with notify.mail_connection() as connection:
            for user in recipients:
                message = EmailMultiAlternatives(subject, text, to=[getattr(user, email_field)])
                message.attach_alternative(body, "text/html")
                sent += connection.send_messages([message]) or 0
    except Exception:  # a mail server down fails neither the run nor the reconciler round
        log.exception("notify: sending the notice of question %s of run %s failed", step.name, step.run_id)
        if not sent:
            WorkflowStep.objects.filter(pk=step.pk, notified_at=now).update(notified_at=None)
    return sent


def on_asked(step: WorkflowStep, now: datetime) -> None:
    """A run suspended on ``step``: its notice goes when the suspension commits."""
    if step.kind == StepKind.QUESTION and notify.enabled():
        transaction.on_commit(lambda: send(step, now))


def reconcile_notices(now: datetime) -> int:
    """The reconciler's part: questions whose notice nobody sent yet."""
    if not notify.enabled():
        return 0
    waiting = (WorkflowStep.objects.filter(kind=StepKind.QUESTION, status=StepStatus.WAITING, notified_at=None,
                                           created_at__lte=now - GRACE)
               .select_related("run").order_by("created_at", "id")[:200])
    return sum(send(step, now) for step in waiting)
