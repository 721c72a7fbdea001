"""``run.retry(by=)`` takes a ``failed`` run back up where it stopped (issue 24, item 2): nothing
that ran runs again, the model is asked from the last committed turn. Scripted model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from nexo_django import Agent
from nexo_django.core.errors import ModelError
from nexo_django.models import RunEvent, RunStatus
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.admin.support import approver, client_for, csrf_post, run_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

#: While true, the scripted model answers as a provider that is down does, after its retries.
SERVER_DOWN = {"down": False}


class DownableModel(ScriptedModel):
    """Scripted; raises ``ModelError`` while ``SERVER_DOWN["down"]``, like a provider client whose
    server refuses connections."""

    def complete(self, messages: list[dict], tools: list[dict]) -> Any:
        if SERVER_DOWN["down"]:
            self.requests.append({"down": True})
            raise ModelError("openai: cannot reach http://127.0.0.1:9/v1 after 3 attempts: connection refused")
        return super().complete(messages, tools)


class Notetaker(Agent):
    """Scripted: writes notes.txt under approve, then answers."""

    model = DownableModel([tool_call("write", path="notes.txt", content="hi"), reply("Noted.")])
    sandbox = "local"
    permissions = "approve"


@pytest.fixture
def ann() -> Any:
    return approver()


@pytest.fixture(autouse=True)
def _server_up() -> Any:
    SERVER_DOWN["down"] = False
    Notetaker.model.requests.clear()
    yield
    SERVER_DOWN["down"] = False


def _failed_after_the_write(tmp_path: Path, ann: Any) -> Any:
    run = Notetaker.run("take a note", cwd=tmp_path)
    [call] = run.pending_calls()
    SERVER_DOWN["down"] = True
    call.approve(by=ann)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "cannot reach" in run.error
    assert (tmp_path / "notes.txt").read_text() == "hi"
    SERVER_DOWN["down"] = False
    return run


def _tool_runs(run: Any) -> int:
    return RunEvent.objects.filter(run=run, type="tool_call").count()


def test_a_failed_run_is_taken_back_up_from_its_last_committed_turn_scripted(tmp_path: Path, ann: Any) -> None:
    run = _failed_after_the_write(tmp_path, ann)
    (tmp_path / "notes.txt").write_text("edited by hand after the failure")
    asked_before, ran_before = len(Notetaker.model.requests), _tool_runs(run)
    assert run.retry(by=ann) is True
    run.refresh_from_db()
    assert run.status == RunStatus.DONE and run.result == "Noted." and run.error == ""
    # the write ran once: not again on retry (the hand edit survives), its approval not lost
    assert (tmp_path / "notes.txt").read_text() == "edited by hand after the failure"
    assert _tool_runs(run) == ran_before
    assert [m["role"] for m in run.transcript()].count("tool") == 1
    # the model was asked once more, for the turn that failed, with the write's result in it
    [request] = Notetaker.model.requests[asked_before:]
    assert request["messages"][-1]["role"] == "tool"
    assert RunEvent.objects.filter(run=run, type="retried").count() == 1


def test_retry_of_a_failed_run_is_a_compare_and_set_scripted(tmp_path: Path, ann: Any) -> None:
    run = _failed_after_the_write(tmp_path, ann)
    ran_before = _tool_runs(run)
    SERVER_DOWN["down"] = True  # the retried run fails again, and can be retried again
    assert run.retry(by=ann) is True
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    SERVER_DOWN["down"] = False
    assert run.retry() is True
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert run.retry() is False  # a done run is not retried
    assert _tool_runs(run) == ran_before


def test_the_admin_retries_a_failed_run_scripted(tmp_path: Path, ann: Any) -> None:
    run = _failed_after_the_write(tmp_path, ann)
    ran_before = _tool_runs(run)
    client = client_for(ann)
    page = client.get(run_url(run)).content.decode()
    assert 'id="retry-run"' in page
    response = csrf_post(client, run_url(run), {"action": "retry"})
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert _tool_runs(run) == ran_before


class Escaper(Agent):
    """Scripted: a write through a folder that becomes a link out of the workspace once approved
    (refused loudly when it runs), then an answer."""

    model = ScriptedModel([tool_call("write", path="sub/outside.txt", content="x"), reply("Gave up.")])
    sandbox = "local"
    permissions = "approve"


def test_a_call_that_failed_the_run_is_not_run_again_on_retry_scripted(tmp_path: Path, ann: Any) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    run = Escaper.run("escape", cwd=workspace)
    [call] = run.pending_calls()
    with transaction.atomic():  # the link appears after the approval, before the run goes on
        call.approve(by=ann)
        (workspace / "sub").symlink_to(tmp_path)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "SecurityError" in run.error
    assert run.retry(by=ann) is True
    run.refresh_from_db()
    assert run.status == RunStatus.DONE and run.result == "Gave up."
    assert RunEvent.objects.filter(run=run, type="security").count() == 1  # refused once, not twice
    assert not (tmp_path / "outside.txt").exists()
    [result] = [m for m in run.transcript() if m["role"] == "tool"]
    assert "error" in result["content"]
