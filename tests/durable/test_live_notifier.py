"""Streaming takes no connection of the run's (issue 33, point 1): on PostgreSQL the model's text
goes out through one notifier per process, with a connection of its own, so six runs streaming at
once in one concurrent worker whose pool holds two connections stream together, in one wave. (A
delta was a NOTIFY on the run's own connection: it took a connection of the pool for the whole
answer, and six such runs came in three waves.) Scripted, streamed model; a real ``nexo_worker``,
Redis and PostgreSQL."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from nexo_django.models import AgentRun, RunStatus
from tests.durable_agents import TOLD, SlowTeller

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable, pytest.mark.postgresql_only,
              pytest.mark.redis]

RUNS = 6
POOL = {"min_size": 1, "max_size": 2, "timeout": 60}
#: How long one run streams (18 words, 150 ms apart).
ONE_RUN = 18 * 0.15


def test_six_streaming_runs_on_a_pool_of_two_stream_in_one_wave_scripted(
    rq_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXO_TEST_DB_POOL", json.dumps(POOL))
    workers = rq_worker(concurrency=RUNS)
    ids = [SlowTeller.run_later(f"story {i}").pk for i in range(RUNS)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if AgentRun.objects.filter(pk__in=ids, status=RunStatus.DONE).count() == RUNS:
            break
        time.sleep(0.05)
    runs = list(AgentRun.objects.filter(pk__in=ids))
    assert all(r.status == RunStatus.DONE and r.result == TOLD for r in runs), workers.logs()
    finished = sorted(r.finished_at for r in runs)
    # In one wave the six end together; in waves of two (a connection held per stream) the last
    # ended two streams' lengths after the first.
    spread = (finished[-1] - finished[0]).total_seconds()
    assert spread < ONE_RUN / 2, f"the runs ended over {spread:.1f} s: in waves, not together"
