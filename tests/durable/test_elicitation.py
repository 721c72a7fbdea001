"""Durable MCP elicitation against the mcp SDK's own server (tests/mcp_http_server.py over stdio,
protocol 2026-07-28): a tool that asks a person (``Resolve`` → an ``input_required`` result)
suspends the run; its ask is a question of the run in the inbox, answered through the one
answering function (accept, decline, cancel); the next pass calls the tool again with the answer
and the stored ``requestState``, once, and the run goes on. Scripted models."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nexo_django import Agent, Permissions
from nexo_django.core.mcp import MCPServer
from nexo_django.durable import workflow_questions
from nexo_django.errors import AlreadyDecided, InvalidAnswer
from nexo_django.models import CallStatus, RunStatus, StepStatus, ToolCall, WorkflowStep
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.admin.support import client_for, make_user
from tests.core.test_mcp import SERVER_SCRIPT, TEST_STDIO

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


class Elicits(Agent):
    """Calls the server's ``ask`` (allowed by the MCP gate), then answers with what it got."""

    model = ScriptedModel([tool_call("ask"), reply("done")])
    permissions = Permissions("approve", mcp_allow=["ask"])
    mcp_servers = [TEST_STDIO]


def asked(run: Any) -> WorkflowStep:
    [step] = WorkflowStep.objects.filter(run_id=run.pk, status=StepStatus.WAITING)
    return step


def ask_result(run: Any) -> Any:
    return ToolCall.objects.filter(run_id=run.pk, name="ask").values_list("status", "result").first()


def test_a_tool_that_asks_suspends_the_run_and_the_answer_resumes_it_once(counter: Path) -> None:
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run = Elicits.run("Ask me for a word.")
    assert run.status == RunStatus.SUSPENDED
    step = asked(run)
    assert step.name.startswith("mcp:") and step.question == "Which word?"
    assert step.schema["properties"]["word"]["type"] == "string"
    assert (step.request["mode"], step.request["round"], step.request["tool"]) == ("form", 1, "ask")
    assert isinstance(step.request["state"], str) and step.request["state"]  # the server's requestState, as sent
    listing = client_for(boss).get("/admin/nexo_django/openquestion/").content.decode()
    assert "Which word?" in listing  # in the inbox beside the workflows' questions
    with pytest.raises(InvalidAnswer):
        workflow_questions.answer(run, step.name, {"word": 5}, by=boss)
    workflow_questions.answer(run, step.name, {"word": "hello"}, by=boss, source="admin")
    run.refresh_from_db()
    assert run.status == RunStatus.DONE and run.result == "done"
    step.refresh_from_db()
    assert step.result == {"action": "accept", "content": {"word": "hello"}}
    tool_message = [m for m in run.transcript() if m.get("role") == "tool"]
    assert tool_message[-1]["content"]["content"] == ["hello"]
    with pytest.raises(AlreadyDecided, match="already answered by boss"):
        workflow_questions.answer(run, step.name, {"word": "again"}, by=boss)


@pytest.mark.parametrize("action", ["decline", "cancel"])
def test_declining_or_cancelling_is_an_answer_the_server_gets(counter: Path, action: str) -> None:
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run = Elicits.run("Ask me for a word.")
    step = asked(run)
    workflow_questions.answer(run, step.name, None, by=boss, action=action)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert WorkflowStep.objects.get(pk=step.pk).result == {"action": action}
    status, result = ask_result(run) or (None, None)
    tool_message = [m for m in run.transcript() if m.get("role") == "tool"][-1]["content"]
    assert "error" in tool_message  # the server's own answer to a refusal: no word
    assert status in (None, CallStatus.FAILED)


class Pair(Agent):
    model = ScriptedModel([tool_call("pair"), reply("done")])
    permissions = Permissions("approve", mcp_allow=["pair"])
    mcp_servers = [TEST_STDIO]


class Sized(Agent):
    model = ScriptedModel([tool_call("sized"), reply("done")])
    permissions = Permissions("approve", mcp_allow=["sized"])
    mcp_servers = [TEST_STDIO]


