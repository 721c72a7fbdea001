"""A worker on the wrong queue: queued runs age, and the reconciler, the run page and a check say
so (real Redis, real rq worker processes, scripted models)."""

from __future__ import annotations

import io
import logging
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from nexo_django.checks import check_workers
from nexo_django.durable import dispatch
from nexo_django.durable.queue_health import queue_warning
from nexo_django.durable.recovery import reconcile
from nexo_django.models import AgentRun, RunStatus
from tests.durable_agents import Scribe

# Not `durable`: what these test (Redis and the workers' registrations) does not depend on the
# database, so the PostgreSQL pass leaves them to the SQLite run (docs/testing.md).
pytestmark = [pytest.mark.django_db(transaction=True)]

OTHER = "elsewhere"


def age(run: AgentRun, minutes: int = 5) -> None:
    AgentRun.objects.filter(pk=run.pk).update(updated_at=timezone.now() - timedelta(minutes=minutes))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def wrong_queue_worker(rq_worker: Any, redis_queue_settings: Any, settings: Any) -> Any:
    """One real worker that listens on "elsewhere", not on the run queue."""
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, OTHER: {"URL": redis_queue_settings.url}}
    return rq_worker(1, queues=[OTHER])


def test_an_inline_queue_needs_no_worker_and_touches_no_redis(settings: Any) -> None:
    settings.RQ_QUEUES = {"default": {"ASYNC": False}}
    assert dispatch.workers_listening() is None
    assert queue_warning() is None


@pytest.mark.redis
def test_workers_listening_names_the_workers_of_each_queue(wrong_queue_worker: Any, redis_queue_settings: Any) -> None:
    assert dispatch.workers_listening() == []
    [name] = dispatch.workers_listening(OTHER) or []
    assert name


@pytest.mark.redis
def test_workers_listening_sees_a_worker_on_the_run_queue(rq_worker: Any) -> None:
    rq_worker(1)
    assert len(dispatch.workers_listening() or []) == 1


def test_workers_listening_with_redis_down_is_a_connection_error(settings: Any) -> None:
    settings.RQ_QUEUES = {"default": {"URL": f"redis://127.0.0.1:{closed_port()}/0"}}
    with pytest.raises(ConnectionError, match="Redis of queue 'default' cannot be reached"):
        dispatch.workers_listening()


@pytest.mark.redis
def test_the_reconciler_warns_when_queued_runs_age_on_a_queue_nobody_listens_on(
    wrong_queue_worker: Any, redis_queue_settings: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = Scribe.run_later("write hi", cwd=tmp_path)
    assert reconcile().warnings == []  # just queued: not waiting yet
    age(run)
    [warning] = reconcile().warnings
    assert "1 run(s) have waited in queue 'nexo_test'" in warning
    assert "no rq worker listens on it" in warning
    assert "python manage.py rqworker nexo_test" in warning
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.QUEUED

    out, err = io.StringIO(), io.StringIO()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nexo_django.recovery"):
        call_command("nexo_reconcile", stdout=out, stderr=err)
    assert "requeued=0" in out.getvalue()
    # Once: written by the command, not also logged (with no logging configured, both reach stderr).
    assert err.getvalue().count("1 run(s) have waited in queue 'nexo_test'") == 1
    assert "warning: 1 run(s) have waited in queue 'nexo_test'" in err.getvalue()
    assert [r for r in caplog.records if "have waited in queue" in r.getMessage()] == []


@pytest.mark.redis
def test_no_warning_when_a_worker_listens_on_the_run_queue(rq_worker: Any, tmp_path: Path) -> None:
    rq_worker(1)
    run = AgentRun.objects.create(agent=Scribe.path(), prompt="x", status=RunStatus.QUEUED, generation=1)
    age(run)
    assert queue_warning() is None
    assert reconcile().warnings == []


@pytest.mark.redis
def test_the_run_page_says_nobody_works_on_a_waiting_run(
    wrong_queue_worker: Any, redis_queue_settings: Any, tmp_path: Path, django_user_model: Any, example: Path
) -> None:
    ann = django_user_model.objects.create_user("ann", password="x")
    run = Scribe.run_later("write hi", cwd=tmp_path, user=ann)
    client = Client()
    client.force_login(ann)
    fresh = client.get(f"/runs/{run.pk}/")
    assert fresh.status_code == 200
    assert 'id="queue-warning"' not in fresh.content.decode()
    age(run)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    # The person who started it reads a plain status; the command that fixes it is staff's.
    assert 'id="queue-warning"' not in page and 'id="run-waiting"' in page
    assert "rqworker" not in page

    admin = Client()
    vic = django_user_model.objects.create_user("vic", password="x", is_staff=True)
    vic.user_permissions.add(Permission.objects.get(content_type__app_label="nexo_django", codename="view_agentrun"))
    admin.force_login(vic)
    staff_page = admin.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="queue-warning"' in staff_page
    assert "python manage.py rqworker nexo_test" in staff_page
    admin_page = admin.get(f"/admin/nexo_django/agentrun/{run.pk}/change/")
    assert admin_page.status_code == 200
    assert 'id="queue-warning"' in admin_page.content.decode()


@pytest.mark.redis
def test_the_check_warns_w002_only_when_asked_to_look_at_the_database(
    wrong_queue_worker: Any, redis_queue_settings: Any, tmp_path: Path
) -> None:
    age(Scribe.run_later("write hi", cwd=tmp_path))
    [message] = check_workers(databases=["default"])
    assert message.id == "nexo_django.W004"
    assert "rqworker nexo_test" in message.hint
    assert check_workers(databases=None) == []
    out, err = io.StringIO(), io.StringIO()
    call_command("check", stdout=out, stderr=err)
    assert "W004" not in out.getvalue() + err.getvalue()
    call_command("check", "--database", "default", stdout=out, stderr=err)
    assert "nexo_django.W004" in out.getvalue() + err.getvalue()


def test_the_check_with_redis_down_is_a_warning_and_check_still_passes(settings: Any) -> None:
    run = AgentRun.objects.create(agent=Scribe.path(), prompt="x", status=RunStatus.QUEUED, generation=1)
    age(run)
    settings.RQ_QUEUES = {"default": {"URL": f"redis://127.0.0.1:{closed_port()}/0"}}
    [message] = check_workers(databases=["default"])
    assert message.id == "nexo_django.W005"
    assert "cannot be asked whether a worker listens" in message.msg
    out, err = io.StringIO(), io.StringIO()
    call_command("check", "--database", "default", stdout=out, stderr=err)  # warnings do not fail it
    assert "nexo_django.W005" in out.getvalue() + err.getvalue()


def test_the_check_with_an_inline_queue_is_silent(settings: Any) -> None:
    settings.RQ_QUEUES = {"default": {"ASYNC": False}}
    age(AgentRun.objects.create(agent=Scribe.path(), prompt="x", status=RunStatus.QUEUED, generation=1))
    assert check_workers(databases=["default"]) == []
