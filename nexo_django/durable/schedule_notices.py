"""A schedule paused (``schedule.paused``): what the channels say about it. The email goes to the
people who may change schedules (superusers and holders of ``nexo_django.change_schedule``) and
to the user the schedule runs as; Slack posts it to the channel; a webhook gets it as JSON."""

from __future__ import annotations

import html
from typing import Any

from django.core.mail import EmailMultiAlternatives
from django.db.models import Q
from django.urls import NoReverseMatch, reverse

from ..display import mark_hidden
from ..schedule_models import Schedule
from . import notify

KIND = "schedule.paused"


def admin_url(schedule_id: Any) -> str | None:
    try:
        return str(notify.options()["SITE_URL"]).rstrip("/") + reverse(
            "admin:nexo_django_schedule_change", args=[schedule_id])
    except NoReverseMatch:
        return None


def describe(notice: Any) -> dict[str, Any]:
    """The notice's schedule as the channels show it: id, name, target, reason and admin link."""
    payload = notice.payload or {}
    found = {k: payload.get(k) for k in ("schedule", "name", "target", "reason")}
    found["admin_url"] = admin_url(payload.get("schedule"))
    found["last_run"] = str(notice.run_id) if notice.run_id else None
    return found


def text(notice: Any) -> tuple[str, str]:
    """A one-line title and a plain text (hidden characters shown) of the pause."""
    about = describe(notice)
    name = notify.one_line(str(about["name"] or about["schedule"]))
    title = notify.short(f"Schedule {name} was paused", 150)
    lines = [f"{title}: {notify.short(notify.one_line(str(about['reason'] or '')), 600)}",
             f"It runs {notify.one_line(str(about['target'] or ''))}; nothing more starts until someone resumes it"
             + (f": {about['admin_url']}" if about["admin_url"] else " in the admin.")]
    return title, "\n".join(lines)


def recipients(notice: Any) -> list[Any]:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    user_model = get_user_model()
    email_field = user_model.get_email_field_name()
    may = Q(is_superuser=True)
    perm = Permission.objects.filter(codename="change_schedule", content_type__app_label="nexo_django").first()
    if perm is not None:
        may |= Q(user_permissions=perm) | Q(groups__permissions=perm)
    schedule_id = (notice.payload or {}).get("schedule")
    owner = (Schedule.objects.filter(pk=schedule_id).values_list("run_as", flat=True).first()
             if isinstance(schedule_id, int) else None)
    if owner is not None:
        may |= Q(pk=owner)
    return list(user_model._default_manager.filter(may, is_active=True).exclude(**{email_field: ""})
                .exclude(**{f"{email_field}__isnull": True}).distinct().order_by("pk"))


def send_email(notice: Any) -> int:
    """Email the pause to :func:`recipients`; how many went."""
    from .outbox import NothingToSay

    people = recipients(notice)
    if not people:
        raise NothingToSay("nobody with an email address may change schedules")
    title, body = text(notice)
    markup = "".join(f"<p>{html.escape(mark_hidden(line))}</p>" for line in body.splitlines())
    email_field = type(people[0]).get_email_field_name()
    sent = 0
    with notify.mail_connection() as connection:
        for user in people:
            message = EmailMultiAlternatives(title, body, to=[getattr(user, email_field)])
            message.attach_alternative(markup, "text/html")
            sent += connection.send_messages([message]) or 0
    return sent
