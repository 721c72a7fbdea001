"""Benchmark 3: durable runs through a real Redis queue and real ``rqworker`` processes.

Latency: one waiting worker. ``approve()`` → the job it enqueues has finished (it resumed the
run, the write ran, the scripted model answered, the run is ``done``: checked afterwards,
untimed), beside a no-op rq job's ``enqueue()`` → finished, on the same worker class, interleaved
sample by sample. Both sides are observed the same way: the clock starts just before the call
that enqueues (``approve()`` / ``enqueue()``) and stops at the first poll (every 0.5 ms, an HGET
of the job's status in Redis) that sees the job ``finished``. Also shown: how long that call took
in this process, and rq's own ``ended_at - enqueued_at`` for each job.

Throughput: two worker processes. K three-turn scripted runs (``ThreeTurns`` under ``auto``:
glob, write, read, answer) enqueued at once → all their jobs finished, beside K no-op jobs → all
finished, both observed by polling every job's status in Redis.

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


def job_key(job_id: str) -> str:
    return f"rq:job:{job_id}"


def run_job_key(run: Any) -> str:
    """The rq job ``run_later`` enqueued for ``run`` (nexo's job ids are deterministic)."""
    from nexo_django.durable import dispatch

    return job_key(dispatch.job_id(run.pk, run.generation))


def rq_seconds(redis: Any, key: str) -> float:
    """What rq itself recorded for a job: ``ended_at - enqueued_at``, in seconds."""
    from datetime import datetime

    enqueued, ended = redis.hmget(key, "enqueued_at", "ended_at")
    return (datetime.fromisoformat(ended.decode()) - datetime.fromisoformat(enqueued.decode())).total_seconds()


def observe(redis: Any, submit: Any, key_of: Any) -> tuple[int, int, float]:
    """The one way both sides are observed. Start: just before ``submit()`` (the no-op's
    ``enqueue()``, or ``approve()``, whose commit enqueues nexo's job). End: the first poll (every
    POLL seconds, HGET of the job's status in Redis) that sees the job ``finished``. Returns the
    ns to the end, the ns ``submit()`` took in this process, and rq's own enqueued→ended time."""
    start = time.perf_counter_ns()
    handle = submit()
    submitted = time.perf_counter_ns()
    key = key_of(handle)
    wait_for(lambda: redis.hget(key, "status") in (b"finished", b"failed"), f"job {key}")
    elapsed = time.perf_counter_ns() - start
    if redis.hget(key, "status") != b"finished":
        raise RuntimeError(f"job {key} failed")
    return elapsed, submitted - start, rq_seconds(redis, key)


def noop_latency(redis: Any) -> tuple[int, int, float]:
    import django_rq

    queue = django_rq.get_queue("default")
    return observe(redis, lambda: queue.enqueue("bench.jobs.noop", result_ttl=600), lambda job: job_key(job.id))


def approval_latency(redis: Any, run: Any, call: Any) -> tuple[int, int, float]:
    key = job_key_after_decision(run)
    observed = observe(redis, call.approve, lambda _: key)
    run.refresh_from_db()
    if run.status != "done":
        raise RuntimeError(f"run {run.pk} ended {run.status}: {run.error}")
    return observed


def job_key_after_decision(run: Any) -> str:
    from nexo_django.durable import dispatch

    # The decision that wakes a suspended run moves it to the next generation (runs.py), and the
    # wake-up's job carries that generation in its id.
    return job_key(dispatch.job_id(run.pk, run.generation + 1))


def latency(redis: Any, samples: int, worker_class: str) -> None:
    from bench.agents import VirtualScribe
    from nexo_django.models import AgentRun

    runs = [VirtualScribe.run_later("Write 'hi' to notes.txt") for _ in range(samples + 3)]
    ids = [r.pk for r in runs]
    suspended = AgentRun.objects.filter(pk__in=ids, status="suspended")
    wait_for(lambda: suspended.count() == len(ids), f"{len(ids)} runs to suspend")
    for run in runs:
        run.refresh_from_db()  # its generation now, untimed
    pairs = [(r, r.pending_calls().get()) for r in runs]
    for run, call in pairs[:3]:  # warm-up: the worker's first imports, the first connections
        noop_latency(redis)
        approval_latency(redis, run, call)
    runs_ns: list[int] = []
    jobs_ns: list[int] = []
    runs_submit: list[int] = []
    jobs_submit: list[int] = []
    runs_rq: list[float] = []
    jobs_rq: list[float] = []
    for run, call in pairs[3:]:
        elapsed, submit, rq_s = noop_latency(redis)
        jobs_ns.append(elapsed)
        jobs_submit.append(submit)
        jobs_rq.append(rq_s)
        elapsed, submit, rq_s = approval_latency(redis, run, call)
        runs_ns.append(elapsed)
        runs_submit.append(submit)
        runs_rq.append(rq_s)
    figure(
        "queue_latency", worker_class=worker_class.rsplit(".", 1)[-1], db=db_label(), samples=samples,
        approve_to_done_median_ms=ms(median(runs_ns)), approve_to_done_p95_ms=ms(p95(runs_ns)),
        noop_job_median_ms=ms(median(jobs_ns)), noop_job_p95_ms=ms(p95(jobs_ns)),
        ratio=median(runs_ns) / median(jobs_ns),
        approve_call_median_ms=ms(median(runs_submit)), noop_enqueue_call_median_ms=ms(median(jobs_submit)),
        run_job_rq_median_ms=median(runs_rq) * 1e3, noop_job_rq_median_ms=median(jobs_rq) * 1e3,
    )  # fmt: skip


def all_finished(redis: Any, keys: list[str]) -> bool:
    """Both sides of the throughput figure are observed this way: every job's status in Redis."""
    with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hget(key, "status")
        return all(status in (b"finished", b"failed") for status in pipe.execute())


def throughput(redis: Any, count: int, worker_class: str, workers: int) -> None:
    import django_rq

    from nexo_django.models import AgentRun
    from tests.durable_agents import ThreeTurns

    queue = django_rq.get_queue("default")
    start = time.perf_counter()
    keys = [job_key(queue.enqueue("bench.jobs.noop", result_ttl=600).id) for _ in range(count)]
    wait_for(lambda: all_finished(redis, keys), f"{count} no-op jobs")
    jobs_per_s = count / (time.perf_counter() - start)

    start = time.perf_counter()
    # Under auto a three-turn run ends in the one job run_later enqueued.
    runs = [ThreeTurns.run_later("three turns", permissions="auto") for _ in range(count)]
    keys = [run_job_key(run) for run in runs]
    wait_for(lambda: all_finished(redis, keys), f"{count} runs' jobs")
    runs_per_s = count / (time.perf_counter() - start)
    bad = AgentRun.objects.filter(pk__in=[r.pk for r in runs]).exclude(status="done").count()
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
