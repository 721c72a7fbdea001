"""The user's run pages: the person who started a run reads a plain status; staff read the
operator's detail (issue 24, items 4 and 5). Scripted models; Redis down is a closed loopback port."""

from __future__ import annotations

import json
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from nexo_django.models import AgentRun, RunStatus
from tests.durable_agents import Scribe

# Not `durable`: who sees which words does not depend on the database, so the PostgreSQL pass
# leaves it to the SQLite run (docs/testing.md).
pytestmark = [pytest.mark.django_db(transaction=True)]

LEAKS = ("Error 111", "127.0.0.1", "rqworker", "Traceback", "ModelError", "Nobody is working")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ann(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("ann", password="x")


@pytest.fixture
def staff(django_user_model: Any) -> Any:
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("vic", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(content_type__app_label="nexo_django", codename="view_agentrun"))
    return user


def _page(user: Any, run: AgentRun, suffix: str = "") -> str:
    client = Client()
    client.force_login(user)
    response = client.get(f"/runs/{run.pk}/{suffix}")
    assert response.status_code == 200
    return response.content.decode()


def test_redis_down_reaches_the_user_as_a_plain_wait_and_staff_as_the_error(
    ann: Any, staff: Any, settings: Any, example: Path
) -> None:
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, "nexo_test": {"URL": f"redis://127.0.0.1:{_closed_port()}/0"}}
    settings.NEXO = {**settings.NEXO, "QUEUE": "nexo_test"}
    run = AgentRun.objects.create(agent=Scribe.path(), prompt="x", status=RunStatus.QUEUED, generation=1, created_by=ann)
    AgentRun.objects.filter(pk=run.pk).update(updated_at=timezone.now() - timedelta(minutes=5))
    page = _page(ann, run)
    assert 'id="run-waiting"' in page
    assert not [leak for leak in LEAKS if leak in page]
    staff_page = _page(staff, run)
    assert 'id="queue-warning"' in staff_page and "cannot be asked whether a worker listens" in staff_page


def test_a_failed_runs_error_is_plain_for_its_starter_and_whole_for_staff(ann: Any, staff: Any, example: Path) -> None:
    error = "ModelError: openai: cannot reach http://127.0.0.1:37995/v1 after 3 attempts: Error 111 connecting"
    run = AgentRun.objects.create(agent=Scribe.path(), prompt="x", status=RunStatus.FAILED, error=error, created_by=ann)
    page = _page(ann, run)
    assert "stopped because of an error" in page
    assert not [leak for leak in LEAKS if leak in page]
    status = json.loads(_page(ann, run, "status/"))
    assert status["error"].startswith("This run stopped because of an error")
    assert error in _page(staff, run)
    assert json.loads(_page(staff, run, "status/"))["error"] == error


def test_a_cancel_reason_is_the_users_to_read(ann: Any, example: Path) -> None:
    run = AgentRun.objects.create(agent=Scribe.path(), prompt="x", status=RunStatus.CANCELLED,
                                  error="cancelled by ann: wrong prompt", created_by=ann)
    assert "cancelled by ann: wrong prompt" in _page(ann, run)


def test_a_run_that_needs_attention_links_staff_to_what_to_decide(ann: Any, staff: Any, example: Path) -> None:
    run = AgentRun.objects.create(
        agent=Scribe.path(), prompt="x", status=RunStatus.NEEDS_ATTENTION, created_by=ann,
        error="the worker stopped while write (call_0_0) ran; its outcome is unknown and it was not run again. "
              "A person must decide.",
    )
    page = _page(ann, run)
    assert "waits for a person to look at it" in page and 'id="run-attention"' not in page
    staff_page = _page(staff, run)
    assert f'href="/admin/nexo_django/agentrun/{run.pk}/change/"' in staff_page
