"""Attacks on a question's answers from Slack (a loopback Slack) and a signed webhook (a loopback
receiver): late, forged and replayed requests, values the modal cannot hold, a body the JSON reader
must refuse. Each leaves the question waiting, the run suspended, nothing recorded. The workflows'
steps are scripted."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from nexo_django.models import RunStatus, StepStatus, WorkflowStep
from tests.admin.support import make_user
from tests.channel_servers import SlackServer, WebhookReceiver
from tests.channels.test_slack import slack_channel
from tests.channels.test_slack_questions import (
    SITE,
    actions,
    click,
    question_message,
    send,
    slack_person,
)
from tests.channels.test_webhook import SECRET, post
from tests.workflows_for_tests import Ticket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

GOOD = {"f0": {"value": {"type": "plain_text_input", "value": "Fix it"}},
        "f1": {"value": {"type": "number_input", "value": "2"}},
        "f2": {"value": {"type": "datepicker", "selected_date": None}},
        "f3": {"value": {"type": "radio_buttons", "selected_option": {"value": "true"}}}}


def untouched(step: WorkflowStep) -> None:
    step.refresh_from_db()
    assert (step.status, step.answered_by, step.result) == (StepStatus.WAITING, None, None)
    assert step.run.__class__.objects.get(pk=step.run_id).status == RunStatus.SUSPENDED


@pytest.fixture
def modal(settings: Any, counter: Path) -> Any:
    with SlackServer() as slack:
        settings.NEXO = {"CHANNELS": {"ops": slack_channel(slack)}, "NOTIFY": {"SITE_URL": SITE}}
        slack_person(slack, "dora", "U1", "nexo_django.decide_toolcall")
        run = Ticket.run({})
        step = WorkflowStep.objects.get(run_id=run.pk, name="ticket")
        [button] = actions(question_message(slack, step)[0])
        assert click(slack, step, button).status_code == 200
        yield slack, step, next(iter(slack.views))


def test_a_submission_six_minutes_old_or_forged_answers_nothing(modal: Any) -> None:
    slack, step, view_id = modal
    payload = slack.submission(view_id, GOOD)
    assert send(payload, timestamp=int(time.time()) - 360).status_code == 401
    assert send(payload, secret="not-the-signing-secret").status_code == 401
    untouched(step)


def test_a_click_six_minutes_old_opens_nothing(modal: Any) -> None:
    slack, step, _ = modal
    _, receipt = question_message(slack, step)
    payload = {"type": "block_actions", "user": {"id": "U1"}, "trigger_id": slack.trigger(),
               "container": {"channel_id": receipt["channel"], "message_ts": receipt["ts"]},
               "actions": [{"action_id": "nexo_answer_open", "type": "button", "value": str(step.pk)}]}
    assert send(payload, timestamp=int(time.time()) - 360).status_code == 401
    assert len(slack.views) == 1  # only the modal the fixture opened
    untouched(step)


@pytest.mark.parametrize(("field", "value"), [
    ("f3", {"type": "radio_buttons", "selected_option": {"value": "yes"}}),     # a boolean as a string
    ("f3", {"type": "radio_buttons", "selected_option": {"value": "maybe"}}),   # not one of the choices
    ("f1", {"type": "number_input", "value": "NaN"}),
    ("f1", {"type": "number_input", "value": "1e999"}),
    ("f2", {"type": "datepicker", "selected_date": "2027-02-31"}),
    ("f0", {"type": "plain_text_input", "value": "x" * 81}),                     # past maxLength
])
def test_a_value_the_modal_cannot_hold_is_shown_under_its_field(modal: Any, field: str, value: Any) -> None:
    slack, step, view_id = modal
    shown = send(slack.submission(view_id, {**GOOD, field: {"value": value}}))
    assert shown.status_code == 200 and shown.json()["response_action"] == "errors", shown.content
    assert list(shown.json()["errors"]) == [field]
    untouched(step)


@pytest.fixture
def hook(settings: Any, counter: Path) -> Any:
    with WebhookReceiver(SECRET) as receiver:
        settings.NEXO = {"CHANNELS": {"hook": {"BACKEND": "webhook", "URL": receiver.url, "SECRET": SECRET,
                                               "ALLOW_PRIVATE": ["127.0.0.1"], "DECIDE": True}}}
        make_user("dora", "nexo_django.decide_toolcall")
        yield WorkflowStep.objects.get(run_id=Ticket.run({}).pk, name="ticket")


@pytest.mark.parametrize("raw", [
    b'{"question": %d, "answer": {"title": "x", "priority": NaN}, "user": "dora"}',
    b'{"question": %d, "answer": {"title": "x", "priority": Infinity}, "user": "dora"}',
    b'{"question": %d, "answer": {"title": "x", "priority": 2}, "user": "dora\\u0000"}',
    b'{"question": %d, "answer": ' + b"[" * 5000 + b"]" * 5000 + b', "user": "dora"}',
])
def test_a_signed_body_the_reader_refuses_answers_nothing(hook: WorkflowStep, raw: bytes) -> None:
    answered = post(raw % hook.pk)
    assert answered.status_code == 400 and answered.json().get("error"), answered.content
    untouched(hook)


def test_a_nul_in_a_signed_answer_is_stored_faithfully(hook: WorkflowStep) -> None:
    """PostgreSQL's jsonb holds no NUL: the answer is stored as given, or refused; never a 500."""
    answered = post(b'{"question": %d, "answer": {"title": "x\\u0000y", "priority": 2}, "user": "dora"}' % hook.pk)
    assert answered.status_code == 200, answered.content
    hook.refresh_from_db()
    assert hook.result == {"title": "x\x00y", "priority": 2}


def test_a_signed_answer_past_the_size_bound_answers_nothing(hook: WorkflowStep) -> None:
    raw = b'{"question": %d, "answer": {"title": "%s", "priority": 2}, "user": "dora"}' % (hook.pk, b"x" * 3_000_000)
    answered = post(raw)
    assert answered.status_code in (400, 413), answered.status_code
    untouched(hook)


def test_a_signed_answer_that_breaks_a_format_answers_nothing(hook: WorkflowStep) -> None:
    answered = post({"question": hook.pk, "answer": {"title": "x", "priority": 2, "due": "next tuesday"},
                     "user": "dora"})
    assert answered.status_code == 400 and "is not a 'date'" in answered.json()["error"]
    untouched(hook)
