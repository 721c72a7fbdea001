"""The concurrent worker's database connections stay within Django's PostgreSQL pool, whatever the
runs in flight (issue 26): forty runs waiting on their (scripted, slow) model in one real worker
process, on a PostgreSQL cluster of the test's own, connections counted in pg_stat_activity."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from nexo_django.models import AgentRun, RunStatus
from tests.durable_agents import Patient, count
from tests.rq_workers import RQWorkers
from tests.servers import PostgresServer, default_database_on_own_cluster

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

REPO_ROOT = Path(__file__).resolve().parents[2]
POOL = {"min_size": 2, "max_size": 4, "timeout": 60}
RUNS = 40


@pytest.fixture
def own_postgres(django_db_blocker: Any) -> Iterator[PostgresServer]:
    """The default database, for this test, on a PostgreSQL cluster of its own."""
    with default_database_on_own_cluster("nexo_pool", django_db_blocker) as server:
        yield server


def pooled_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", ["nexo-test-pool"])
        return int(cursor.fetchone()[0])


def test_connections_stay_within_the_pool_with_forty_runs_in_flight_scripted(
    own_postgres: PostgresServer, redis_queue_settings: Any, settings: Any, tmp_path: Path, counter: Path
) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "PYTHONUNBUFFERED": "1",
        "DATABASE_URL": own_postgres.url,
        "NEXO_TEST_DB_POOL": json.dumps(POOL),
        "REDIS_URL": redis_queue_settings.url,
        "NEXO_TEST_RQ_QUEUES": json.dumps(settings.RQ_QUEUES),
        "NEXO_TEST_NEXO_SETTINGS": json.dumps(settings.NEXO),
    }
    env.pop("NEXO_TEST_DB_NAME", None)
    workers = RQWorkers(queues=[redis_queue_settings.name], redis_url=redis_queue_settings.url, env=env,
                        log_dir=tmp_path, concurrency=RUNS, cwd=REPO_ROOT).start()  # fmt: skip
    try:
        runs = [Patient.run_later(f"patient {i}") for i in range(RUNS)]
        ids = [r.pk for r in runs]
        most_running = most_connections = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            by_status = dict.fromkeys(RunStatus.values, 0)
            for status in AgentRun.objects.filter(pk__in=ids).values_list("status", flat=True):
                by_status[status] += 1
            most_running = max(most_running, by_status[RunStatus.RUNNING])
            most_connections = max(most_connections, pooled_connections())
            if by_status[RunStatus.DONE] == RUNS:
                break
            time.sleep(0.05)
        assert AgentRun.objects.filter(pk__in=ids, status=RunStatus.DONE).count() == RUNS, workers.logs()
        assert most_running >= RUNS // 2, f"at most {most_running} runs were in flight at once"
        assert 1 <= most_connections <= POOL["max_size"], f"{most_connections} connections, pool of {POOL['max_size']}"
        assert count(counter).count("x") == RUNS
    finally:
        workers.stop()
