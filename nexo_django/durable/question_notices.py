"""Reaching the approvers about workflows' questions: one email per question, never twice.

With ``NEXO["NOTIFY"]["EMAIL"]`` on, each question waiting for an answer is emailed once to the
people who may answer it (those who may decide calls: :func:`notify.approvers`, the workflow's
starter left out with ``SELF_APPROVAL`` off), with the question (shortened, hidden characters
shown, HTML escaped), its deadline and the absolute link to its answer page. It goes through the
outbox, as the calls' notices do: a ``question.asked`` notice written in the suspending commit
(:func:`nexo_django.durable.outbox.on_question`), delivered at commit or by the reconciler, with
the outbox's retries; the email channel (:mod:`.email_channel`) calls :func:`send_emails`.
"""

from __future__ import annotations

import html

from django.urls import reverse

from ..display import mark_hidden
from ..models import WorkflowStep
from . import notify

QUESTION_CHARS = 500


def answer_url(step: WorkflowStep) -> str:
    site = str(notify.options()["SITE_URL"]).rstrip("/")
    return site + reverse("admin:nexo_django_openquestion_change", args=[step.pk])


def message_parts(step: WorkflowStep, *, reminder: bool = False) -> tuple[str, str, str]:
    workflow = notify.one_line(step.workflow.rsplit(".", 1)[-1])
    key = html.escape(notify.one_line(step.name))
    question = html.escape(notify.short(mark_hidden(step.question, keep="\n"), QUESTION_CHARS))
    url = answer_url(step)
    lead = "Reminder: " if reminder else ""
    subject = notify.short(f"{lead}{workflow} run {str(step.run_id)[:8]} asks: {notify.one_line(step.name)}", 150)
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


def send_emails(step: WorkflowStep, *, reminder: bool = False) -> int:
    """Email ``step``'s question (or its reminder) to everyone who may answer it; how many went
    (the outbox's ``email`` channel calls it for a ``question.asked`` or ``.reminder`` notice)."""
    subject, text, body = message_parts(step, reminder=reminder)
    return notify.mail_approvers(step.run, subject, text, body, f"question {step.name!r}")
