"""A real PostgreSQL restart under real rqworker processes (scripted models).

The test process's default database is pointed, for these tests only, at a PostgreSQL cluster
of their own, so they can restart it: the workers and the test process share it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from nexo_django.durable import dispatch
from nexo_django.durable.recovery import reconcile
from nexo_django.models import AgentRun, RunStatus
from tests.durable_agents import Scribe
from tests.rq_workers import RQWorkers
from tests.servers import PostgresServer, default_database_on_own_cluster, free_port, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

REPO_ROOT = Path(__file__).resolve().parents[2]
WAIT = 30.0


@pytest.fixture
def own_postgres(django_db_blocker: Any) -> Iterator[PostgresServer]:
    """The default database, for this test, on a PostgreSQL cluster the test may restart."""
    with default_database_on_own_cluster("nexo_restarts", django_db_blocker) as server:
        yield server


def start_workers(server: PostgresServer, queue: Any, settings: Any, tmp_path: Path, worker_class: str) -> RQWorkers:
    import json

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "PYTHONUNBUFFERED": "1",
        "DATABASE_URL": server.url,
        "REDIS_URL": queue.url,
        "NEXO_TEST_RQ_QUEUES": json.dumps(settings.RQ_QUEUES),
        "NEXO_TEST_NEXO_SETTINGS": json.dumps(settings.NEXO),
    }
    env.pop("NEXO_TEST_DB_NAME", None)
    return RQWorkers(queues=[queue.name], redis_url=queue.url, env=env, log_dir=tmp_path, count=1,
                     worker_class=worker_class, cwd=REPO_ROOT).start()  # fmt: skip


def status_of(run: AgentRun) -> str:
    return str(AgentRun.objects.get(pk=run.pk).status)


def wait_reconciled(run: AgentRun, status: str, workers: RQWorkers) -> None:
    """Reconcile (every lost or failed job is sent again) until the run reaches ``status``."""

    def reached() -> bool:
        reconcile(stale_after=0)
        return status_of(run) == status

    try:
        wait_until(reached, timeout=WAIT, interval=0.5, what=f"run {run.pk} to reach {status}")
    except TimeoutError:
        raise AssertionError(f"run is {status_of(run)}, expected {status}\n{workers.logs()}") from None


def test_simple_worker_keeps_working_after_a_postgres_restart(
    own_postgres: PostgresServer, redis_queue_settings: Any, settings: Any, tmp_path: Path
) -> None:
    workers = start_workers(own_postgres, redis_queue_settings, settings, tmp_path, "rq.worker.SimpleWorker")
    try:
        first = Scribe.run_later("Write 'hi'", cwd=tmp_path)
        wait_until(lambda: status_of(first) == RunStatus.SUSPENDED, timeout=WAIT, what="the first run")
        own_postgres.restart()  # every open connection is cut
        connections.close_all()
        second = Scribe.run_later("Write 'hi'", cwd=tmp_path)
        wait_reconciled(second, RunStatus.SUSPENDED, workers)
        assert workers.alive() == [True]
    finally:
        workers.stop()


def test_job_that_failed_while_postgres_was_down_is_sent_again(
    own_postgres: PostgresServer, redis_queue_settings: Any, settings: Any, tmp_path: Path
) -> None:
    from rq.job import Job

    workers = start_workers(own_postgres, redis_queue_settings, settings, tmp_path, "rq.worker.Worker")
    try:
        # A queued run whose job is not sent yet (Redis was unreachable at commit).
        settings.RQ_QUEUES = {**settings.RQ_QUEUES, redis_queue_settings.name: {"URL": f"redis://127.0.0.1:{free_port()}/0"}}
        run = Scribe.run_later("Write 'hi'", cwd=tmp_path)
        settings.RQ_QUEUES = {**settings.RQ_QUEUES, redis_queue_settings.name: {"URL": redis_queue_settings.url}}
        own_postgres.halt()
        connections.close_all()
        dispatch.send(str(run.pk), run.generation)  # a worker takes it while the database is down
        job = Job.fetch(dispatch.job_id(run.pk, run.generation), connection=dispatch.get_queue().connection)
        wait_until(lambda: job.get_status(refresh=True) == "failed", timeout=WAIT, what="the job to fail")
        own_postgres.restart()
        assert status_of(run) == RunStatus.QUEUED
        wait_reconciled(run, RunStatus.SUSPENDED, workers)
        assert AgentRun.objects.get(pk=run.pk).generation > run.generation  # a new job id
    finally:
        workers.stop()


def test_run_cut_off_by_a_postgres_restart_is_recovered_not_failed(
    own_postgres: PostgresServer, redis_queue_settings: Any, settings: Any, tmp_path: Path
) -> None:
    import time

    from tests.durable_agents import SlowSleeper

    settings.NEXO = {**settings.NEXO, "LEASE_SECONDS": 2}
    workers = start_workers(own_postgres, redis_queue_settings, settings, tmp_path, "rq.worker.Worker")
    try:
        run = SlowSleeper.run_later("rest")
        wait_until(lambda: status_of(run) == RunStatus.RUNNING, timeout=WAIT, what="a worker to claim the run")
        own_postgres.restart()  # during the 4 s call: the worker's next write finds its connection cut
        connections.close_all()
        time.sleep(5)
        # Nothing was wrong with the run: it is not failed; its lease runs out and it is taken back.
        assert status_of(run) == RunStatus.RUNNING, AgentRun.objects.get(pk=run.pk).error
        wait_reconciled(run, RunStatus.DONE, workers)
        assert AgentRun.objects.get(pk=run.pk).recoveries == 1
    finally:
        workers.stop()


def test_a_database_error_mid_drive_leaves_the_run_to_the_reconciler(
    own_postgres: PostgresServer, redis_queue_settings: Any, settings: Any, tmp_path: Path
) -> None:
    from django.db import connection
    from rq.job import Job

    settings.NEXO = {**settings.NEXO, "LEASE_SECONDS": 2}
    # A database that refuses one kind of write for a while (a full disk, a failover).
    with connection.cursor() as cursor:
        cursor.execute("CREATE FUNCTION nexo_refuse() RETURNS trigger AS $$ BEGIN "
                       "RAISE EXCEPTION 'refused for the test'; END $$ LANGUAGE plpgsql")
        cursor.execute("CREATE TRIGGER nexo_refuse BEFORE INSERT ON nexo_django_toolcall "
                       "FOR EACH ROW EXECUTE FUNCTION nexo_refuse()")
    workers = start_workers(own_postgres, redis_queue_settings, settings, tmp_path, "rq.worker.Worker")
    try:
        # Under auto the write runs at once: marking it executing (an insert) fails, mid-drive.
        run = Scribe.run_later("Write 'hi'", cwd=tmp_path, permissions="auto")
        job = Job.fetch(dispatch.job_id(run.pk, run.generation), connection=dispatch.get_queue().connection)
        wait_until(lambda: job.get_status(refresh=True) in ("failed", "finished"), timeout=WAIT, what="the job")
        assert status_of(run) == RunStatus.RUNNING, AgentRun.objects.get(pk=run.pk).error  # not failed
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER nexo_refuse ON nexo_django_toolcall")
        wait_reconciled(run, RunStatus.DONE, workers)
        assert AgentRun.objects.get(pk=run.pk).recoveries == 1
        assert (tmp_path / "notes.txt").read_text() == "hi"
    finally:
        workers.stop()
