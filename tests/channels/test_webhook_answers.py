"""A workflow's question answered by a signed webhook request (the channel's ``DECIDE``), and the
JSON endpoint: the same one answering function and the same refusals as the admin; nothing changes
on a refused one. A loopback receiver verifying the app's signed events; scripted workflows."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from nexo_django.channels.signing import sign
from nexo_django.models import RunStatus, StepStatus, WorkflowStep
from tests.admin.support import make_user
from tests.channel_servers import WebhookReceiver, wait_for
from tests.channels.test_webhook import SECRET, post
from tests.durable.test_attack_answers import json_client, post_answer
from tests.workflows_for_tests import Ask, Ticket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


@pytest.fixture
def receiver(settings: Any) -> Any:
    with WebhookReceiver(SECRET) as server:
        settings.NEXO = {"CHANNELS": {"hook": {"BACKEND": "webhook", "URL": server.url, "SECRET": SECRET,
                                               "ALLOW_PRIVATE": ["127.0.0.1"], "DECIDE": True}}}
        yield server


def asked(receiver: WebhookReceiver) -> dict[str, Any]:
    [event] = wait_for(lambda: [e for e in receiver.received.values() if e["type"] == "question.asked"])
    return event["question"]


def unanswered(step: WorkflowStep) -> None:
    step.refresh_from_db()
    assert step.status == StepStatus.WAITING and step.answered_by is None


def test_a_signed_answer_is_recorded_once_and_the_loser_is_told_who(receiver: WebhookReceiver, counter: Path) -> None:
    make_user("dora", "nexo_django.decide_toolcall")
    make_user("erin", "nexo_django.decide_toolcall")
    run = Ticket.run({})
    question = asked(receiver)
    assert question["schema"]["properties"]["priority"]["maximum"] == 5
    answer = {"title": "Fix it", "priority": 4}
    response = post({"question": question["id"], "answer": answer, "user": "dora"})
    assert response.status_code == 200
    assert response.json() == {"question": question["id"], "key": "ticket", "status": "answered",
                               "answered_by": "dora", "source": "hook"}
    step = WorkflowStep.objects.get(pk=question["id"])
    assert (step.result, step.answer_source, step.channel_user) == (answer, "hook", "webhook:dora")
    run.refresh_from_db()
    assert run.status == RunStatus.DONE and run.result == answer
    loser = post({"question": question["id"], "answer": {"title": "no", "priority": 1}, "user": "erin"})
    assert loser.status_code == 409 and "already answered by dora" in loser.json()["error"]
    answered = wait_for(lambda: [e for e in receiver.received.values() if e["type"] == "question.answered"])
    assert answered[0]["question"]["source"] == "hook" and answered[0]["question"]["channel_user"] == "webhook:dora"


def test_refused_answers_change_nothing(receiver: WebhookReceiver, counter: Path, settings: Any) -> None:
    starter = make_user("dora", "nexo_django.decide_toolcall")
    make_user("lurker")
    Ticket.run({}, user=starter)
    question = asked(receiver)
    step = WorkflowStep.objects.get(pk=question["id"])
    body = {"question": step.pk, "answer": {"title": "x", "priority": 1}, "user": "erin"}
    assert post(body, secret="not the secret").status_code == 401
    assert post(body, timestamp=int(time.time()) - 900).status_code == 401
    assert post(b'{"question": 1, "answer": ', ).status_code == 400
    assert post({"question": str(step.pk), "answer": 1, "user": "dora"}).status_code == 400  # an id is a number
    assert post({"question": step.pk, "user": "dora"}).status_code == 400  # no answer
    assert post({"question": step.pk, "answer": 1, "user": "d\x00ra"}).status_code == 400
    assert post({"question": 10**12, "answer": 1, "user": "dora"}).status_code == 404
    nobody = post(body)  # erin has no account here
    assert nobody.status_code == 403 and "no active account" in nobody.json()["error"]
    lurker = post({**body, "user": "lurker"})
    assert lurker.status_code == 403 and "decide_toolcall" in lurker.json()["error"]
    settings.NEXO = {**settings.NEXO, "SELF_APPROVAL": False}
    raw = b'{"question": %d, "answer": {"title": "x", "priority": 1}, "user": "dora"}' % step.pk
    signed = sign(SECRET, raw)
    four_eyes = post(raw, header=signed)
    assert four_eyes.status_code == 403 and "started this workflow" in four_eyes.json()["error"]
    assert post(raw, header=signed).status_code == 401  # the same request again: a replay
    make_user("erin", "nexo_django.decide_toolcall")
    schema = post({**body, "answer": {"title": "x", "priority": 9}})
    assert schema.status_code == 400 and "9 is greater than the maximum of 5" in schema.json()["error"]
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    assert post({**body, "answer": deep}).status_code == 400
    hostile = post({**body, "answer": {"title": "<script>alert(1)</script>" + "\x00", "priority": 1, "x": 1}})
    assert hostile.status_code == 200  # stored faithfully (the schema allows more properties)
    assert WorkflowStep.objects.get(pk=step.pk).result["title"] == "<script>alert(1)</script>\x00"


def test_without_decide_the_webhook_takes_no_answer(counter: Path, settings: Any) -> None:
    with WebhookReceiver(SECRET) as server:
        settings.NEXO = {"CHANNELS": {"hook": {"BACKEND": "webhook", "URL": server.url, "SECRET": SECRET,
                                               "ALLOW_PRIVATE": ["127.0.0.1"]}}}
        make_user("dora", "nexo_django.decide_toolcall")
        run = Ask.run({})
        step = WorkflowStep.objects.get(run_id=run.pk, name="channel")
        assert post({"question": step.pk, "answer": "blog", "user": "dora"}).status_code == 401
        unanswered(step)


def test_the_json_endpoint_answers_through_the_same_function(counter: Path, settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.urls_runs"
    run = Ticket.run({})
    step = WorkflowStep.objects.get(run_id=run.pk)
    client, token = json_client(make_user("ann", "nexo_django.decide_toolcall"), run)
    over = post_answer(client, token, run, '{"answer": {"title": "x", "priority": 6}}', key="ticket")
    assert over.status_code == 400 and "6 is greater than the maximum of 5" in over.json()["error"]
    unanswered(step)
    done = post_answer(client, token, run, '{"answer": {"title": "x", "priority": 5}}', key="ticket")
    assert done.status_code == 200 and done.json()["status"] == "answered"
    step.refresh_from_db()
    assert (step.answer_source, step.answered_by.username) == ("json", "ann")
    again = post_answer(client, token, run, '{"answer": {"title": "y", "priority": 1}}', key="ticket")
    assert again.status_code == 409 and "already answered by ann" in again.json()["error"]


def test_an_expired_question_is_refused_by_the_webhook_and_the_json_endpoint(
    receiver: WebhookReceiver, counter: Path, settings: Any,
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    make_user("dora", "nexo_django.decide_toolcall")
    run = Ticket.run({})
    step = WorkflowStep.objects.get(run_id=run.pk, name="ticket")
    WorkflowStep.objects.filter(pk=step.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    late = post({"question": step.pk, "answer": {"title": "x", "priority": 1}, "user": "dora"})
    assert late.status_code == 409 and late.json()["expired"] is True and "expired at" in late.json()["error"]
    settings.ROOT_URLCONF = "tests.urls_runs"
    client, token = json_client(make_user("ann", "nexo_django.decide_toolcall"), run)
    json_late = post_answer(client, token, run, '{"answer": {"title": "x", "priority": 1}}', key="ticket")
    assert json_late.status_code == 409 and json_late.json()["expired"] is True
    unanswered(step)
