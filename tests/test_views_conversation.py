"""A conversation on the run pages (issue 25, point 1): each run links to the one before and after,
the conversation is listed as a whole, the owner asks a follow-up, and nobody sees or continues
another person's conversation. Scripted agent, inline queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission

from nexo_django.models import AgentRun, RunStatus
from tests.admin.support import client_for, csrf_post, run_url
from tests.durable.test_follow_ups import Chatty

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


@pytest.fixture(autouse=True)
def _fresh_script() -> None:
    Chatty.model.requests.clear()


def _user(django_user_model: Any, name: str, *codenames: str, staff: bool = False) -> Any:
    user = django_user_model.objects.create_user(name, password="x", is_staff=staff)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="nexo_django", codename=codename))
    return user


def test_the_owner_asks_a_follow_up_on_the_run_page_scripted(example: Path, django_user_model: Any) -> None:
    ann = _user(django_user_model, "ann")
    first = Chatty.run("Capital of France?", user=ann)
    client = client_for(ann)
    page = client.get(f"/runs/{first.pk}/").content.decode()
    assert 'id="follow-up-form"' in page and 'id="conversation"' not in page  # a conversation of one
    response = csrf_post(client, f"/runs/{first.pk}/", {"action": "follow_up", "prompt": "Write it down."})
    second = AgentRun.objects.get(previous=first)
    assert response.status_code == 302 and response["Location"] == f"/runs/{second.pk}/"
    assert second.created_by_id == ann.pk and second.status == RunStatus.SUSPENDED
    page = client.get(f"/runs/{second.pk}/").content.decode()
    assert f'href="/runs/{first.pk}/" id="previous-run"' in page
    assert "Capital of France?" in page and "Paris." in page  # the earlier run, in the conversation
    assert 'id="follow-up-form"' not in page  # it waits for a decision
    page = client.get(f"/runs/{first.pk}/").content.decode()
    assert f'href="/runs/{second.pk}/" id="next-run"' in page
    assert 'id="follow-up-form"' not in page  # followed up already: the last run takes the next one


def test_nobody_follows_up_on_another_persons_run(example: Path, django_user_model: Any) -> None:
    ann = _user(django_user_model, "ann")
    bob = _user(django_user_model, "bob")
    staff = _user(django_user_model, "sam", "view_agentrun", staff=True)
    first = Chatty.run("Capital of France?", user=ann)
    assert client_for(bob).get(f"/runs/{first.pk}/").status_code == 404
    response = csrf_post(client_for(bob), f"/runs/{first.pk}/", {"action": "follow_up", "prompt": "mine now"})
    assert response.status_code == 404
    sam = client_for(staff)
    assert 'id="follow-up-form"' not in sam.get(f"/runs/{first.pk}/").content.decode()
    response = csrf_post(sam, f"/runs/{first.pk}/", {"action": "follow_up", "prompt": "mine now"})
    assert response.status_code == 403
    assert AgentRun.objects.count() == 1


def test_an_earlier_run_of_another_person_is_not_shown(example: Path, django_user_model: Any) -> None:
    ann = _user(django_user_model, "ann")
    bob = _user(django_user_model, "bob")
    first = Chatty.run("Ann's secret question", user=ann)
    second = first.follow_up("Bob's question", user=bob)  # the API lets a program do this
    page = client_for(bob).get(f"/runs/{second.pk}/").content.decode()
    assert "A run you cannot see." in page
    assert "Ann&#x27;s secret question" not in page and "Ann's secret question" not in page
    assert 'id="previous-run"' not in page


def test_a_refused_follow_up_on_the_page_says_why(example: Path, django_user_model: Any) -> None:
    ann = _user(django_user_model, "ann")
    first = Chatty.run("Capital of France?", user=ann)
    client = client_for(ann)
    assert csrf_post(client, f"/runs/{first.pk}/", {"action": "follow_up", "prompt": "  "}).status_code == 400
    assert AgentRun.objects.count() == 1


def test_the_admin_run_page_shows_the_conversation_with_links(example: Path, django_user_model: Any) -> None:
    staff = _user(django_user_model, "sam", "view_agentrun", staff=True)
    first = Chatty.run("Capital of France?")
    second = first.follow_up("Write it down.")
    page = client_for(staff).get(run_url(second)).content.decode()
    assert f'href="{run_url(first)}" id="previous-run"' in page
    assert 'id="conversation"' in page and "Capital of France?" in page and "Paris." in page
    page = client_for(staff).get(run_url(first)).content.decode()
    assert f'href="{run_url(second)}" id="next-run"' in page
