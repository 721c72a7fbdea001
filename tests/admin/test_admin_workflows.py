"""Workflows in the admin: questions listed beside the calls, answered with a form built from the
schema (CSRF POST, the decide permission), a workflow run's steps on its page. Scripted agents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django import forms

from nexo_django import Workflow
from nexo_django.admin.workflows import answer_field
from nexo_django.models import RunStatus, StepStatus, WorkflowStep
from tests.admin.support import (
    INBOX,
    SCRIPT,
    approver,
    client_for,
    csrf_post,
    make_user,
    run_url,
    viewer,
)
from tests.workflows_for_tests import Ask, Release

pytestmark = [pytest.mark.django_db(transaction=True)]

QUESTIONS = "/admin/nexo_django/openquestion/"


class Hostile(Workflow):
    def call(self, payload: Any) -> Any:
        return self.ask("say", f"Say it {SCRIPT}", schema={"type": "object"})


def test_the_inbox_points_to_the_questions_and_lists_them(counter: Path) -> None:
    run = Ask.run({})
    client = client_for(approver())
    page = client.get(INBOX).content.decode()
    assert "1 question from workflows waits for an answer" in page and f'href="{QUESTIONS}"' in page
    listing = client.get(QUESTIONS).content.decode()
    step = WorkflowStep.objects.get(run_id=run.pk, name="channel")
    assert f"{QUESTIONS}{step.pk}/change/" in listing and "Where should this go?" in listing and "Ask" in listing


def test_a_question_is_answered_with_a_form_built_from_its_schema(counter: Path) -> None:
    run = Ask.run({})
    step = WorkflowStep.objects.get(run_id=run.pk, name="channel")
    client = client_for(approver())
    page = client.get(f"{QUESTIONS}{step.pk}/change/").content.decode()
    assert 'type="radio" name="answer" value="blog"' in page and 'value="mail"' in page
    response = csrf_post(client, f"{QUESTIONS}{step.pk}/change/", {"answer": "mail"})
    assert response.status_code == 302
    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.DONE, {"published_to": "mail"})
    assert WorkflowStep.objects.get(pk=step.pk).answered_by.username == "ann"


def test_answering_in_the_admin_needs_the_decide_permission_and_csrf(counter: Path) -> None:
    run = Ask.run({})
    step = WorkflowStep.objects.get(run_id=run.pk, name="channel")
    url = f"{QUESTIONS}{step.pk}/change/"
    looker = client_for(viewer())
    assert "answer-form" not in looker.get(url).content.decode()
    assert csrf_post(looker, url, {"answer": "blog"}).status_code == 403
    no_token = client_for(approver()).post(url, {"answer": "blog"})
    assert no_token.status_code == 403
    assert WorkflowStep.objects.get(pk=step.pk).status == StepStatus.WAITING


def test_a_question_and_its_answer_are_shown_escaped_and_refused_answers_say_why(counter: Path) -> None:
    run = Hostile.run()
    step = WorkflowStep.objects.get(run_id=run.pk)
    client = client_for(approver())
    url = f"{QUESTIONS}{step.pk}/change/"
    page = client.get(url).content.decode()
    assert SCRIPT not in page and "&lt;script&gt;" in page
    refused = csrf_post(client, url, {"answer": '"not an object"'}).content.decode()
    assert "the answer to &#x27;say&#x27; was refused: &#x27;not an object&#x27; is not of type &#x27;object&#x27;" in refused
    assert WorkflowStep.objects.get(pk=step.pk).status == StepStatus.WAITING


def test_the_run_page_shows_the_steps_in_order_with_the_agent_run_linked_scripted(counter: Path) -> None:
    run = Release.run({"version": "3"})
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run.pending_calls().get().approve(by=boss)
    run.answer("channel", "blog", by=boss)
    child = WorkflowStep.objects.get(run_id=run.pk, name="Drafter").child_run
    client = client_for(approver())
    page = client.get(run_url(run.agent_run)).content.decode()
    names = ["collect", "Drafter", "channel", "publish", "files"]
    positions = [page.index(f"<strong>{n}</strong>") for n in names]
    assert positions == sorted(positions)
    assert f"/admin/nexo_django/agentrun/{child.pk}/change/" in page
    assert "answered by boss" in page and "3: faster runs" in page
    child_page = client.get(run_url(child)).content.decode()
    assert f"/admin/nexo_django/agentrun/{run.pk}/change/" in child_page and 'id="parent-workflow"' in child_page


def test_answer_fields_follow_the_schema() -> None:
    assert type(answer_field({"enum": ["a", "b"]})).__name__ == "TypedChoiceField"
    assert type(answer_field({"type": "string"})).__name__ == "CharField"
    assert type(answer_field({"type": "boolean"})).__name__ == "TypedChoiceField"  # Yes / No
    assert type(answer_field({"type": "integer"})).__name__ == "IntegerField"
    assert isinstance(answer_field({"type": "object"}), forms.JSONField)  # bounded: the one JSON reader
    assert isinstance(answer_field(None), forms.JSONField)


def test_the_answers_log_exports_every_question_with_its_answer_and_who_gave_it(counter: Path) -> None:
    answered, waiting = Ask.run({}), Ask.run({})
    answered.answer("channel", "mail", by=make_user("boss", "nexo_django.decide_toolcall"))
    client = client_for(approver())
    assert 'id="answers-csv"' in client.get(QUESTIONS).content.decode()
    rows = json.loads(b"".join(client.get(f"{QUESTIONS}export/json/").streaming_content))
    assert [(r["run"], r["status"], r["answer"], r["answered_by"]) for r in rows] == [
        (str(answered.pk), "answered", "mail", "boss"), (str(waiting.pk), "waiting", None, "")]
    lines = b"".join(client.get(f"{QUESTIONS}export/csv/").streaming_content).decode().splitlines()
    assert lines[0].startswith("asked_at,run,workflow,key,question,status,answer,answered_by")
    assert f"{answered.pk},tests.workflows_for_tests.Ask,channel,Where should this go?,answered,mail,boss" in lines[1]


def test_an_object_question_gets_a_field_per_property_with_its_bounds(counter: Path) -> None:
    from tests.workflows_for_tests import Ticket

    run = Ticket.run({})
    step = WorkflowStep.objects.get(run_id=run.pk, name="ticket")
    client = client_for(approver())
    url = f"{QUESTIONS}{step.pk}/change/"
    page = client.get(url).content.decode()
    assert '<textarea name="answer"' not in page  # no JSON box
    assert 'name="answer__0"' in page and 'maxlength="80"' in page
    assert 'type="number" name="answer__1" value="3" min="1" max="5"' in page
    assert 'type="date" name="answer__2"' in page and 'name="answer__3" value="true"' in page
    refused = csrf_post(client, url, {"answer__0": "Fix it", "answer__1": "9", "answer__2": "", "answer__3": ""})
    assert refused.status_code == 200 and "less than or equal to 5" in refused.content.decode()
    assert WorkflowStep.objects.get(pk=step.pk).status == StepStatus.WAITING  # nothing recorded
    done = csrf_post(client, url, {"answer__0": "Fix it", "answer__1": "2", "answer__2": "2027-01-31", "answer__3": "true"})
    assert done.status_code == 302
    answered = WorkflowStep.objects.get(pk=step.pk)
    assert answered.result == {"title": "Fix it", "priority": 2, "due": "2027-01-31", "notify": True}
    assert (answered.answer_source, answered.answered_by.username) == ("admin", "ann")
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
