"""The example project's workflow (PublishNotes) from its home page to the end: the Scribe inside
waits for its publish to be approved, a person answers where to announce. Scripted agent, inline
queue."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from example_project.notes.agents import NOTES
from nexo_django.durable.workflow_runs import WorkflowRun
from nexo_django.models import AgentRun, RunKind, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_home_page_starts_the_workflow_which_finishes_after_an_approval_and_an_answer(example: Path) -> None:
    ada = User.objects.create_user("ada")
    client = Client()
    client.force_login(ada)
    assert 'id="start-workflow"' in client.get("/").content.decode()
    response = client.post("/workflow/", {"version": "2.1"})
    run = WorkflowRun(AgentRun.objects.get(kind=RunKind.WORKFLOW))
    assert response["Location"] == f"/runs/{run.pk}/"
    assert run.status == RunStatus.SUSPENDED and run.created_by == ada
    [call] = run.pending_calls()
    assert call.args["path"] == "published/notes.md"
    boss = User.objects.create_user("boss")
    boss.user_permissions.add(Permission.objects.get(codename="decide_toolcall"))
    call.approve(by=boss)
    assert (example / "published" / "notes.md").read_text() == NOTES  # the Scribe acted in the workflow's folder
    run.refresh_from_db()
    [question] = run.questions()
    assert question.key == "channel"
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Where should the release notes be announced?" in page
    run.answer("channel", "blog", by=boss)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert run.result["announced"] == {"channel": "blog", "text": "Release notes for 2.1 are out."}
    assert run.result["notes"].startswith("(scripted model)")
