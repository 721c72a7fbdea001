"""A workflow's question answered in Slack, against a loopback Slack speaking its documented wire
format: buttons in the message for an enum, a modal opened with the click's ``trigger_id`` for an
object schema, validated on ``view_submission`` with the errors in the modal; every path through
the one answering function (refusals, the loser told who answered) and the message updated. The
workflows' steps are scripted."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.db import connections
from django.test import Client

from nexo_django.channels.signing import slack_signature
from nexo_django.models import Notice, RunStatus, StepStatus, WorkflowStep
from tests.admin.support import make_user
from tests.channel_servers import SlackServer, view_problems
from tests.channels.test_slack import SIGNING, TEAM, slack_channel, text_of
from tests.workflows_for_tests import Ask, Ticket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SITE = "https://ops.example.com"


@pytest.fixture
def slack(settings: Any) -> Any:
    with SlackServer() as server:
        settings.NEXO = {"CHANNELS": {"ops": slack_channel(server)}, "NOTIFY": {"SITE_URL": SITE}}
        yield server


def slack_person(slack: SlackServer, name: str, slack_id: str, *perms: str) -> Any:
    user = make_user(name, *perms)
    user.email = f"{name}@example.com"
    user.save()
    slack.users[slack_id] = {"id": slack_id, "is_email_confirmed": True, "profile": {"email": user.email}}
    return user


@pytest.fixture
def dora(slack: SlackServer) -> Any:
    return slack_person(slack, "dora", "U1", "nexo_django.decide_toolcall")


def send(payload: dict[str, Any], *, secret: str = SIGNING, timestamp: int | None = None,
         body: bytes | None = None) -> Any:
    """POST ``payload`` to the channel's endpoint as Slack does: form-encoded, signed."""
    ts = str(timestamp if timestamp is not None else int(time.time()))
    body = body if body is not None else urlencode({"payload": json.dumps(payload)}).encode()
    return Client().post("/nexo/channels/ops/", body, content_type="application/x-www-form-urlencoded",
                         headers={"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": slack_signature(secret, ts, body)})


def question_message(slack: SlackServer, step: WorkflowStep) -> tuple[dict[str, Any], dict[str, Any]]:
    receipt = Notice.objects.get(channel="ops", kind="question.asked", run_id=step.run_id).receipt
    return slack.messages[(receipt["channel"], receipt["ts"])], receipt


def actions(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]]


def click(slack: SlackServer, step: WorkflowStep, element: dict[str, Any], *, user: str = "U1") -> Any:
    _, receipt = question_message(slack, step)
    return send({"type": "block_actions", "user": {"id": user, "team_id": TEAM}, "team": {"id": TEAM},
                 "trigger_id": slack.trigger(), "api_app_id": "A0001",
                 "container": {"type": "message", "channel_id": receipt["channel"], "message_ts": receipt["ts"]},
                 "actions": [{**element, "block_id": f"nexo_q{step.pk}", "action_ts": f"{time.time():.6f}"}]})


def test_an_enum_question_is_answered_with_a_button_once_and_the_loser_is_told_who(
    slack: SlackServer, dora: Any, counter: Path,
) -> None:
    slack_person(slack, "erin", "U2", "nexo_django.decide_toolcall")
    run = Ask.run({})
    step = WorkflowStep.objects.get(run_id=run.pk, name="channel")
    message, _ = question_message(slack, step)
    buttons = actions(message)
    assert [(b["text"]["text"], b["value"]) for b in buttons] == [("blog", f"{step.pk}:0"), ("mail", f"{step.pk}:1")]
    assert click(slack, step, buttons[1]).status_code == 200
    step.refresh_from_db()
    assert (step.status, step.result, step.answered_by, step.answer_source, step.channel_user) == (
        StepStatus.ANSWERED, "mail", dora, "ops", f"slack:{TEAM}/U1")
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    updated, _ = question_message(slack, step)
    assert "Answered by dora" in text_of(updated) and actions(updated) == []  # the buttons are gone
    assert click(slack, step, buttons[0], user="U2").status_code == 200  # a stale click, by erin
    assert "already answered by dora" in slack.ephemeral[-1]["text"] and slack.ephemeral[-1]["user"] == "U2"
    assert WorkflowStep.objects.get(pk=step.pk).result == "mail"


