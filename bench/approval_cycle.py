"""Benchmark 1: the approval cycle, in process, on SQLite or PostgreSQL.

One cycle: ``Scribe.run()`` (a durable run whose scripted model asks for a gated write) →
suspended → ``call.approve()`` → the inline queue resumes it at commit → the write runs → the
scripted model's final answer → done. Timed end to end, per cycle. ``--start run_later`` starts
it with ``run_later()`` instead: the inline queue runs the job at the request's commit (a worker
would: claim, ask the model, suspend).

    python -m bench.approval_cycle --db sqlite|postgres [--start run|run_later] [--cycles N] [--profile]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from bench.common import (
    DATABASES,
    counting,
    database_url,
    db_label,
    figure,
    median,
    ms,
    note,
    p95,
    profile,
    row_bytes,
    scratch,
    setup_django,
    stored_bytes,
)

WARMUP = 10
COUNTED = 5


def one_cycle(
    agent: Any, workspace: Path | None, user: Any, split: list[int] | None = None, start_with: str = "run"
) -> Any:
    """One cycle; ``split`` receives the ns from the start to the suspended run."""
    start = time.perf_counter_ns()
    cwd = workspace if agent.sandbox == "local" else None
    if start_with == "run_later":
        run = agent.run_later("Write 'hi' to notes.txt", cwd=cwd, user=user)  # the job ran at commit
        run.refresh_from_db()
    else:
        run = agent.run("Write 'hi' to notes.txt", cwd=cwd, user=user)
    if run.status != "suspended":
        raise RuntimeError(f"expected a suspended run, got {run.status}: {run.error}")
    if split is not None:
        split.append(time.perf_counter_ns() - start)
    call = run.pending_calls().get()
    call.approve(by=user)
    run.refresh_from_db()
    if run.status != "done":
        raise RuntimeError(f"expected a done run, got {run.status}: {run.error}")
    return run


def commit_cost(samples: int = 200, *, wait: bool = True) -> float:
    """Median ms of one small write transaction (INSERT + COMMIT) on this database, as the
    durable layer does them: the floor under each of a cycle's write transactions. ``wait=False``:
    one whose commit does not wait for the disk, as ``nexo_django.durable.sql.Batch(durable=False)``
    commits it (the claim before a model request)."""
    from django.db import connection

    from nexo_django.durable import sql

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE bench_commit (payload TEXT)")
    times = []
    for _ in range(samples):
        start = time.perf_counter_ns()
        with sql.atomic(connection, "default", wait=wait), connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_commit (payload) VALUES (%s)", ["x" * 200])
        times.append(time.perf_counter_ns() - start)
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE bench_commit")
    return ms(median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", choices=DATABASES, default="sqlite")
    parser.add_argument(
        "--sandbox", choices=["virtual", "local"], default="virtual",
        help="virtual: the write lands in the run's in-memory files; local: a real file, fsynced",
    )  # fmt: skip
    parser.add_argument("--start", choices=["run", "run_later"], default="run")
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--profile", action="store_true", help="cProfile 50 cycles and print the top")
    args = parser.parse_args()

    setup_django(database_url(args.db))
    from django.contrib.auth import get_user_model

    from bench.agents import VirtualScribe
    from tests.durable_agents import Scribe

    agent = Scribe if args.sandbox == "local" else VirtualScribe

    user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", "bench")
    root = scratch() / "workspaces"
    root.mkdir()
    total = WARMUP + args.cycles + COUNTED
    workspaces = [root / f"w{i}" for i in range(total + 50)]
    for directory in workspaces:
        directory.mkdir()
    spaces = iter(workspaces)

    if args.profile:
        print(profile(lambda: [one_cycle(agent, next(spaces), user, start_with=args.start) for _ in range(50)], top=40))
        print(profile(lambda: [one_cycle(agent, next(spaces), user, start_with=args.start) for _ in range(50)], top=40, sort="tottime"))
        return

    for _ in range(WARMUP):
        one_cycle(agent, next(spaces), user, start_with=args.start)

    before = stored_bytes()
    times: list[int] = []
    to_suspended: list[int] = []
    cpu: list[int] = []  # this process's CPU time: steadier than wall time on a busy machine
    run = None
    for _ in range(args.cycles):
        workspace = next(spaces)
        start, start_cpu = time.perf_counter_ns(), time.process_time_ns()
        run = one_cycle(agent, workspace, user, to_suspended, args.start)
        cpu.append(time.process_time_ns() - start_cpu)
        times.append(time.perf_counter_ns() - start)
    disk_per_run = (stored_bytes() - before) / args.cycles
    assert run is not None
    rows = row_bytes(run.pk)

    # Counted apart: the execute wrapper costs time of its own.
    per_cycle: list[tuple[int, int, int, int, int]] = []
    for _ in range(COUNTED):
        with counting() as counts:
            one_cycle(agent, next(spaces), user, start_with=args.start)
        per_cycle.append((counts.queries, counts.writes, counts.transactions, counts.write_transactions,
                          counts.durable_write_transactions))
    queries, writes, transactions, write_transactions, durable_writes = max(per_cycle)
    if len(set(per_cycle)) != 1:
        note(f"query counts differ between cycles: {per_cycle}")

    figure(
        "approval_cycle", db=db_label(), sandbox=args.sandbox, start=args.start, cycles=args.cycles,
        median_ms=ms(median(times)), p95_ms=ms(p95(times)), cpu_median_ms=ms(median(cpu)),
        start_to_suspended_median_ms=ms(median(to_suspended)),
        queries=queries, writes=writes, transactions=transactions, write_transactions=write_transactions,
        durable_write_transactions=durable_writes, row_bytes_per_run=sum(rows.values()), disk_bytes_per_run=round(disk_per_run),
    )  # fmt: skip
    commit_ms = commit_cost()
    figure(
        "commit_floor", db=db_label(), commit_median_ms=commit_ms, no_wait_commit_median_ms=commit_cost(wait=False),
        durable_write_transactions=durable_writes, floor_ms=commit_ms * durable_writes,
    )  # fmt: skip
    # Issue 34: the cycle as a multiple of the bare durable commits it needs (the floor).
    figure(
        "cycle_over_floor", db=db_label(), start=args.start, cycle_median_ms=ms(median(times)),
        floor_ms=commit_ms * durable_writes, multiple=ms(median(times)) / (commit_ms * durable_writes),
    )  # fmt: skip
    figure("approval_cycle_rows", db=db_label(), sandbox=args.sandbox, **{f"{name}_bytes": size for name, size in rows.items()})


if __name__ == "__main__":
    main()
