"""The user's run page cancels the user's own run, in headless Chromium against a live server
(issue 24, item 9): a real form post with its CSRF token. Scripted agent, inline queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from selenium.webdriver.common.by import By

from nexo_django.models import AgentRun, CallStatus, RunStatus
from tests.browsing import click, log_in_with_session, read, settled, waiting
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WAIT = 15


def test_a_user_cancels_their_own_waiting_run_on_its_page_scripted(
    browser: Any, live_server: Any, example: Path, tmp_path: Path, django_user_model: Any
) -> None:
    ann = django_user_model.objects.create_user("ann", password="x")
    run = Scribe.run("write hi", cwd=tmp_path, user=ann)
    assert run.status == RunStatus.SUSPENDED
    log_in_with_session(browser, live_server.url, ann, "/runs/")
    browser.get(f"{live_server.url}/runs/{run.pk}/")
    click(browser, By.ID, "cancel-run")
    waiting(browser, WAIT).until(lambda d: read(d, "#run-status", "data-status") == RunStatus.CANCELLED and settled(d))
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and "cancelled by ann" in run.error
    assert run.tool_calls.get().status == CallStatus.EXPIRED
    assert not (tmp_path / "notes.txt").exists()
    assert not browser.find_elements(By.ID, "cancel-run")  # a finished run has no button


def test_nobody_cancels_a_run_that_is_not_theirs(example: Path, tmp_path: Path, django_user_model: Any) -> None:
    from django.contrib.auth.models import Permission

    ann = django_user_model.objects.create_user("ann", password="x")
    vic = django_user_model.objects.create_user("vic", password="x")
    vic.user_permissions.add(Permission.objects.get(content_type__app_label="nexo_django", codename="view_agentrun"))
    run = Scribe.run("write hi", cwd=tmp_path, user=ann)
    client = Client()
    client.force_login(vic)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="cancel-run"' not in page
    assert client.post(f"/runs/{run.pk}/", {"action": "cancel"}).status_code == 403
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.SUSPENDED
