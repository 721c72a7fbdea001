"""A failed run is visible to operations (issue 33, point 3): the provider answers 401, and the
run is logged at ERROR with its id and why, and its job is in rq's failed job registry (what
django-rq's failed jobs page lists), not "Job OK" among the finished ones. The provider is a
loopback server speaking OpenAI's wire format; a real ``rqworker`` and Redis."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from rq import Queue
from rq.job import Job

from nexo_django.durable import dispatch
from nexo_django.models import RunStatus
from tests.durable_agents import Keyless
from tests.servers import wait_until
from tests.wire_server import Answer, WireServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

WAIT = 30.0
UNAUTHORIZED = {"error": {"message": "Incorrect API key provided: sk-wrong.", "type": "invalid_request_error",
                          "code": "invalid_api_key", "param": None}}  # fmt: skip


@pytest.fixture
def provider(settings: Any) -> Iterator[WireServer]:
    """The project's model on a loopback provider that refuses its key."""
    with WireServer() as server:
        settings.NEXO = {**settings.NEXO, "MODEL": "openai:gpt-test",
                         "PROVIDERS": {"openai": {"base_url": f"{server.url}/v1", "api_key": "sk-wrong"}}}  # fmt: skip
        yield server


def test_a_failed_run_is_logged_at_error_with_its_id_and_why(
    provider: WireServer, caplog: pytest.LogCaptureFixture
) -> None:
    provider.play(Answer(401, UNAUTHORIZED))
    with caplog.at_level(logging.ERROR, logger="nexo_django"):
        run = Keyless.run("Say hi.")
    assert run.status == RunStatus.FAILED and "HTTP 401" in run.error
    found = [r for r in caplog.records if r.levelno == logging.ERROR and str(run.pk) in r.getMessage()]
    assert len(found) == 1, caplog.records
    assert found[0].name == "nexo_django.runs" and "HTTP 401" in found[0].getMessage()
    assert "Incorrect API key provided" in found[0].getMessage()


@pytest.mark.redis
def test_a_failed_runs_job_is_in_rqs_failed_registry_and_the_worker_log_says_why(
    provider: WireServer, rq_worker: Any, redis_queue_settings: Any
) -> None:
    provider.play(Answer(401, UNAUTHORIZED))
    workers = rq_worker(worker_class="rq.worker.SimpleWorker")
    run = Keyless.run_later("Say hi.")
    job_id = dispatch.job_id(run.pk, run.generation)
    queue = Queue(redis_queue_settings.name, connection=dispatch.get_queue().connection)
    wait_until(lambda: job_id in queue.failed_job_registry.get_job_ids(), timeout=WAIT,
               what=f"the job in rq's failed registry:\n{workers.logs()}")  # fmt: skip
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "HTTP 401" in run.error
    assert job_id not in queue.finished_job_registry.get_job_ids()
    job = Job.fetch(job_id, connection=queue.connection)
    assert job.get_status() == "failed"
    why = job.latest_result().exc_string
    assert f"RunFailed: run {run.pk} failed: ProviderError: openai: HTTP 401" in why
    wait_until(lambda: "RunFailed" in workers.logs(), timeout=WAIT, what="the worker's log")
    log = workers.logs()
    assert f"run {run.pk} failed: ProviderError: openai: HTTP 401" in log and "Job OK" not in log
