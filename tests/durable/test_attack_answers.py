"""Attacks on workflows' answers (issue 45 item 4) through every path that takes one: Python
(``run.answer``, ``answer_question``), the JSON endpoint and the admin's form. Each checks that
nothing was answered: the question still waits with no answer, the run still suspended, and the
step after the question (``publish``, counted in a file) never ran. Scripted workflows."""

from __future__ import annotations

import json
import math
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from django.db import connections
from django.test import Client
from django.utils import timezone

from nexo_django import Workflow
from nexo_django.durable.recovery import reconcile
from nexo_django.durable.workflow_questions import answer_question
from nexo_django.errors import AlreadyDecided, ApprovalExpired, InvalidAnswer
from nexo_django.models import RunStatus, StepStatus, WorkflowStep
from tests.admin.support import client_for, csrf_post, make_user
from tests.workflows_for_tests import Ask

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

QUESTIONS = "/admin/nexo_django/openquestion/"


class Free(Workflow):
    """A question whose answer is any JSON (no schema): the admin's JSON text area."""

    def call(self, payload: Any) -> Any:
        return {"said": self.ask("say", "Say anything")}


class Shaped(Workflow):
    """A question with an object schema."""

    def call(self, payload: Any) -> Any:
        return self.ask("ticket", "Which ticket?", schema={
            "type": "object", "properties": {"id": {"type": "integer", "maximum": 1000}},
            "required": ["id"], "additionalProperties": False})


def step_of(run: Any, key: str = "channel") -> WorkflowStep:
    return WorkflowStep.objects.get(run_id=run.pk, name=key)


def unanswered(run: Any, counter: Path | None = None, key: str = "channel") -> None:
    step = step_of(run, key)
    assert step.status == StepStatus.WAITING and step.answered_by is None and step.result is None
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    if counter is not None:
        assert "publish" not in (counter.read_text() if counter.exists() else "")


def json_client(user: Any, run: Any) -> tuple[Client, str]:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get(f"/runs/{run.pk}/status/")  # sets the CSRF cookie
    return client, client.cookies["csrftoken"].value


def post_answer(client: Client, token: str, run: Any, raw: bytes | str, key: str = "channel") -> Any:
    return client.post(f"/runs/{run.pk}/questions/{key}/answer/", raw, content_type="application/json",
                       headers={"X-CSRFToken": token})


