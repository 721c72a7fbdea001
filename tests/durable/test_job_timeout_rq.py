"""rq's own job timeout under ``manage.py rqworker`` (found reading issue 26's worker): rq
raises ``JobTimeoutException``, an ``Exception``, from SIGALRM; landing in a tool it was made
the call's result and the run finished *done* past its timeout. Now the run fails with the
timeout, the tool's call is not reported as the tool's own failure, and rq files the job as
failed. Real redis-server, real rq workers (forking and simple), scripted model, scripted slow
tool."""

from __future__ import annotations

from typing import Any

import pytest
from rq.job import Job

from nexo_django.durable import dispatch
from nexo_django.models import AgentRun, RunMessage, RunStatus
from tests.durable_agents import SlowSleeper
from tests.servers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis]


@pytest.mark.parametrize("worker_class", ["rq.worker.Worker", "rq.worker.SimpleWorker"])
def test_a_job_timeout_inside_a_tool_fails_the_run_and_its_job_scripted(
    rq_worker: Any, settings: Any, worker_class: str
) -> None:
    settings.NEXO = {**settings.NEXO, "JOB_TIMEOUT": 2}
    workers = rq_worker(1, worker_class=worker_class)
    run = SlowSleeper.run_later("Rest.")  # its tool naps 4 s: the timeout lands inside it
    try:
        wait_until(lambda: AgentRun.objects.get(pk=run.pk).status == RunStatus.FAILED, timeout=30,
                   what="the run to fail")
    except TimeoutError:
        run.refresh_from_db()
        raise AssertionError(f"run is {run.status} ({run.error!r})\n{workers.logs()}") from None
    run.refresh_from_db()
    assert run.error == "JobTimeout: the job exceeded its timeout (2 seconds)"
    # the nap's call was asked for once and has no result: the timeout is not the tool's answer
    assert list(RunMessage.objects.filter(run=run).order_by("seq").values_list("role", flat=True)) == [
        "user", "assistant"]
    job = Job.fetch(dispatch.job_id(run.pk, run.generation), connection=dispatch.get_queue().connection)
    wait_until(lambda: job.get_status(refresh=True) == "failed", timeout=10, what="rq to file the job as failed")
    assert "JobTimeout" in (job.latest_result().exc_string or "")
