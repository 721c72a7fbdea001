"""Sending jobs: Redis unreachable at commit is logged and left to the reconciler (scripted models)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from nexo_django.durable import dispatch
from nexo_django.durable.recovery import reconcile
from nexo_django.models import AgentRun, RunStatus
from tests.durable_agents import Bumper
from tests.servers import free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable, pytest.mark.redis]


def redis_down(settings: Any, queue: Any) -> None:
    """Point the run queue at a loopback port nothing listens on."""
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, queue.name: {"URL": f"redis://127.0.0.1:{free_port()}/0"}}


def redis_up(settings: Any, queue: Any) -> None:
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, queue.name: {"URL": queue.url}}


def test_run_later_with_redis_down_returns_the_queued_run_and_logs(
    redis_queue_settings: Any, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    redis_down(settings, redis_queue_settings)
    with caplog.at_level(logging.WARNING, logger="nexo_django.dispatch"):
        run = Bumper.run_later("bump")
    assert run.status == RunStatus.QUEUED
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.QUEUED  # committed
    assert any("could not be sent" in r.getMessage() and str(run.pk) in r.getMessage() for r in caplog.records)
    redis_up(settings, redis_queue_settings)
    report = reconcile(stale_after=0)
    assert report.resent == [str(run.pk)]
    fresh = AgentRun.objects.get(pk=run.pk)
    assert dispatch.job_pending(fresh.pk, fresh.generation)


def test_approve_with_redis_down_records_the_decision_and_leaves_the_run_queued(
    redis_queue_settings: Any, settings: Any, counter: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = Bumper.run("bump")  # in this process: suspended on the gated bump
    [call] = run.pending_calls()
    redis_down(settings, redis_queue_settings)
    with caplog.at_level(logging.WARNING, logger="nexo_django.dispatch"):
        decision = call.approve(note="ok")
    assert decision.pk is not None and decision.note == "ok"
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.QUEUED
    assert any("could not be sent" in r.getMessage() for r in caplog.records)
    redis_up(settings, redis_queue_settings)
    assert reconcile(stale_after=0).resent == [str(run.pk)]


def test_reconcile_with_redis_down_logs_and_goes_on(
    redis_queue_settings: Any, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    run = Bumper.run_later("bump")
    redis_down(settings, redis_queue_settings)
    with caplog.at_level(logging.WARNING, logger="nexo_django.recovery"):
        report = reconcile(stale_after=0)
    assert report.resent == []
    assert any("Redis is unreachable" in r.getMessage() for r in caplog.records)
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.QUEUED


def test_a_pending_job_is_not_sent_twice(redis_queue_settings: Any) -> None:
    run = Bumper.run_later("bump")
    assert dispatch.job_pending(run.pk, run.generation)
    assert reconcile(stale_after=0).resent == []
