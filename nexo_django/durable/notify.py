"""Reaching the approvers: an email when calls start waiting, one reminder, never twice.

``NEXO["NOTIFY"] = {"EMAIL": True, "SITE_URL": "https://ops.example.com", "REMIND_AFTER": 3600}``.
When a run suspends, every active user who may decide (``nexo_django.decide_toolcall`` directly,
through a group, or as a superuser) and has an email address gets one email through Django's mail
framework: the agent, the run's prompt, each waiting call's tool and arguments (shortened, hidden
characters shown; escaped in the HTML part, as written in the plain text), its deadline and the absolute link to its decision page. Opening
the link decides nothing (mail scanners open links): the page needs a login, and only its POST
buttons decide. With ``SELF_APPROVAL`` off the person who started the run is not asked.

The notices go through the outbox (:mod:`nexo_django.durable.outbox`) as its built-in ``email``
channel: one ``approval.requested`` notice per suspension (every call that started waiting in that
turn, in one email), written in the suspending commit, and one ``approval.reminder`` per run
``REMIND_AFTER`` seconds later (the reconciler writes it). So a notice is never lost when the worker
dies after its commit or the mail server is down: the reconciler delivers it, with the outbox's
retries. A delivery that reached at least one approver counts as delivered (mail servers honour no
idempotency key: trying again would mail the others twice); one that reached nobody is tried again.
Calls decided before the email goes out are left out of it (a standing rule's, say); with none left
the notice is skipped.

A workflow's question takes the same road: a ``question.asked`` notice written in the suspending
commit, a ``question.reminder`` from the reconciler, delivered by the same job and retries; its
email (:func:`send_question_emails`) carries the question (shortened, hidden characters shown, HTML
escaped), its deadline and the absolute link to its answer page.
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.core import mail
from django.core.mail import EmailMultiAlternatives
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from ..conf import nexo_settings
from ..display import mark_hidden
from ..models import AgentRun, ToolCall, WorkflowStep
from . import binding
from .policy import check as policy_check

log = logging.getLogger("nexo_django.notify")

DEFAULTS: dict[str, Any] = {"EMAIL": False, "SITE_URL": "", "REMIND_AFTER": None}
#: characters of a call's arguments and of the prompt shown in an email
ARGS_CHARS = 300
PROMPT_CHARS = 500
QUESTION_CHARS = 500


def options() -> dict[str, Any]:
    given = nexo_settings.NOTIFY
    return {**DEFAULTS, **(given if isinstance(given, dict) else {})}


def enabled() -> bool:
    return bool(options()["EMAIL"])


def approvers(run: AgentRun, calls: Sequence[ToolCall] = (), *, escalated: bool = False) -> list[Any]:
    """The active users with an email address who may decide ``run``'s calls (of ``calls`` an
    approval policy routes: the members of its groups who may decide under it, only)."""
    # Here, not at the top: django.contrib.auth is optional (its models load only when the project
    # installs it), and this module loads with the app whether or not it does.
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    user_model = get_user_model()
    email_field = user_model.get_email_field_name()
    perm = Permission.objects.filter(codename="decide_toolcall", content_type__app_label="nexo_django").first()
    may = Q(is_superuser=True)
    if perm is not None:
        may |= Q(user_permissions=perm) | Q(groups__permissions=perm)
    users = user_model._default_manager.filter(may, is_active=True).exclude(**{email_field: ""}).exclude(
        **{f"{email_field}__isnull": True}
    ).distinct().order_by("pk")
    if not nexo_settings.SELF_APPROVAL and run.created_by_id is not None:
        users = users.exclude(pk=run.created_by_id)
    return list(policy_check.narrow(users, calls, timezone.now(), escalation=escalated))


def decision_url(call: ToolCall) -> str:
    site = str(options()["SITE_URL"]).rstrip("/")
    return site + reverse("admin:nexo_django_pendingapproval_change", args=[call.pk])


def short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(text: str) -> str:
    return " ".join(mark_hidden(text).split())


def deadline_text(at: datetime | None) -> str:
    return "none (it waits until someone decides)" if at is None else at.strftime("%Y-%m-%d %H:%M UTC")


def message_parts(run: AgentRun, calls: list[ToolCall], *, reminder: bool, escalated: bool = False,
                  ) -> tuple[str, str, str]:
    """Subject, plain text and HTML of the notice. Model-produced text (prompt, tool names,
    arguments) is shortened and its hidden and direction-changing characters shown as markers; in
    the plain text the prompt is quoted and each call's arguments stay on one line, so none of it
    can pass for the notice's own lines; in the HTML it is escaped. (The plain text is not
    HTML-escaped: a mail reader shows it as it is, ``&quot;`` and all.)"""
    agent = one_line(run.agent_name)
    lead = "Escalated: " if escalated else "Reminder: " if reminder else ""
    subject = short(f"{lead}{agent} run {str(run.pk)[:8]} waits for your approval ({len(calls)} call"
                     f"{'s' if len(calls) != 1 else ''})", 150)
    prompt = short(mark_hidden(run.prompt, keep="\n"), PROMPT_CHARS)
    first = f"{lead}{agent} ({one_line(run.agent)}) waits for a decision."
    lines = [
        first,
        "",
        "Prompt:",
        # Quoted: no line of the model's or the user's text can pass for one of the notice's own.
        *(f"> {line}" for line in prompt.splitlines() or [""]),
        "",
    ]
    items = []
    for index, call in enumerate(calls, 1):
        name = one_line(call.name)
        # JSON writes a newline inside a string as \\n: the arguments are one line.
        args = short(mark_hidden(json.dumps(call.args, ensure_ascii=False, default=str)), ARGS_CHARS)
        url = decision_url(call)
        # The version the arguments were shown against (a write); the page shows the file as it is then.
        bound = mark_hidden(binding.version_note(call))
        routed = mark_hidden(policy_check.note(call, timezone.now()))  # an approval policy's groups
        lines += [f"{index}. {name} {args}", *([f"   {bound}"] if bound else []), *([f"   {routed}"] if routed else []),
                  f"   Deadline: {deadline_text(call.expires_at)}", f"   Decide: {url}", ""]
        items.append(
            f"<li><strong>{html.escape(name)}</strong> <code>{html.escape(args)}</code><br>"
            + (f"{html.escape(bound)}<br>" if bound else "")
            + (f"{html.escape(routed)}<br>" if routed else "")
            + f"Deadline: {deadline_text(call.expires_at)}<br>"
            f'<a href="{html.escape(url)}">Open the decision page</a></li>'
        )
    lines.append("The link opens the call's page; nothing is decided until you press a button there.")
    text = "\n".join(lines)
    body = (
        f"<p>{html.escape(first)}</p><p>Prompt:</p><pre>{html.escape(prompt)}</pre><ol>{''.join(items)}</ol>"
        "<p>The link opens the call's page; nothing is decided until you press a button there.</p>"
    )
    return subject, text, body


def mail_connection() -> Any:
    """The default mailer: ``mail.mailers.default`` where Django has mailers (6.1), else
    ``get_connection()``."""
    mailers = getattr(mail, "mailers", None)
    return mailers.default if mailers is not None else mail.get_connection()


def send_emails(run: AgentRun, calls: list[ToolCall], *, reminder: bool, escalated: bool = False) -> int:
    """Email the notice (or reminder) of ``calls`` of ``run`` to every approver (``escalated``:
    to the escalation groups of their approval policy only); how many went. Raises what the mail
    server raised when nobody got it."""
    subject, text, body = message_parts(run, calls, reminder=reminder, escalated=escalated)
    what = "escalation" if escalated else "reminder" if reminder else "notice"
    return mail_approvers(run, subject, text, body, what, calls, escalated=escalated)


def mail_approvers(run: AgentRun, subject: str, text: str, body: str, what: str,
                   calls: Sequence[ToolCall] = (), *, escalated: bool = False) -> int:
    """Email ``subject`` (``text``, with ``body`` as its HTML) to every approver of ``run``; how
    many went. Raises what the mail server raised when nobody got it."""
    recipients = approvers(run, calls, escalated=escalated)
    email_field = type(recipients[0]).get_email_field_name() if recipients else ""
    sent = 0
    try:
        with mail_connection() as connection:
            for user in recipients:  # one at a time on one connection: the count stays exact
                message = EmailMultiAlternatives(subject, text, to=[getattr(user, email_field)])
                message.attach_alternative(body, "text/html")
                sent += connection.send_messages([message]) or 0
    except Exception:
        if not sent:
            raise
        log.exception("notify: the %s of run %s reached %d approver(s), then the mail server failed", what, run.pk, sent)
    return sent


# --- a workflow's question ------------------------------------------------------------------------


def answer_url(step: WorkflowStep) -> str:
    site = str(options()["SITE_URL"]).rstrip("/")
    return site + reverse("admin:nexo_django_openquestion_change", args=[step.pk])


def question_parts(step: WorkflowStep, *, reminder: bool = False) -> tuple[str, str, str]:
    """Subject, plain text and HTML of a question's notice (the question quoted, escaped in the
    HTML, hidden characters shown, as :func:`message_parts` does for calls)."""
    workflow = one_line(step.workflow.rsplit(".", 1)[-1])
    key = html.escape(one_line(step.name))
    question = html.escape(short(mark_hidden(step.question, keep="\n"), QUESTION_CHARS))
    url = answer_url(step)
    lead = "Reminder: " if reminder else ""
    subject = short(f"{lead}{workflow} run {str(step.run_id)[:8]} asks: {one_line(step.name)}", 150)
    deadline = deadline_text(step.expires_at).replace("decides", "answers")
    text = "\n".join([
        f"{workflow} ({html.escape(one_line(step.workflow))}) asks a question ({key}):", "",
        *(f"> {line}" for line in question.splitlines() or [""]), "",
        f"Deadline: {deadline}", f"Answer: {url}", "",
        "The link opens the question's page; nothing is answered until you send its form.",
    ])
    body = (f"<p>{workflow} asks a question ({key}):</p><pre>{question}</pre><p>Deadline: {deadline}</p>"
            f'<p><a href="{html.escape(url)}">Open the question</a></p>'
            "<p>The link opens the question's page; nothing is answered until you send its form.</p>")
    return subject, text, body


def send_question_emails(step: WorkflowStep, *, reminder: bool = False) -> int:
    """Email ``step``'s question (or its reminder) to everyone who may answer it; how many went
    (the outbox's ``email`` channel calls it for a ``question.asked`` or ``.reminder`` notice)."""
    subject, text, body = question_parts(step, reminder=reminder)
    return mail_approvers(step.run, subject, text, body, f"question {step.name!r}")
