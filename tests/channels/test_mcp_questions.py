"""An MCP tool's question (durable elicitation, the SDK's own server over stdio) answered from
every channel through the one answering function: Slack's modal and its Decline button, a signed
webhook, the JSON endpoint. Loopback Slack and webhook receivers; scripted models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nexo_django.models import RunStatus, StepStatus, WorkflowStep
from tests.channel_servers import SlackServer, WebhookReceiver, wait_for
from tests.channels.test_slack import slack_channel
from tests.channels.test_slack_questions import actions, click, question_message, send, slack_person
from tests.channels.test_webhook import SECRET, post
from tests.durable.test_attack_answers import json_client, post_answer
from tests.durable.test_elicitation import Elicits, asked, last_tool_result

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def test_slack_answers_an_mcp_question_in_its_modal_and_declines_another(settings: Any, counter: Path) -> None:
    with SlackServer() as slack:
        settings.NEXO = {"CHANNELS": {"ops": slack_channel(slack)}, "NOTIFY": {"SITE_URL": "https://ops.example.com"}}
        dora = slack_person(slack, "dora", "U1", "nexo_django.decide_toolcall")
        run = Elicits.run("Ask me for a word.")
        step = asked(run)
        message, _ = question_message(slack, step)
        [open_, decline] = actions(message)
        assert (open_["action_id"], decline["action_id"]) == ("nexo_answer_open", "nexo_answer_decline")
        assert click(slack, step, open_).status_code == 200
        view_id = next(iter(slack.views))
        assert [b["label"]["text"] for b in slack.views[view_id]["blocks"] if b["type"] == "input"] == ["Word"]
        done = send(slack.submission(view_id, {"f0": {"value": {"type": "plain_text_input", "value": "kite"}}}))
        assert (done.status_code, done.content) == (200, b"")
        run.refresh_from_db()
        assert run.status == RunStatus.DONE and last_tool_result(run)["content"] == ["kite"]
        step.refresh_from_db()
        assert (step.answered_by, step.answer_source, step.result) == (dora, "ops", {"action": "accept",
                                                                                    "content": {"word": "kite"}})
        assert "Answered by dora" in str(question_message(slack, step)[0]["blocks"])

        second = Elicits.run("Ask again.")
        other = asked(second)
        [_, decline] = actions(question_message(slack, other)[0])
        assert click(slack, other, decline).status_code == 200
        second.refresh_from_db()
        assert second.status == RunStatus.DONE and WorkflowStep.objects.get(pk=other.pk).result == {"action": "decline"}


def test_a_webhook_and_the_json_endpoint_answer_mcp_questions(settings: Any, counter: Path) -> None:
    from tests.admin.support import make_user

    with WebhookReceiver(SECRET) as receiver:
        settings.NEXO = {"CHANNELS": {"hook": {"BACKEND": "webhook", "URL": receiver.url, "SECRET": SECRET,
                                               "ALLOW_PRIVATE": ["127.0.0.1"], "DECIDE": True}}}
        make_user("dora", "nexo_django.decide_toolcall")
        run = Elicits.run("Ask me for a word.")
        step = asked(run)
        [event] = wait_for(lambda: [e for e in receiver.received.values() if e["type"] == "question.asked"])
        assert event["question"]["id"] == step.pk and event["question"]["question"] == "Which word?"
        assert event["question"]["mcp"] == {"tool": "ask", "mode": "form", "url": None, "round": 1}
        assert "state" not in str(event["question"]["mcp"])
        refused = post({"question": step.pk, "action": "maybe", "user": "dora"})
        assert refused.status_code == 400 and "or decline or cancel" in refused.json()["error"]
        assert post({"question": step.pk, "answer": {"word": "hook"}, "user": "dora"}).status_code == 200
        run.refresh_from_db()
        assert run.status == RunStatus.DONE and last_tool_result(run)["content"] == ["hook"]

        settings.ROOT_URLCONF = "tests.urls_runs"
        second = Elicits.run("Ask again.")
        other = asked(second)
        client, token = json_client(make_user("ann", "nexo_django.decide_toolcall"), second)
        cancelled = post_answer(client, token, second, '{"action": "cancel"}', key=other.name)
        assert cancelled.status_code == 200, cancelled.content
        second.refresh_from_db()
        assert second.status == RunStatus.DONE
        other.refresh_from_db()
        assert (other.status, other.result, other.answer_source) == (StepStatus.ANSWERED, {"action": "cancel"}, "json")
