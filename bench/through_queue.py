"""Benchmark 3: durable runs through a real Redis queue and real ``rqworker`` processes.

Latency: one waiting worker. ``approve()`` → the run is ``done`` (the job resumes it, the write
runs, the scripted model answers), beside a no-op rq job's enqueue → finished, on the same
worker class, interleaved sample by sample. Both are observed by polling at the same interval
(the run's row in the database, the job's hash in Redis).

Throughput: two worker processes. K three-turn scripted runs (``ThreeTurns`` under ``auto``:
glob, write, read, answer) enqueued at once → all done, beside K no-op jobs → all finished.

The database is PostgreSQL (SQLite with Django's defaults is not meant for several writer
processes). ``--worker-class`` may be given several times; the default measures rq's forking
``Worker`` (what ``manage.py rqworker`` runs) and ``SimpleWorker`` (no fork per job).

    python -m bench.through_queue [--samples N] [--runs K] [--worker-class CLS ...]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from bench.common import (
    REPO_ROOT,
    db_label,
    figure,
    median,
    ms,
    note,
    p95,
    postgres_url,
    scratch,
    setup_django,
)

POLL = 0.0005  # seconds between two looks, for runs and for jobs alike
TIMEOUT = 60.0
WORKER_CLASSES = ["rq.worker.Worker", "rq.worker.SimpleWorker"]


def wait_for(predicate: Any, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(POLL)


def worker_env() -> dict[str, str]:
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "PYTHONPATH": pythonpath,
            "PYTHONUNBUFFERED": "1"}  # fmt: skip


def start_workers(redis_url: str, count: int, worker_class: str, log_dir: Path) -> Any:
    from tests.rq_workers import RQWorkers

    return RQWorkers(
        queues=["default"], redis_url=redis_url, env=worker_env(), log_dir=log_dir, count=count,
        worker_class=worker_class, cwd=REPO_ROOT,
    ).start()  # fmt: skip


def noop_latency(redis: Any) -> int:
    import django_rq

    start = time.perf_counter_ns()
    job = django_rq.get_queue("default").enqueue("bench.jobs.noop", result_ttl=600)
    key = f"rq:job:{job.id}"
    wait_for(lambda: redis.hget(key, "status") in (b"finished", b"failed"), f"no-op job {job.id}")
    elapsed = time.perf_counter_ns() - start
    if redis.hget(key, "status") != b"finished":
        raise RuntimeError(f"no-op job {job.id} failed")
    return elapsed


def approval_latency(run: Any, call: Any) -> int:
    from nexo_django.models import AgentRun

    start = time.perf_counter_ns()
    call.approve()
    done = AgentRun.objects.filter(pk=run.pk, status__in=("done", "failed"))
    wait_for(done.exists, f"run {run.pk} to finish")
    elapsed = time.perf_counter_ns() - start
    run.refresh_from_db()
    if run.status != "done":
        raise RuntimeError(f"run {run.pk} ended {run.status}: {run.error}")
    return elapsed


def latency(redis: Any, samples: int, worker_class: str) -> None:
    from bench.agents import VirtualScribe
    from nexo_django.models import AgentRun

    runs = [VirtualScribe.run_later("Write 'hi' to notes.txt") for _ in range(samples + 3)]
    ids = [r.pk for r in runs]
    suspended = AgentRun.objects.filter(pk__in=ids, status="suspended")
    wait_for(lambda: suspended.count() == len(ids), f"{len(ids)} runs to suspend")
    pairs = [(r, r.pending_calls().get()) for r in runs]
    for run, call in pairs[:3]:  # warm-up: the worker's first imports, the first connections
        noop_latency(redis)
        approval_latency(run, call)
    runs_ns: list[int] = []
    jobs_ns: list[int] = []
    for run, call in pairs[3:]:
        jobs_ns.append(noop_latency(redis))
        runs_ns.append(approval_latency(run, call))
    figure(
        "queue_latency", worker_class=worker_class.rsplit(".", 1)[-1], db=db_label(), samples=samples,
        approve_to_done_median_ms=ms(median(runs_ns)), approve_to_done_p95_ms=ms(p95(runs_ns)),
        noop_job_median_ms=ms(median(jobs_ns)), noop_job_p95_ms=ms(p95(jobs_ns)),
        ratio=median(runs_ns) / median(jobs_ns),
    )  # fmt: skip


def throughput(redis: Any, count: int, worker_class: str, workers: int) -> None:
    import django_rq

    from nexo_django.models import AgentRun
    from tests.durable_agents import ThreeTurns

    queue = django_rq.get_queue("default")
    start = time.perf_counter()
    jobs = [queue.enqueue("bench.jobs.noop", result_ttl=600) for _ in range(count)]
    keys = [f"rq:job:{job.id}" for job in jobs]

    def all_finished() -> bool:
        with redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hget(key, "status")
            return all(status == b"finished" for status in pipe.execute())

    wait_for(all_finished, f"{count} no-op jobs")
    jobs_per_s = count / (time.perf_counter() - start)

    start = time.perf_counter()
    ids = [ThreeTurns.run_later("three turns", permissions="auto").pk for _ in range(count)]
    finished = AgentRun.objects.filter(pk__in=ids, status__in=("done", "failed", "cancelled", "needs_attention"))
    wait_for(lambda: finished.count() == count, f"{count} runs to finish")
    runs_per_s = count / (time.perf_counter() - start)
    bad = AgentRun.objects.filter(pk__in=ids).exclude(status="done").count()
    if bad:
        raise RuntimeError(f"{bad} of {count} three-turn runs did not end done")
    figure(
        "queue_throughput", worker_class=worker_class.rsplit(".", 1)[-1], db=db_label(), workers=workers,
        runs=count, runs_per_s=runs_per_s, noop_jobs_per_s=jobs_per_s, ratio=runs_per_s / jobs_per_s,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--worker-class", action="append", dest="worker_classes")
    args = parser.parse_args()

    from tests.servers import RedisServer

    with RedisServer() as redis_server:
        setup_django(postgres_url(), redis_url=redis_server.url)
        log_dir = scratch()
        redis = redis_server.client()
        for worker_class in args.worker_classes or WORKER_CLASSES:
            for count, measure in ((1, lambda c=worker_class: latency(redis, args.samples, c)),
                                   (2, lambda c=worker_class: throughput(redis, args.runs, c, 2))):  # fmt: skip
                workers = start_workers(redis_server.url, count, worker_class, log_dir)
                try:
                    measure()
                except BaseException:
                    note(workers.logs())
                    raise
                finally:
                    workers.stop()
        redis.close()


if __name__ == "__main__":
    main()