@pytest.fixture
def urls(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.urls_runs"


@pytest.fixture
def boss() -> Any:
    return make_user("boss", "nexo_django.decide_toolcall", "nexo_django.view_agentrun")


# --- who may answer ---------------------------------------------------------------------------

def test_the_requester_answers_nothing_under_four_eyes_on_every_path(counter: Path, settings: Any, urls: None) -> None:
    settings.NEXO = {"SELF_APPROVAL": False}
    starter = make_user("sam", "nexo_django.decide_toolcall", "nexo_django.view_agentrun")
    run = Ask.run({}, user=starter)
    with pytest.raises(PermissionDenied, match="SELF_APPROVAL"):
        run.answer("channel", "blog", by=starter)
    with pytest.raises(PermissionDenied, match="SELF_APPROVAL"):
        answer_question(step_of(run), "blog", by=starter)
    client, token = json_client(starter, run)
    response = post_answer(client, token, run, json.dumps({"answer": "blog"}))
    assert response.status_code == 403 and "SELF_APPROVAL" in response.json()["error"]
    admin = client_for(starter)
    csrf_post(admin, f"{QUESTIONS}{step_of(run).pk}/change/", {"answer": "blog"})
    unanswered(run, counter)


@pytest.mark.parametrize("who", ["no permission", "inactive", "nobody"])
def test_a_person_without_the_permission_answers_nothing_on_every_path(counter: Path, urls: None, who: str) -> None:
    run = Ask.run({})
    if who == "no permission":
        person = make_user("vic", "nexo_django.view_agentrun", "nexo_django.view_openquestion")
    elif who == "inactive":
        person = make_user("ina", "nexo_django.decide_toolcall", "nexo_django.view_agentrun")
        person.is_active = False
        person.save()
    else:
        person = None
    with pytest.raises(PermissionDenied):
        run.answer("channel", "blog", by=person)
    with pytest.raises(PermissionDenied):
        answer_question(step_of(run), "blog", by=person)
    if who == "no permission":
        client, token = json_client(person, run)
        assert post_answer(client, token, run, json.dumps({"answer": "blog"})).status_code in (403, 404)
        assert csrf_post(client_for(person), f"{QUESTIONS}{step_of(run).pk}/change/", {"answer": "blog"}).status_code == 403
    unanswered(run, counter)


# --- what may be answered ---------------------------------------------------------------------

@pytest.mark.parametrize("value", ["tv", "", None, 1, ["blog"], {"channel": "blog"}, "blog\x00", "BLOG", "blog "])
def test_a_value_the_schema_refuses_answers_nothing(counter: Path, boss: Any, urls: None, value: Any) -> None:
    run = Ask.run({})
    with pytest.raises(InvalidAnswer):
        run.answer("channel", value, by=boss)
    client, token = json_client(boss, run)
    response = post_answer(client, token, run, json.dumps({"answer": value}))
    assert response.status_code == 400 and "refused" in response.json()["error"]
    unanswered(run, counter)


@pytest.mark.parametrize("value", [{"id": 1001}, {"id": "1"}, {"id": 1, "more": 2}, {}, {"id": 1.5}, {"id": True}])
def test_an_object_the_schema_refuses_answers_nothing(boss: Any, urls: None, value: Any) -> None:
    run = Shaped.run({})
    with pytest.raises(InvalidAnswer):
        run.answer("ticket", value, by=boss)
    client, token = json_client(boss, run)
    assert post_answer(client, token, run, json.dumps({"answer": value}), key="ticket").status_code == 400
    page = csrf_post(client_for(boss), f"{QUESTIONS}{step_of(run, 'ticket').pk}/change/", {"answer": json.dumps(value)})
    assert page.status_code == 200 and ("refused" in page.content.decode() or "required" in page.content.decode())
    unanswered(run, key="ticket")


def test_non_json_numbers_are_stored_faithfully(boss: Any, urls: None) -> None:
    """NaN, the infinities and -0.0 (Python's json reads them) come back as sent, on both databases."""
    run = Free.run({})
    client, token = json_client(boss, run)
    response = post_answer(client, token, run, '{"answer": [NaN, Infinity, -Infinity, 1e999, -0.0]}', key="say")
    assert response.status_code == 200, response.content
    result = WorkflowStep.objects.get(pk=step_of(run, "say").pk).result
    assert math.isnan(result[0]) and result[1:4] == [math.inf, -math.inf, math.inf]
    assert result[4] == 0.0 and math.copysign(1, result[4]) == -1


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("raw", [json.dumps({"answer": "x" * 1_100_000}), '{"answer": ' + deep(100_000) + "}",
                                 '{"answer": ' + deep(65) + "}", '{"answer": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}"],
                         ids=["oversized", "deep", "just too deep", "deep objects"])
def test_oversized_and_deeply_nested_json_bodies_are_refused_cleanly(boss: Any, urls: None, raw: str) -> None:
    run = Free.run({})
    client, token = json_client(boss, run)
    response = post_answer(client, token, run, raw, key="say")
    assert response.status_code == 400, (response.status_code, response.content[:300])
    unanswered(run, key="say")


@pytest.mark.parametrize("text", [deep(100_000), '{"a": ' * 5000 + "1" + "}" * 5000, deep(65)],
                         ids=["deep", "deep objects", "just too deep"])
def test_a_deeply_nested_answer_in_the_admin_form_is_refused_with_the_reason(boss: Any, text: str) -> None:
    run = Free.run({})
    response = csrf_post(client_for(boss), f"{QUESTIONS}{step_of(run, 'say').pk}/change/", {"answer": text})
    assert response.status_code == 200, (response.status_code, response.content[:300])
    assert "deep" in response.content.decode()
    unanswered(run, key="say")


@pytest.mark.parametrize("levels", [600, 100_000])
def test_a_deeply_nested_answer_from_python_is_refused_with_the_reason(boss: Any, levels: int) -> None:
    run = Free.run({})
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    with pytest.raises(InvalidAnswer, match="deep"):
        run.answer("say", value, by=boss)
    unanswered(run, key="say")


# --- once, and in time ------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["python", "json"])
def test_two_answers_at_once_one_wins_and_the_loser_is_told(counter: Path, urls: None, path: str) -> None:
    ann = make_user("ann", "nexo_django.decide_toolcall", "nexo_django.view_agentrun")
    bob = make_user("bob", "nexo_django.decide_toolcall", "nexo_django.view_agentrun")
    run = Ask.run({})
    clients = {user.pk: json_client(user, run) for user in (ann, bob)} if path == "json" else {}
    barrier = threading.Barrier(2)
    outcomes: dict[str, Any] = {}

    def answer(user: Any, value: str) -> None:
        try:
            barrier.wait(timeout=10)
            if path == "python":
                try:
                    run.answer("channel", value, by=user)
                    outcomes[user.username] = "answered"
                except AlreadyDecided as exc:
                    outcomes[user.username] = str(exc)
            else:
                client, token = clients[user.pk]
                response = post_answer(client, token, run, json.dumps({"answer": value}))
                outcomes[user.username] = "answered" if response.status_code == 200 else (
                    response.status_code, response.json()["error"])
        finally:
            connections.close_all()

    threads = [threading.Thread(target=answer, args=(ann, "blog")), threading.Thread(target=answer, args=(bob, "mail"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["ann", "bob"] and list(outcomes.values()).count("answered") == 1, outcomes
    step = step_of(run)
    winner = step.answered_by.username
    loser = "bob" if winner == "ann" else "ann"
    told = str(outcomes[loser])
    assert f"already answered by {winner}" in told and (path == "python" or "409" in told), told
    run.refresh_from_db()
    assert run.status == RunStatus.DONE and run.result == {"published_to": step.result}
    assert [line for line in counter.read_text().split() if line.startswith("publish")] == [f"publish:{step.result}"]


@pytest.mark.parametrize("reconciled", [False, True])
def test_an_answer_after_expiry_answers_nothing(counter: Path, boss: Any, urls: None, reconciled: bool) -> None:
    run = Ask.run({})
    WorkflowStep.objects.filter(run_id=run.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    if reconciled:
        reconcile(log_warnings=False)
    with pytest.raises(ApprovalExpired):
        run.answer("channel", "blog", by=boss)
    client, token = json_client(boss, run)
    response = post_answer(client, token, run, json.dumps({"answer": "blog"}))
    assert response.status_code == 409 and response.json()["expired"] is True
    csrf_post(client_for(boss), f"{QUESTIONS}{step_of(run).pk}/change/", {"answer": "blog"})
    step = step_of(run)
    assert step.answered_by is None and step.status == (StepStatus.EXPIRED if reconciled else StepStatus.WAITING)
    assert "publish" not in counter.read_text()


class AsksSecret(Workflow):
    def call(self, payload: Any) -> Any:
        return self.ask("key", "Your key?", schema={"type": "object", "properties": {"api_token": {"type": "string"}}})


def test_a_question_that_asks_for_a_secret_fails_its_run_with_the_reason(counter: Path) -> None:
    run = AsksSecret.run({})
    assert run.status == "failed" and "'api_token' asks for a secret" in run.error
    assert not WorkflowStep.objects.filter(run_id=run.pk).exists()
