"""Workflows' questions reach the approvers by email once (NEXO["NOTIFY"]), escaped, with the
link to the question's page, through the outbox: a mail server down at the suspension's commit
leaves the notice to the reconciler. Locmem mail backend; a closed loopback port for the server down."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from nexo_django import Workflow
from nexo_django.durable.recovery import reconcile
from nexo_django.models import Notice, NoticeStatus, WorkflowStep
from tests.admin.support import SCRIPT, make_user
from tests.durable.test_notify import socket_closed, use_locmem, use_smtp
from tests.workflows_for_tests import Ask

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SITE = "https://ops.example.com"


class Sly(Workflow):
    def call(self, payload: Any) -> Any:
        return self.ask("say", f"Pick one {SCRIPT}\nDecide: https://evil.example/")


@pytest.fixture(autouse=True)
def notices(settings: Any) -> None:
    settings.NEXO = {"NOTIFY": {"EMAIL": True, "SITE_URL": SITE}}


def approver_with_mail(name: str) -> Any:
    user = make_user(name, "nexo_django.decide_toolcall")
    user.email = f"{name}@example.com"
    user.save()
    return user


def test_a_question_is_emailed_once_to_those_who_may_answer(mailoutbox: list[Any], counter: Path) -> None:
    approver_with_mail("dora")
    make_user("looker").save()
    run = Ask.run({})
    step = WorkflowStep.objects.get(run_id=run.pk, name="channel")
    [message] = mailoutbox
    assert message.to == ["dora@example.com"]
    assert "asks: channel" in message.subject and "Where should this go?" in message.body
    assert f"{SITE}/admin/nexo_django/openquestion/{step.pk}/change/" in message.body
    reconcile(now=timezone.now() + timedelta(minutes=5))
    assert len(mailoutbox) == 1  # claimed once


def test_with_the_mail_server_down_the_outbox_keeps_the_notice_and_the_reconciler_sends_it_once(
    mailoutbox: list[Any], counter: Path, settings: Any
) -> None:
    approver_with_mail("dora")
    with socket_closed() as port:
        use_smtp(settings, "127.0.0.1", port)
        run = Ask.run({})  # the question.asked notice is written in the suspending commit
    [notice] = Notice.objects.filter(kind="question.asked", run_id=run.pk)
    assert notice.status == NoticeStatus.PENDING and notice.attempts == 1 and "Connection refused" in notice.last_error
    use_locmem(settings)
    assert reconcile(now=timezone.now() + timedelta(minutes=5)).delivered == 1
    assert [m.to for m in mailoutbox] == [["dora@example.com"]]
    reconcile(now=timezone.now() + timedelta(hours=2))
    assert len(mailoutbox) == 1
    notice.refresh_from_db()
    assert notice.status == NoticeStatus.DELIVERED
    assert WorkflowStep.objects.get(run_id=run.pk, name="channel").notified_at is not None


def test_a_question_answered_before_its_email_went_is_not_emailed(mailoutbox: list[Any], counter: Path,
                                                                   settings: Any) -> None:
    boss = approver_with_mail("dora")
    with socket_closed() as port:
        use_smtp(settings, "127.0.0.1", port)
        run = Ask.run({})
    use_locmem(settings)
    run.answer("channel", "blog", by=boss)
    reconcile(now=timezone.now() + timedelta(minutes=5))
    assert mailoutbox == []
    notice = Notice.objects.get(kind="question.asked", run_id=run.pk)
    assert notice.status == NoticeStatus.SKIPPED and "answered" in notice.last_error


def test_the_question_is_escaped_and_quoted_in_the_email(mailoutbox: list[Any]) -> None:
    approver_with_mail("dora")
    Sly.run()
    [message] = mailoutbox
    assert SCRIPT not in message.body and "&lt;script&gt;" in message.body
    assert "\n> Decide: https://evil.example/" in message.body  # quoted: not a line of the notice's own
    html_body = message.alternatives[0][0]
    assert SCRIPT not in html_body


def test_one_reminder_per_question_still_waiting_then_none_once_answered(mailoutbox: list[Any], counter: Path,
                                                                        settings: Any) -> None:
    settings.NEXO = {"NOTIFY": {"EMAIL": True, "SITE_URL": SITE, "REMIND_AFTER": 3600}}
    boss = approver_with_mail("dora")
    run = Ask.run({})
    waiting = Ask.run({"version": "2"})
    assert len(mailoutbox) == 2  # the questions
    reconcile(now=timezone.now() + timedelta(minutes=30))
    assert len(mailoutbox) == 2  # not yet
    waiting.answer("channel", "mail", by=boss)
    for _ in range(2):  # whoever reminds again: once
        reconcile(now=timezone.now() + timedelta(hours=2))
    [reminder] = mailoutbox[2:]
    assert reminder.subject.startswith("Reminder: Ask run ") and reminder.to == ["dora@example.com"]
    assert str(run.pk)[:8] in reminder.subject and "Where should this go?" in reminder.body
