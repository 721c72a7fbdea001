"""The user-facing run pages and JSON serve workflow runs: their steps, open questions and the calls
their agents wait on. Scripted agent, inline queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.admin.support import client_for, make_user
from tests.workflows_for_tests import Release

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