def test_an_object_question_opens_a_modal_validated_on_submit_with_errors_in_the_modal(
    slack: SlackServer, dora: Any, counter: Path,
) -> None:
    run = Ticket.run({})
    step = WorkflowStep.objects.get(run_id=run.pk, name="ticket")
    message, _ = question_message(slack, step)
    [button] = actions(message)
    assert (button["action_id"], button["value"]) == ("nexo_answer_open", str(step.pk))
    assert click(slack, step, button).status_code == 200
    [opened] = slack.calls("views.open")
    view_id, view = next(iter(slack.views.items()))
    assert view_problems(view) == [] and view["callback_id"] == "nexo_answer"
    assert [b["block_id"] for b in view["blocks"] if b["type"] == "input"] == ["f0", "f1", "f2", "f3"]

    def submit(values: dict[str, Any], user: str = "U1") -> Any:
        return send(slack.submission(view_id, values, user=user))

    good = {"f0": {"value": {"type": "plain_text_input", "value": "Fix the login"}},
            "f1": {"value": {"type": "number_input", "value": "2"}},
            "f2": {"value": {"type": "datepicker", "selected_date": None}},
            "f3": {"value": {"type": "radio_buttons", "selected_option": {"value": "true"}}}}
    unread = submit({**good, "f1": {"value": {"type": "number_input", "value": "two"}}})
    assert unread.json() == {"response_action": "errors", "errors": {"f1": "Enter a whole number."}}
    # Past the schema's bound (Slack's own check bypassed): the one function's refusal, under its field.
    over = submit({**good, "f1": {"value": {"type": "number_input", "value": "9"}}}).json()
    assert over["response_action"] == "errors" and "9 is greater than the maximum of 5" in over["errors"]["f1"]
    assert WorkflowStep.objects.get(pk=step.pk).status == StepStatus.WAITING  # nothing recorded
    done = submit(good)
    assert (done.status_code, done.content) == (200, b"")  # closes the modal
    step.refresh_from_db()
    assert step.result == {"title": "Fix the login", "priority": 2, "notify": True}
    assert (step.answered_by, step.answer_source) == (dora, "ops")
    assert "Answered by dora" in text_of(question_message(slack, step)[0])
    again = submit(good).json()
    assert again["response_action"] == "errors" and "already answered by dora" in again["errors"]["f0"]


def test_a_spent_trigger_tells_the_person_and_opens_nothing(slack: SlackServer, dora: Any, counter: Path) -> None:
    run = Ticket.run({})
    step = WorkflowStep.objects.get(run_id=run.pk, name="ticket")
    _, receipt = question_message(slack, step)
    payload = {"type": "block_actions", "user": {"id": "U1", "team_id": TEAM}, "team": {"id": TEAM},
               "trigger_id": "1.2.not-from-slack", "container": {"channel_id": receipt["channel"],
                                                                  "message_ts": receipt["ts"]},
               "actions": [{"action_id": "nexo_answer_open", "type": "button", "value": str(step.pk)}]}
    assert send(payload).status_code == 200
    assert slack.views == {} and "invalid_trigger_id" in slack.ephemeral[-1]["text"]


def test_refused_submissions_change_nothing(slack: SlackServer, dora: Any, counter: Path, settings: Any) -> None:
    slack_person(slack, "lurker", "U3")  # no decide permission
    run = Ticket.run({}, user=dora)
    settings.NEXO = {**settings.NEXO, "SELF_APPROVAL": False}
    step = WorkflowStep.objects.get(run_id=run.pk, name="ticket")
    [button] = actions(question_message(slack, step)[0])
    click(slack, step, button)
    view_id = next(iter(slack.views))
    good = {"f0": {"value": {"value": "x"}}, "f1": {"value": {"value": "1"}}}
    payload = slack.submission(view_id, good)
    assert send(payload, secret="forged").status_code == 401
    assert send(payload, timestamp=int(time.time()) - 600).status_code == 401
    body = urlencode({"payload": json.dumps(payload)}).encode()
    ts = int(time.time())
    refused = send(payload, body=body, timestamp=ts).json()  # dora started the run: four eyes
    assert "started this workflow and cannot answer" in refused["errors"]["f0"]
    assert send(payload, body=body, timestamp=ts).status_code == 401  # the same request again: a replay
    lurker = send(slack.submission(view_id, good, user="U3")).json()
    assert "needs the nexo_django.decide_toolcall permission" in lurker["errors"]["f0"]
    slack.users["U9"] = {"id": "U9", "is_email_confirmed": True, "profile": {"email": "nobody@example.com"}}
    stranger = send(slack.submission(view_id, good, user="U9")).json()
    assert "no active account" in stranger["errors"]["f0"]
    forged = slack.submission(view_id, good)
    forged["view"]["private_metadata"] = json.dumps({"step": 10**30})
    assert "no longer exists" in send(forged).json()["errors"]["f0"]
    nul = slack.submission(view_id, good, user="U\x00")
    assert send(nul).status_code == 400
    assert WorkflowStep.objects.get(pk=step.pk).status == StepStatus.WAITING


