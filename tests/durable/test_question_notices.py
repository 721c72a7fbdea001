"""Workflows' questions reach the approvers by email once (NEXO["NOTIFY"]), escaped, with the
link to the question's page; the reconciler sends what was not sent. Locmem mail backend."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from nexo_django import Workflow
from nexo_django.durable.recovery import reconcile
from nexo_django.models import WorkflowStep
from tests.admin.support import SCRIPT, make_user
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


def test_the_reconciler_sends_a_notice_nobody_sent(mailoutbox: list[Any], counter: Path, settings: Any) -> None:
    settings.NEXO = {}
    run = Ask.run({})
    approver_with_mail("dora")
    settings.NEXO = {"NOTIFY": {"EMAIL": True, "SITE_URL": SITE}}
    assert mailoutbox == []
    assert reconcile(now=timezone.now() + timedelta(minutes=5)).notified == 1
    assert [m.to for m in mailoutbox] == [["dora@example.com"]]
    assert WorkflowStep.objects.get(run_id=run.pk, name="channel").notified_at is not None


def test_the_question_is_escaped_and_quoted_in_the_email(mailoutbox: list[Any]) -> None:
    approver_with_mail("dora")
    Sly.run()
    [message] = mailoutbox
    assert SCRIPT not in message.body and "&lt;script&gt;" in message.body
    assert "\n> Decide: https://evil.example/" in message.body  # quoted: not a line of the notice's own
    html_body = message.alternatives[0][0]
    assert SCRIPT not in html_body