class Visits(Agent):
    model = ScriptedModel([tool_call("visit"), reply("done")])
    permissions = Permissions("approve", mcp_allow=["visit"])
    mcp_servers = [TEST_STDIO]


class Sneaky(Agent):
    model = ScriptedModel([tool_call("sneaky"), reply("done")])
    permissions = Permissions("approve", mcp_allow=["sneaky"])
    mcp_servers = [TEST_STDIO]


class Forever(Agent):
    model = ScriptedModel([tool_call("forever"), reply("done")])
    permissions = Permissions("approve", mcp_allow=["forever"])
    mcp_servers = [TEST_STDIO]


def last_tool_result(run: Any) -> Any:
    return [m for m in run.transcript() if m.get("role") == "tool"][-1]["content"]


def test_two_questions_at_once_wait_for_both_answers(counter: Path) -> None:
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run = Pair.run("Ask me two things.")
    steps = {s.question: s for s in WorkflowStep.objects.filter(run_id=run.pk)}
    assert sorted(steps) == ["Which colour?", "Which word?"]
    workflow_questions.answer(run, steps["Which word?"].name, {"word": "sky"}, by=boss)
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED  # woken, and waits again for the other answer
    workflow_questions.answer(run, steps["Which colour?"].name, {"colour": "blue"}, by=boss)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE and last_tool_result(run)["content"] == ["blue sky"]


def test_a_server_that_asks_again_is_asked_again_in_a_second_round(counter: Path) -> None:
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run = Sized.run("Ask me.")
    first = asked(run)
    workflow_questions.answer(run, first.name, {"word": "tree"}, by=boss)
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    second = asked(run)
    assert second.request["round"] == 2 and second.question == "How big is 'tree'?"
    workflow_questions.answer(run, second.name, {"size": 12}, by=boss)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE and last_tool_result(run)["content"] == ["tree of size 12"]


def test_a_url_mode_ask_is_a_link_the_person_opens_and_the_retry_comes_once(counter: Path) -> None:
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run = Visits.run("Get consent.")
    step = asked(run)
    assert (step.request["mode"], step.request["url"], step.schema) == (
        "url", "https://consent.example.com/agree?x=<b>", None)
    page = client_for(boss).get(f"/admin/nexo_django/openquestion/{step.pk}/change/").content.decode()
    assert 'href="https://consent.example.com/agree?x=&lt;b&gt;"' in page and 'rel="noopener noreferrer"' in page
    assert 'name="action" value="decline"' in page
    workflow_questions.answer(run, step.name, None, by=boss)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert last_tool_result(run)["content"] == ["accept with visit-state-1 (retry 1 of this process)"]


def test_a_form_that_asks_for_a_secret_is_refused_at_the_edge_and_nothing_is_stored(counter: Path) -> None:
    run = Sneaky.run("Get the key.")
    assert run.status == RunStatus.DONE and not WorkflowStep.objects.filter(run_id=run.pk).exists()
    result = last_tool_result(run)
    assert "'api_token' asks for a secret" in result["error"] and "cannot be asked" in result["error"]


def test_a_server_that_never_stops_asking_is_stopped_past_the_rounds_bound(counter: Path) -> None:
    from nexo_django.core.mcp_input import MAX_ROUNDS

    boss = make_user("boss", "nexo_django.decide_toolcall")
    run = Forever.run("Go.")
    for _ in range(MAX_ROUNDS):
        workflow_questions.answer(run, asked(run).name, {"ok": True}, by=boss)
        run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert f"asked a person for input {MAX_ROUNDS} times and asks again" in last_tool_result(run)["error"]
    assert WorkflowStep.objects.filter(run_id=run.pk).count() == MAX_ROUNDS


COUNTED_STDIO = MCPServer.stdio("test", sys.executable, [SERVER_SCRIPT, "--transport", "stdio"],
                                env={"NEXO_TEST_MCP_COUNT": "${NEXO_TEST_MCP_COUNT}"}, timeout=10)


