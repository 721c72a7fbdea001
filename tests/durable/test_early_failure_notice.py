"""A run that fails before its journal exists (its agent cannot be imported or built by the
worker) still sends its ``run.failed`` notice through the outbox, in the commit that fails it
(scripted agents; a loopback webhook receiver)."""

from __future__ import annotations

from typing import Any

import pytest

from nexo_django.durable.runs import execute_run
from nexo_django.models import AgentRun, Notice, NoticeStatus, RunStatus
from tests.channel_servers import WebhookReceiver
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SECRET = "whsec-test"


@pytest.mark.parametrize(("agent", "options", "reason"), [
    ("tests.no_such_module.Agent", {}, "cannot import agent 'tests.no_such_module.Agent'"),
    (Scribe.path(), {"permissions": "no-such-mode"}, "no-such-mode"),  # the worker cannot build it
])
def test_a_queued_run_that_cannot_be_built_sends_its_run_failed_notice(
        settings: Any, agent: str, options: dict[str, Any], reason: str) -> None:
    with WebhookReceiver(SECRET) as receiver:
        settings.NEXO = {"CHANNELS": {"audit": {"BACKEND": "webhook", "URL": receiver.url, "SECRET": SECRET,
                                                "ALLOW_PRIVATE": ["127.0.0.1"], "EVENTS": ["run.failed"]}}}
        run = AgentRun.objects.create(agent=agent, prompt="x", status=RunStatus.QUEUED, options=options)
        assert execute_run(str(run.pk)) == "failed"
        run.refresh_from_db()
        assert run.status == RunStatus.FAILED and reason in run.error
        [notice] = Notice.objects.filter(run=run)
        assert notice.kind == "run.failed" and notice.status == NoticeStatus.DELIVERED
        [event] = receiver.posts
        assert event["type"] == "run.failed" and event["run"]["id"] == str(run.pk) and event["run"]["status"] == "failed"
        assert execute_run(str(run.pk)) == "skipped"  # and once: a second job sends nothing more
        assert Notice.objects.filter(run=run).count() == 1 and len(receiver.posts) == 1
