"""A workflow's questions on the channels, through the outbox: a webhook receiver gets
``question.asked`` / ``.answered`` / ``.expired`` as signed events, Slack gets a message with the
question and a link to answer it, updated once it is answered. Loopback receivers speaking each
service's wire format; the workflows' steps are scripted."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from nexo_django.durable import parents
from nexo_django.durable.recovery import reconcile
from nexo_django.models import Notice, NoticeStatus, WorkflowStep
from tests.admin.support import make_user
from tests.channel_servers import SlackServer, WebhookReceiver, wait_for
from tests.channels.test_slack import slack_channel, text_of
from tests.workflows_for_tests import Ask

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SECRET = "whsec-questions"
SITE = "https://ops.example.com"


@pytest.fixture
def receiver(settings: Any) -> Any:
    with WebhookReceiver(SECRET) as server:
        settings.NEXO = {"CHANNELS": {"hook": {"BACKEND": "webhook", "URL": server.url, "SECRET": SECRET,
                                               "ALLOW_PRIVATE": ["127.0.0.1"]}},
                         "NOTIFY": {"SITE_URL": SITE}}  # fmt: skip
        yield server


def test_a_webhook_hears_a_question_asked_and_answered_once_each(receiver: WebhookReceiver, counter: Path,
                                                                 settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.urls_runs"
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run = Ask.run({})
    step = WorkflowStep.objects.get(run_id=run.pk, name="channel")
    [asked] = wait_for(lambda: list(receiver.received.values()))
    assert asked["type"] == "question.asked" and asked["run"]["id"] == str(run.pk)
    question = asked["question"]
    assert (question["key"], question["question"], question["status"]) == ("channel", "Where should this go?", "waiting")
    assert question["schema"] == {"type": "string", "enum": ["blog", "mail"]}
    assert question["admin_url"] == f"{SITE}/admin/nexo_django/openquestion/{step.pk}/change/"
    assert question["answer_url"] == f"{SITE}/runs/{run.pk}/questions/channel/answer/"
    assert "call" not in asked

    assert parents.wake(run.pk)  # a pass that reaches the same question again: no second notice
    assert Notice.objects.filter(kind="question.asked").count() == 1

    run.answer("channel", "mail", by=boss)
    answered = wait_for(lambda: [e for e in receiver.received.values() if e["type"] == "question.answered"])
    assert answered[0]["question"]["answered_by"] == "boss" and answered[0]["question"]["status"] == "answered"
    assert sorted(e["type"] for e in receiver.posts) == ["question.answered", "question.asked", "run.done"]
    assert not receiver.refused


def test_a_webhook_hears_a_question_expire(receiver: WebhookReceiver, counter: Path) -> None:
    run = Ask.run({})
    WorkflowStep.objects.filter(run_id=run.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    reconcile()
    expired = wait_for(lambda: [e for e in receiver.received.values() if e["type"] == "question.expired"])
    assert expired[0]["question"]["status"] == "expired" and expired[0]["question"]["answered_by"] is None


def test_slack_posts_the_question_with_a_link_to_answer_it_and_updates_it_when_answered(
    settings: Any, counter: Path
) -> None:
    with SlackServer() as slack:
        settings.NEXO = {"CHANNELS": {"ops": slack_channel(slack, REMIND_AFTER=600)}, "NOTIFY": {"SITE_URL": SITE}}
        boss = make_user("boss", "nexo_django.decide_toolcall")
        run = Ask.run({})
        step = WorkflowStep.objects.get(run_id=run.pk, name="channel")
        asked = Notice.objects.get(channel="ops", kind="question.asked", run_id=run.pk)
        assert asked.status == NoticeStatus.DELIVERED
        message = slack.messages[(asked.receipt["channel"], asked.receipt["ts"])]
        shown = text_of(message)
        assert "Ask asks: channel" in shown and "Where should this go?" in shown
        assert f"{SITE}/admin/nexo_django/openquestion/{step.pk}/change/|Answer it" in shown
        assert [e["value"] for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]] == [
            f"{step.pk}:0", f"{step.pk}:1"]  # the choices, as buttons (tests/channels/test_slack_questions.py)

        reconcile(now=timezone.now() + timedelta(hours=1))  # a reminder, in the message's thread
        reply = slack.calls("chat.postMessage")[-1]
        assert reply["thread_ts"] == asked.receipt["ts"] and reply["text"].startswith("Reminder: channel still waits")

        run.answer("channel", "blog", by=boss)
        updated = slack.messages[(asked.receipt["channel"], asked.receipt["ts"])]
        assert 'Answered by boss' in text_of(updated) and '\\"blog\\"' in text_of(updated)
        assert len(slack.calls("chat.postMessage")) == 2 and len(slack.calls("chat.update")) >= 1