class CountedVisits(Agent):
    model = ScriptedModel([tool_call("visit"), reply("done")])
    permissions = Permissions("approve", mcp_allow=["visit"])
    mcp_servers = [COUNTED_STDIO]


@pytest.mark.redis
def test_a_worker_killed_between_the_answer_and_the_retry_retries_once(
    rq_worker: Any, monkeypatch: pytest.MonkeyPatch, counter: Path, tmp_path: Path
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from nexo_django.durable.recovery import reconcile
    from nexo_django.models import AgentRun
    from tests.servers import wait_until

    retries = tmp_path / "retries.txt"
    monkeypatch.setenv("NEXO_TEST_MCP_COUNT", str(retries))
    monkeypatch.setenv("NEXO_TEST_CRASH_AT", "input_answered")
    monkeypatch.setenv("NEXO_TEST_CRASH_ONCE", str(tmp_path / "crashed-once"))
    rq_worker(1)
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run = CountedVisits.run_later("Get consent.")
    step = wait_until(lambda: WorkflowStep.objects.filter(run_id=run.pk, status=StepStatus.WAITING).first(),
                      timeout=60, what="the server's question")
    wait_until(lambda: AgentRun.objects.filter(pk=run.pk, status=RunStatus.SUSPENDED).exists(), timeout=60,
               what="the suspension")
    workflow_questions.answer(run, step.name, None, by=boss)  # the worker takes the run, reads it, dies
    wait_until(lambda: (tmp_path / "crashed-once").exists(), timeout=60, what="the crash")
    time.sleep(0.3)
    assert not retries.exists()  # killed before the tool was called again
    # The worker read the answers before its first commit (a run is claimed by it): the run is still
    # queued, its job ended; the reconciler's round for queued runs sends it again (made old here).
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.QUEUED
    AgentRun.objects.filter(pk=run.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    assert reconcile(full=True).requeued == [str(run.pk)]
    done = wait_until(lambda: AgentRun.objects.filter(pk=run.pk, status__in=[RunStatus.DONE, RunStatus.FAILED,
                                                                            RunStatus.NEEDS_ATTENTION]).first(),
                      timeout=60, what="the run's end")
    assert (done.status, done.error) == (RunStatus.DONE, "")
    assert retries.read_text() == "accept\n"  # the retry, once


class WebElicits(Agent):
    """As ``Elicits``, over streamable HTTP (its server is set by the test: a port of its own)."""

    model = ScriptedModel([tool_call("ask"), reply("done")])
    permissions = Permissions("approve", mcp_allow=["ask"])
    mcp_servers: list[MCPServer] = []


def test_over_streamable_http_the_question_waits_and_the_retry_answers(
    monkeypatch: pytest.MonkeyPatch, counter: Path
) -> None:
    from tests.core.test_mcp import TOKEN_ENV, HTTPServer

    server = HTTPServer()
    try:
        monkeypatch.setenv(TOKEN_ENV, server.token)
        monkeypatch.setattr(WebElicits, "mcp_servers", [server.server()])
        boss = make_user("boss", "nexo_django.decide_toolcall")
        run = WebElicits.run("Ask me for a word.")
        assert run.status == RunStatus.SUSPENDED
        step = asked(run)
        assert step.question == "Which word?" and step.request["round"] == 1
        workflow_questions.answer(run, step.name, {"word": "http"}, by=boss)
        run.refresh_from_db()
        assert run.status == RunStatus.DONE and last_tool_result(run)["content"] == ["http"]
    finally:
        server.stop()


def test_a_cancelled_run_ends_its_mcp_questions(counter: Path) -> None:
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run = Elicits.run("Ask me for a word.")
    step = asked(run)
    assert run.cancel(by=boss, reason="not needed")
    step.refresh_from_db()
    assert step.status == StepStatus.EXPIRED
    with pytest.raises(AlreadyDecided, match="ended without an answer"):
        workflow_questions.answer(run, step.name, {"word": "late"}, by=boss)
