"""After a real Redis restart (persistence off: every key gone), live workers that take jobs are
not reported as missing by the check, the reconciler or the run page (issue 24, item 3). Real
redis-server, real rqworker processes, scripted models."""

from __future__ import annotations

import io
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
from tests.servers import wait_until

# Not `durable`: what these test (Redis and the workers' registrations) does not depend on the
# database, so the PostgreSQL pass leaves them to the SQLite run (docs/testing.md).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis]

OTHER = "elsewhere"


def _aged(run: AgentRun) -> AgentRun:
    AgentRun.objects.filter(pk=run.pk).update(updated_at=timezone.now() - timedelta(minutes=5))
    return AgentRun.objects.get(pk=run.pk)


def _restart_and_wait_for_heartbeats(redis_queue_settings: Any, count: int) -> None:
    redis_queue_settings.server.restart()
    with redis_queue_settings.server.client() as client:
        # Each live worker's next heartbeat writes its key again (within a second or two).
        wait_until(lambda: len(list(client.scan_iter(match="rq:worker:*"))) >= count, timeout=20,
                   what="the workers' heartbeats after the restart")
        assert client.smembers("rq:workers") == set()  # the registrations are gone for good


def test_live_workers_after_a_redis_restart_are_not_reported_missing_scripted(
    rq_worker: Any, redis_queue_settings: Any, tmp_path: Path, django_user_model: Any, example: Path
) -> None:
    rq_worker(2)
    assert len(dispatch.workers_listening() or []) == 2
    _restart_and_wait_for_heartbeats(redis_queue_settings, 2)
    assert len(dispatch.workers_listening() or []) == 2

    # The workers do take jobs: a run started now is driven to its approval.
    taken = Scribe.run_later("write hi", cwd=tmp_path)
    wait_until(lambda: AgentRun.objects.get(pk=taken.pk).status == RunStatus.SUSPENDED, timeout=30,
               what="a worker to take the run")

    # A run that waited while its job was lost with Redis: nobody claims "no worker".
    waiting = _aged(AgentRun.objects.create(agent=Scribe.path(), prompt="x", status=RunStatus.QUEUED, generation=1))
    assert queue_warning() is None and queue_warning(run=waiting) is None
    assert check_workers(databases=["default"]) == []
    assert reconcile().warnings == []
    err = io.StringIO()
    call_command("nexo_reconcile", stdout=io.StringIO(), stderr=err)
    assert "no rq worker listens" not in err.getvalue()
    vic = django_user_model.objects.create_user("vic", password="x", is_staff=True)
    vic.user_permissions.add(Permission.objects.get(content_type__app_label="nexo_django", codename="view_agentrun"))
    client = Client()
    client.force_login(vic)
    waiting = _aged(waiting)
    assert 'id="queue-warning"' not in client.get(f"/runs/{waiting.pk}/").content.decode()


def test_a_worker_registered_on_another_queue_is_still_reported(
    rq_worker: Any, redis_queue_settings: Any, settings: Any
) -> None:
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, OTHER: {"URL": redis_queue_settings.url}}
    rq_worker(1, queues=[OTHER])
    waiting = _aged(AgentRun.objects.create(agent=Scribe.path(), prompt="x", status=RunStatus.QUEUED, generation=1))
    warning = queue_warning(run=waiting)
    assert warning is not None and "no rq worker listens" in str(warning)
