"""The example's chat page under WSGI (the Django test client), issue 25 point 4: ask, the call
waits inline with a link to its decision page, approve, the answer; a follow-up continues the
conversation; nobody else asks in it. Scripted model (the Helper's story), inline queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission

from example_project.notes.agents import CHAT_ANSWER, FOLLOW_UP_ANSWER, SUMMARY
from nexo_django.models import AgentRun, RunStatus
from tests.admin.support import client_for, csrf_post

pytestmark = [pytest.mark.django_db(transaction=True)]


def _approver(django_user_model: Any) -> Any:
    user = django_user_model.objects.create_user("ann", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="decide_toolcall"),
                              *Permission.objects.filter(codename__startswith="view_", content_type__app_label="nexo_django"))
    return user


def test_ask_approve_inline_and_follow_up_on_the_chat_page_scripted(example: Path, django_user_model: Any) -> None:
    ann = _approver(django_user_model)
    client = client_for(ann)
    response = csrf_post(client, "/chat/", {"prompt": "Summarise the release."})
    run = AgentRun.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/chat/{run.pk}/"
    page = client.get(f"/chat/{run.pk}/").content.decode()
    assert AgentRun.objects.get().status == RunStatus.SUSPENDED
    assert 'id="waiting"' in page and "published/summary.md" in page and 'class="decide-link"' in page
    assert '"stream": null' in page  # under WSGI the page polls the status
    AgentRun.objects.get().pending_calls().get().approve(by=ann)
    page = client.get(f"/chat/{run.pk}/").content.decode()
    assert CHAT_ANSWER in page and 'id="ask"' in page
    assert (example / "published" / "summary.md").read_text() == SUMMARY
    response = csrf_post(client, f"/chat/{run.pk}/", {"prompt": "What did I ask you?"})
    follow = AgentRun.objects.get(previous=run)
    assert response["Location"] == f"/chat/{follow.pk}/" and follow.status == RunStatus.DONE
    page = client.get(f"/chat/{follow.pk}/").content.decode()
    assert "Summarise the release." in page and CHAT_ANSWER in page and FOLLOW_UP_ANSWER in page
    page = client.get(f"/chat/{run.pk}/").content.decode()
    assert 'id="latest"' in page and 'id="ask"' in page  # the form is the last run's


def test_nobody_else_asks_in_a_conversation(example: Path, django_user_model: Any) -> None:
    ann = _approver(django_user_model)
    bob = django_user_model.objects.create_user("bob", password="x")
    csrf_post(client_for(ann), "/chat/", {"prompt": "Summarise the release."})
    run = AgentRun.objects.get()
    run.pending_calls().get().approve(by=ann)
    assert client_for(bob).get(f"/chat/{run.pk}/").status_code == 404
    assert csrf_post(client_for(bob), f"/chat/{run.pk}/", {"prompt": "mine"}).status_code == 404
    assert AgentRun.objects.count() == 1
