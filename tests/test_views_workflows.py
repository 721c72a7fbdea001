"""The user-facing run pages and JSON serve workflow runs: their steps, open questions and the calls
their agents wait on. Scripted agent, inline queue."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from nexo_django.durable.workflow_runs import WorkflowRun
from tests.admin.support import client_for, make_user
from tests.workflows_for_tests import Ask, Release

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def test_the_status_json_and_the_page_of_a_workflow_run_show_its_steps_scripted(counter: Path, settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.urls_runs"
    starter = make_user("sam", staff=False)
    run = Release.run({"version": "7"}, user=starter)
    client = client_for(starter)
    status = client.get(f"/runs/{run.pk}/status/").json()
    assert (status["kind"], status["status"]) == ("workflow", "suspended")
    assert [(s["name"], s["kind"], s["status"]) for s in status["steps"]] == [
        ("collect", "checkpoint", "done"), ("Drafter", "agent", "waiting")]
    assert status["steps"][0]["result"] == ["7: faster runs", "7: workflows"]
    [call] = status["agent_calls"]
    assert call["name"] == "write" and call["run"] == status["steps"][1]["agent_run"]
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run.pending_calls().get().approve(by=boss)
    status = client.get(f"/runs/{run.pk}/status/").json()
    assert status["questions"] == ["channel"] and status["steps"][2]["question"] == "Where should this go?"
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="workflow-steps"' in page and "Where should this go?" in page
    run.answer("channel", "mail", by=boss)
    status = client.get(f"/runs/{run.pk}/status/").json()
    assert (status["status"], status["result_json"]) == ("done", {"published_to": "mail", "files": ["notes.md"]})


def test_a_question_is_answered_over_json_once_with_its_schema_checked_scripted(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.urls_runs"
    starter = make_user("sam", staff=False)
    boss = make_user("boss", "nexo_django.decide_toolcall", "nexo_django.view_agentrun")
    run = Ask.run({"version": "7"}, user=starter)
    assert run.status == "suspended"
    client = Client(enforce_csrf_checks=True)
    client.force_login(boss)
    client.get(f"/runs/{run.pk}/status/")  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    url = f"/runs/{run.pk}/questions/channel/answer/"

    def post(body: Any, *, who: Client = client, csrf: str | None = token) -> Any:
        headers = {"X-CSRFToken": csrf} if csrf else {}
        return who.post(url, json.dumps(body), content_type="application/json", headers=headers)

    assert post({"answer": "blog"}, csrf=None).status_code == 403  # no CSRF token
    refused = post({"answer": "fax"})
    assert refused.status_code == 400 and "'fax' is not one of" in refused.json()["error"]
    assert post({"reply": "blog"}).status_code == 400
    assert client.post(url, "{not json", content_type="application/json", headers={"X-CSRFToken": token}).status_code == 400
    missing = client.post(f"/runs/{run.pk}/questions/nope/answer/", json.dumps({"answer": "blog"}),
                          content_type="application/json", headers={"X-CSRFToken": token})  # fmt: skip
    assert missing.status_code == 404 and "no question 'nope'" in missing.json()["error"]
    own = Client(enforce_csrf_checks=True)  # the starter may see the run, not answer it
    own.force_login(starter)
    own.get(f"/runs/{run.pk}/status/")
    mine = post({"answer": "blog"}, who=own, csrf=own.cookies["csrftoken"].value)
    assert mine.status_code == 403 and "decide_toolcall" in mine.json()["error"]

    answered = post({"answer": "mail"})
    assert answered.status_code == 200, answered.content
    assert answered.json() == {"key": "channel", "status": "answered", "answered_by": "boss", "run_status": "done"}
    again = post({"answer": "blog"})
    assert again.status_code == 409 and "already answered by boss" in again.json()["error"]
    assert WorkflowRun.get(run.pk).result == {"published_to": "mail"}
