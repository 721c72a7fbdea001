"""Attacks on durable MCP elicitation and on questions' answers: a hostile MCP server written with
the mcp SDK (tests/hostile_mcp_server.py, over stdio) whose ``input_required`` a client must refuse
or bound, and answers that violate a question's formats. Each attack leaves the outside world
untouched: nothing stored, no answer recorded, the tool not called again (the server's own count).
Scripted models."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nexo_django import Agent, Permissions, Workflow
from nexo_django.core.mcp import MCPServer
from nexo_django.durable import workflow_questions
from nexo_django.errors import InvalidAnswer
from nexo_django.models import RunStatus, StepStatus, WorkflowStep
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.admin.support import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

HOSTILE_SCRIPT = str(Path(__file__).resolve().parent.parent / "hostile_mcp_server.py")
HOSTILE = MCPServer.stdio("hostile", sys.executable, [HOSTILE_SCRIPT],
                          env={"NEXO_TEST_MCP_COUNT": "${NEXO_TEST_MCP_COUNT}"}, timeout=20)


def calls(tool: str) -> type[Agent]:
    """An agent (scripted) that calls the hostile server's ``tool`` once, then replies."""
    return type(f"Calls_{tool}", (Agent,), {
        "__module__": __name__,
        "model": ScriptedModel([tool_call(tool), reply("done")]),
        "permissions": Permissions("approve", mcp_allow=[tool]),
        "mcp_servers": [HOSTILE],
    })


def tool_result(run: Any) -> Any:
    return [m for m in run.transcript() if m["role"] == "tool"][-1]["content"]


@pytest.fixture
def retries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "retries.txt"
    monkeypatch.setenv("NEXO_TEST_MCP_COUNT", str(path))
    return path


def count(retries: Path) -> list[str]:
    return retries.read_text().splitlines() if retries.exists() else []


@pytest.mark.parametrize(("tool", "reason"), [
    ("redos", "uses 'pattern'"),
    ("remote_ref", "uses '$ref'"),
    ("js_url", "not an http(s) URL"),
    ("file_url", "not an http(s) URL"),
    ("many", "1000 inputs at once"),
    ("huge_state", "requestState is"),
    ("nul_key", "is not 1-64 letters"),
    ("long_key", "is not 1-64 letters"),
    ("huge_schema", "bytes of JSON"),
    ("deep_schema", "nests more than"),
    ("password_format", "asks for a secret"),
])
def test_a_hostile_ask_is_refused_at_the_edge_and_nothing_is_stored(tool: str, reason: str, retries: Path) -> None:
    run = calls(tool).run("Go.")
    assert run.status == RunStatus.DONE, run.error
    assert not WorkflowStep.objects.filter(run_id=run.pk).exists()  # no question, nothing to answer
    result = tool_result(run)
    assert "cannot be asked" in result["error"] and reason in result["error"], result
    assert count(retries) == []  # never called again


def test_a_regex_over_the_answers_keys_is_dropped_before_it_is_stored(retries: Path) -> None:
    """The SDK reads the requested schema's top level as MCP defines it: patternProperties is gone."""
    run = calls("redos_keys").run("Go.")
    [step] = WorkflowStep.objects.filter(run_id=run.pk, status=StepStatus.WAITING)
    assert step.schema == {"type": "object", "properties": {"word": {"type": "string"}}}


def test_markup_in_a_servers_message_and_titles_is_stored_as_sent_and_drawn_escaped(retries: Path) -> None:
    from tests.admin.support import client_for

    boss = make_user("boss", "nexo_django.decide_toolcall", "nexo_django.view_agentrun")
    run = calls("markup").run("Go.")
    [step] = WorkflowStep.objects.filter(run_id=run.pk, status=StepStatus.WAITING)
    assert step.question.startswith("<script>alert(1)</script>")
    page = client_for(boss).get(f"/admin/nexo_django/openquestion/{step.pk}/change/").content.decode()
    assert "<script>alert(1)</script>" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_regex_from_the_server_is_never_run_on_an_answer(retries: Path) -> None:
    """Were the pattern stored, every answer would run it: "a" * 30 + "!" backtracks for minutes."""
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run = calls("redos").run("Go.")
    for step in WorkflowStep.objects.filter(run_id=run.pk, status=StepStatus.WAITING):  # none, once fixed
        started = time.monotonic()
        with contextlib.suppress(InvalidAnswer):
            workflow_questions.answer(run, step.name, {"word": "a" * 26 + "!"}, by=boss)
        assert time.monotonic() - started < 1.0
    assert not WorkflowStep.objects.filter(run_id=run.pk).exists()


def test_a_server_that_fails_on_the_retry_gives_the_model_its_error_once(retries: Path) -> None:
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run = calls("fails_on_retry").run("Go.")
    [step] = WorkflowStep.objects.filter(run_id=run.pk, status=StepStatus.WAITING)
    workflow_questions.answer(run, step.name, {"word": "kite"}, by=boss)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE, run.error
    assert "the server broke on the retry" in str(tool_result(run))
    assert count(retries) == ["fails_on_retry"]  # once, no second retry
    assert not WorkflowStep.objects.filter(run_id=run.pk, status=StepStatus.WAITING).exists()


def test_a_new_request_state_on_the_second_round_is_the_one_echoed(retries: Path) -> None:
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run = calls("shifty").run("Go.")
    for _ in range(2):
        [step] = WorkflowStep.objects.filter(run_id=run.pk, status=StepStatus.WAITING)
        workflow_questions.answer(run, step.name, {"word": "kite"}, by=boss)
        run.refresh_from_db()
    assert run.status == RunStatus.DONE, run.error
    assert tool_result(run)["content"] == ["finished with state-2"]
    assert count(retries) == ["shifty state-1", "shifty state-2"]


class AsksADate(Workflow):
    def call(self, payload: Any) -> Any:
        return self.ask("when", "When and whom?", schema={"type": "object", "properties": {
            "due": {"type": "string", "format": "date"}, "mail": {"type": "string", "format": "email"}}})


@pytest.mark.parametrize("value", [{"due": "next tuesday"}, {"due": "2027-02-31"}, {"mail": "nobody"}])
def test_an_answer_that_breaks_a_format_is_refused_from_python_too(value: Any, counter: Path) -> None:
    """The form refuses it; so must the one answering function (webhooks and the JSON endpoint)."""
    boss = make_user("boss", "nexo_django.decide_toolcall")
    run = AsksADate.run({})
    with pytest.raises(InvalidAnswer, match="is not a"):
        workflow_questions.answer(run, "when", value, by=boss)
    step = WorkflowStep.objects.get(run_id=run.pk, name="when")
    assert (step.status, step.answered_by) == (StepStatus.WAITING, None)
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