def test_two_submissions_at_once_record_one_answer_and_the_other_names_who(
    slack: SlackServer, dora: Any, counter: Path,
) -> None:
    slack_person(slack, "erin", "U2", "nexo_django.decide_toolcall")
    run = Ticket.run({})
    step = WorkflowStep.objects.get(run_id=run.pk, name="ticket")
    [button] = actions(question_message(slack, step)[0])
    click(slack, step, button)
    view_id = next(iter(slack.views))
    good = {"f0": {"value": {"value": "x"}}, "f1": {"value": {"value": "1"}}}
    payloads = [slack.submission(view_id, good, user=u) for u in ("U1", "U2")]
    answers: list[Any] = []
    start = threading.Barrier(2)

    def go(payload: dict[str, Any]) -> None:
        start.wait()
        try:
            answers.append(send(payload))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=go, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    step.refresh_from_db()
    assert step.status == StepStatus.ANSWERED
    lost = [a.json() for a in answers if a.content]
    assert len(lost) == 1 and f"already answered by {step.answered_by}" in lost[0]["errors"]["f0"]


def test_an_answer_from_one_channel_updates_the_message_on_every_channel(
    settings: Any, counter: Path,
) -> None:
    with SlackServer() as server:
        settings.NEXO = {"CHANNELS": {"ops": slack_channel(server, "C0001"), "eng": slack_channel(server, "C0002")},
                         "NOTIFY": {"SITE_URL": SITE}}
        slack_person(server, "dora", "U1", "nexo_django.decide_toolcall")
        run = Ask.run({})
        step = WorkflowStep.objects.get(run_id=run.pk, name="channel")
        receipts = {n.channel: n.receipt for n in Notice.objects.filter(kind="question.asked", run_id=run.pk)}
        assert sorted(receipts) == ["eng", "ops"]
        assert click(server, step, actions(question_message(server, step)[0])[0]).status_code == 200
        for receipt in receipts.values():
            shown = text_of(server.messages[(receipt["channel"], receipt["ts"])])
            assert "Answered by dora" in shown and "nexo_answer_pick" not in shown
        assert WorkflowStep.objects.get(pk=step.pk).answer_source == "ops"


@pytest.mark.parametrize("reconciled", [False, True], ids=["past-deadline", "expired"])
def test_an_expired_question_is_refused_on_every_path(slack: SlackServer, dora: Any, counter: Path,
                                                      reconciled: bool) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from nexo_django.durable.recovery import reconcile

    ask, ticket = Ask.run({}), Ticket.run({})
    choice = WorkflowStep.objects.get(run_id=ask.pk, name="channel")
    form = WorkflowStep.objects.get(run_id=ticket.pk, name="ticket")
    [button] = actions(question_message(slack, form)[0])
    click(slack, form, button)
    view_id = next(iter(slack.views))
    WorkflowStep.objects.filter(pk__in=[choice.pk, form.pk]).update(expires_at=timezone.now() - timedelta(seconds=1))
    if reconciled:
        reconcile()
    buttons = actions(question_message(slack, choice)[0])
    if buttons:  # still shown until the reconciler's expiry updates the message
        assert click(slack, choice, buttons[0]).status_code == 200
        assert "expired" in slack.ephemeral[-1]["text"] or "ended without an answer" in slack.ephemeral[-1]["text"]
    shown = send(slack.submission(view_id, {"f0": {"value": {"value": "x"}}, "f1": {"value": {"value": "1"}}})).json()
    assert "expired" in shown["errors"]["f0"] or "ended without an answer" in shown["errors"]["f0"]
    for step in (choice, form):
        step.refresh_from_db()
        assert step.answered_by is None and step.result is None
        assert step.status == (StepStatus.EXPIRED if reconciled else StepStatus.WAITING)


def test_a_cancelled_run_ends_its_questions_messages(slack: SlackServer, dora: Any, counter: Path) -> None:
    run = Ask.run({})
    step = WorkflowStep.objects.get(run_id=run.pk, name="channel")
    assert actions(question_message(slack, step)[0])
    assert run.cancel(by=dora, reason="not needed")
    shown, _ = question_message(slack, step)
    assert "Not answered" in text_of(shown) and actions(shown) == []  # no button left to press
    assert Notice.objects.get(channel="ops", kind="question.expired", run_id=run.pk).status == "delivered"
