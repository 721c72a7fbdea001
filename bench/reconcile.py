"""Benchmark 5: one reconciler round (``nexo_django.recovery.reconcile()``) at 1k, 10k and 100k runs.

The runs are what a busy installation keeps: 60% suspended (one pending call each, waiting for a
person), 40% finished (done, one succeeded call), plus ten running runs whose lease is alive. None
needs the reconciler, so a round finds nothing to do: what it costs is the looking. Rows are
bulk-inserted (bench/inbox.py's ``Inserter``: executemany on SQLite, COPY on PostgreSQL), with old
timestamps. A round is timed ``--rounds`` times after a warm-up; ``full`` is the same with
``reconcile(full=True)``, which looks at every suspended run (what every round did before).

    python -m bench.reconcile --db sqlite|postgres [--sizes 1000,10000,100000] [--rounds N] [--profile]
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import timedelta
from functools import partial

from bench.common import (
    DATABASES,
    database_url,
    db_label,
    figure,
    median,
    ms,
    note,
    p95,
    profile,
    setup_django,
)
from bench.inbox import AGENTS, BASE_TIME, Inserter

SUSPENDED_SHARE = 0.6
LIVE_RUNNING = 10


def add_runs(ins: Inserter, start: int, stop: int) -> None:
    """Runs ``start``..``stop-1``: suspended with a pending call, or done with a succeeded one."""
    from django.db import transaction

    from nexo_django.models import AgentRun, ToolCall, args_digest

    args = {"path": "notes.txt", "content": "note\n"}
    digest, payload = args_digest(args), ins.value(args)
    runs, calls = [], []
    for i in range(start, stop):
        run_id = ins.value(uuid.uuid5(uuid.NAMESPACE_OID, f"bench-reconcile-{i}"))
        when = ins.value(BASE_TIME + timedelta(seconds=i))
        suspended = (i % 10) < SUSPENDED_SHARE * 10
        status, call_status = ("suspended", "pending_approval") if suspended else ("done", "succeeded")
        runs.append((run_id, AGENTS[i % len(AGENTS)], f"Task {i}", status, when, when, 1,
                     None if suspended else when))  # fmt: skip
        calls.append((run_id, AGENTS[i % len(AGENTS)], "call_0_0", "write", "write", payload, digest,
                      call_status, ins.value(False), when, when))  # fmt: skip
    with transaction.atomic():
        if ins.pg:
            with ins.connection.cursor() as cursor:
                cursor.execute("SET LOCAL session_replication_role = replica")  # consistent by construction
        ins.insert(AgentRun, ["id", "agent", "prompt", "status", "created_at", "updated_at", "generation",
                              "finished_at"], runs)  # fmt: skip
        ins.insert(ToolCall, ["run_id", "agent", "tool_call_id", "name", "capability", "args", "digest",
                              "status", "idempotent", "created_at", "updated_at"], calls)  # fmt: skip
    if ins.pg:
        with ins.connection.cursor() as cursor:
            cursor.execute("VACUUM (ANALYZE)")  # what autovacuum does after a load like this


def add_live_running() -> None:
    from django.utils import timezone

    from nexo_django.models import AgentRun

    AgentRun.objects.bulk_create(
        AgentRun(agent=AGENTS[0], prompt="busy", status="running", lease_owner=f"worker-{i}",
                 lease_expires_at=timezone.now() + timedelta(days=1), generation=1)  # fmt: skip
        for i in range(LIVE_RUNNING)
    )


def time_rounds(rounds: int, *, full: bool) -> tuple[float, float, int]:
    """Median and p95 ms of a round, and the queries of one."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from nexo_django.durable.recovery import reconcile

    for _ in range(2):
        report = reconcile(full=full)
        if str(report) != "requeued=0 needs_attention=0 failed=0 resent=0":
            raise RuntimeError(f"a round found work where there is none: {report}")
    times = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        reconcile(full=full)
        times.append(time.perf_counter_ns() - start)
    with CaptureQueriesContext(connection) as captured:
        reconcile(full=full)
    return ms(median(times)), ms(p95(times)), len(captured.captured_queries)


def rounds_of(full: bool, count: int) -> None:
    from nexo_django.durable.recovery import reconcile

    for _ in range(count):
        reconcile(full=full)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", choices=DATABASES, default="sqlite")
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--profile", action="store_true", help="cProfile the rounds at the largest size")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))

    setup_django(database_url(args.db))
    from nexo_django.models import AgentRun

    add_live_running()
    ins = Inserter()
    have = 0
    for size in sizes:
        start = time.perf_counter()
        add_runs(ins, have, size)
        inserted = time.perf_counter() - start
        have = size
        suspended = AgentRun.objects.filter(status="suspended").count()
        note(f"{size} runs ({suspended} suspended, {LIVE_RUNNING} running): inserted in {inserted:.1f}s")
        if args.profile and size == sizes[-1]:
            print(profile(partial(rounds_of, False, 10), top=30, sort="tottime"))
            continue
        median_ms, p95_ms, queries = time_rounds(args.rounds, full=False)
        full_ms, _, full_queries = time_rounds(max(3, args.rounds // 5), full=True)
        figure("reconcile", db=db_label(), runs=size, suspended=suspended, median_ms=median_ms, p95_ms=p95_ms,
               queries=queries, full_median_ms=full_ms, full_queries=full_queries)  # fmt: skip


if __name__ == "__main__":
    main()
