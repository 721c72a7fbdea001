"""`make bench`: run every benchmark, print the figures, compare them with the targets, and write
bench/results/latest.txt. Targets missed are reported, not failed; what fails the run (non-zero)
is a benchmark that crashes, or a figure of the regression gate (bench/regression.py) more than
10 % over the stored baseline's.

Starts one throwaway PostgreSQL for all of them (the queue benchmark starts its own Redis), both
on 127.0.0.1 through tests/servers.py, and stops them at the end.

    .venv/bin/python bench/run.py [--quick] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.targets import TARGETS, evaluate, gate_misses, parse  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "latest.txt"
STEP_TIMEOUT = 300  # seconds; a benchmark that hangs is stopped and reported


#: The second Python the worker's targets are measured on (issue 34: 3.12 and 3.13 alike);
#: ``make bench`` creates it.
PY312 = ROOT / ".venv-bench312" / "bin" / "python"


@dataclass(frozen=True)
class Step:
    name: str
    args: list[str]
    quick: list[str]
    #: the interpreter (default: this one)
    python: Path | None = None
    timeout: int = STEP_TIMEOUT


STEPS = [
    Step("approval_cycle_sqlite", ["bench.approval_cycle", "--db", "sqlite"], ["--cycles", "30"]),
    Step("approval_cycle_sqlite_wal", ["bench.approval_cycle", "--db", "sqlite-wal-full"], ["--cycles", "30"]),
    Step("approval_cycle_sqlite_wal_normal", ["bench.approval_cycle", "--db", "sqlite-wal-normal"], ["--cycles", "30"]),
    Step("approval_cycle_sqlite_nosync", ["bench.approval_cycle", "--db", "sqlite-nosync"], ["--cycles", "30"]),
    Step("approval_cycle_postgres", ["bench.approval_cycle", "--db", "postgres"], ["--cycles", "30"]),
    Step("approval_cycle_postgres_prepared", ["bench.approval_cycle", "--db", "postgres-prepared"], ["--cycles", "30"]),
    Step("approval_cycle_later_sqlite_wal", ["bench.approval_cycle", "--db", "sqlite-wal-full", "--start", "run_later"],
         ["--cycles", "30"]),
    Step("approval_cycle_later_postgres", ["bench.approval_cycle", "--db", "postgres", "--start", "run_later"],
         ["--cycles", "30"]),
    Step("workflow_step_sqlite_wal", ["bench.workflow", "--db", "sqlite-wal-full"], ["--steps", "20", "--repeat", "2"]),
    Step("workflow_step_postgres", ["bench.workflow", "--db", "postgres"], ["--steps", "20", "--repeat", "2"]),
    Step("loop_overhead", ["bench.loop_overhead"], ["--runs", "5"]),
    Step("shell_confine", ["bench.shell_confine"], ["--calls", "20"]),
    Step("through_queue", ["bench.through_queue"], ["--samples", "10", "--runs", "20"]),
    Step("events_latency_postgres", ["bench.events_latency", "--db", "postgres"], ["--samples", "5"]),
    Step("events_latency_sqlite_wal", ["bench.events_latency", "--db", "sqlite-wal-full"], ["--samples", "5"]),
    Step("inbox_sqlite", ["bench.inbox", "--db", "sqlite"], ["--sizes", "1000,10000", "--renders", "3"]),
    Step("inbox_postgres", ["bench.inbox", "--db", "postgres"], ["--sizes", "1000,10000", "--renders", "3"]),
    Step("decision_page_sqlite", ["bench.decision_page", "--db", "sqlite"], ["--renders", "2"]),
    Step("many_calls_sqlite", ["bench.many_calls", "--db", "sqlite"], ["--renders", "2"]),
    Step("many_calls_postgres", ["bench.many_calls", "--db", "postgres"], ["--renders", "2"]),
    # The peers (bench/peers.py, the `bench` extra), each timed in turn with nexo's cycle in one
    # process; the targets' comparisons in 5 processes, their medians judged. The peers keep
    # their state on SQLite WAL+FULL, but in peers_postgres_same_db: on the PostgreSQL nexo uses.
    Step("peers_sqlite_wal", ["bench.peers", "--nexo-db", "sqlite-wal-full", "--processes", "5"],
         ["--cycles", "30", "--round", "10", "--processes", "2"]),
    Step("peers_postgres", ["bench.peers", "--nexo-db", "postgres", "--processes", "5"],
         ["--cycles", "30", "--round", "10", "--processes", "2"]),
    # (Its peers each make their commits over loopback too: 275 s of 5 processes on the loaded
    # machine of 2026-12-03, against 228 s for peers_postgres.)
    Step("peers_postgres_same_db", ["bench.peers", "--nexo-db", "postgres", "--peer-db", "postgres", "--processes", "5"],
         ["--cycles", "30", "--round", "10", "--processes", "2"], timeout=600),
    # nexo with prepared statements (docs/deployment.md, where the connections allow them; LangGraph's
    # PostgresSaver prepares its own statements), beside the peers on SQLite and on PostgreSQL.
    Step("peers_postgres_prepared", ["bench.peers", "--nexo-db", "postgres-prepared", "--processes", "5"],
         ["--cycles", "30", "--round", "10", "--processes", "2"]),
    Step("peers_postgres_prepared_same_db",
         ["bench.peers", "--nexo-db", "postgres-prepared", "--peer-db", "postgres", "--processes", "5"],
         ["--cycles", "30", "--round", "10", "--processes", "2"], timeout=600),
    Step("reconcile_sqlite", ["bench.reconcile", "--db", "sqlite"], ["--sizes", "1000,10000", "--rounds", "5"]),
    Step("reconcile_postgres", ["bench.reconcile", "--db", "postgres"], ["--sizes", "1000,10000", "--rounds", "5"]),
    # The scheduler's CPU per fired run and idle, 1,000 schedules, beside rq's enqueue and run_later.
    Step("schedules_sqlite", ["bench.schedules", "--db", "sqlite"], ["--fire", "50", "--idle", "50"]),
    Step("schedules_postgres", ["bench.schedules", "--db", "postgres"], ["--fire", "50", "--idle", "50"]),
    # The concurrent worker beside the asyncio peer (issue 34's worker targets), on both Pythons.
    Step("concurrency", ["bench.concurrency", "--skip", "simple"], ["--runs", "50"]),
    Step("concurrency_py312", ["bench.concurrency", "--skip", "simple"], ["--runs", "50"], python=PY312),
    # The same with prepared statements (docs/deployment.md's recommendation where the connections allow).
    Step("concurrency_prepared", ["bench.concurrency", "--skip", "simple", "--db", "postgres-prepared"],
         ["--runs", "50"]),
    Step("concurrency_prepared_py312", ["bench.concurrency", "--skip", "simple", "--db", "postgres-prepared"],
         ["--runs", "50"], python=PY312),
    # Last: the regression gate, the stored baseline's revision beside this tree, interleaved.
    Step("regression", ["bench.regression"], ["--quick", "--pairs", "1"], timeout=900),
]


def version_of(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def command_version(argv: list[str], pattern: str) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False).stdout
    except OSError:
        return "absent"
    found = re.search(pattern, out)
    return found.group(1) if found else "unknown"


def git_revision() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    revision = git("rev-parse", "--short", "HEAD") or "unknown"
    return revision + ("+dirty" if git("status", "--porcelain", "--", "nexo_django") else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f}"
    except OSError:
        pass
    return "unknown"


def load() -> str:
    try:
        return "/".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def cpu_reference_ms() -> str:
    """Best of 5 of ``sum(range(10**6))`` in ms: a yardstick for comparing the CPU of two
    machines (or of one machine, busy and quiet) when comparing their figures."""
    import timeit

    return f"{min(timeit.repeat('sum(range(10**6))', number=1, repeat=5)) * 1e3:.1f}"


def header(pg_bin: str) -> list[str]:
    import sqlite3

    from tests.servers import find_redis_server

    try:
        redis_server = find_redis_server()
    except Exception:
        redis_server = "redis-server"
    return [
        f"run date={datetime.now(UTC).isoformat(timespec='seconds')} revision={git_revision()}",
        "versions " + " ".join([
            f"python={platform.python_version()}",
            f"django={version_of('django')}",
            f"django_rq={version_of('django-rq')}",
            f"rq={version_of('rq')}",
            f"redis_py={version_of('redis')}",
            f"psycopg={version_of('psycopg')}",
            f"sqlite={sqlite3.sqlite_version}",
            f"postgresql={command_version([os.path.join(pg_bin, 'postgres'), '--version'], r'(\d+\.\d+)')}",
            f"redis_server={command_version([redis_server, '--version'], r'v=(\S+)')}",
            f"nexo_django={version_of('nexo-django')}",
            f"langgraph={version_of('langgraph')}",
            f"langgraph_checkpoint_sqlite={version_of('langgraph-checkpoint-sqlite')}",
            f"langgraph_checkpoint_postgres={version_of('langgraph-checkpoint-postgres')}",
            f"pydantic_ai_slim={version_of('pydantic-ai-slim')}",
            f"openai_agents={version_of('openai-agents')}",
        ]),
        "machine " + " ".join([
            f"os={platform.system()}-{platform.release()}",
            f"arch={platform.machine()}",
            f"cpu={cpu_model().replace(' ', '_')}",
            f"cores={os.cpu_count()}",
            f"memory_gib={memory_gib()}",
            f"cpu_reference_ms={cpu_reference_ms()}",
            f"load_at_start={load()}",
        ]),
    ]  # fmt: skip


def run_step(step: Step, quick: bool, env: dict[str, str], emit: Callable[[str], None]) -> tuple[bool, float]:
    python = step.python or Path(sys.executable)
    if not python.exists():
        print(f"\n== {step.name}: not measured: {python} is missing (`make bench` creates it)", flush=True)
        return True, 0.0
    argv = [str(python), "-m", *step.args, *(step.quick if quick else [])]
    print(f"\n== {step.name}: {' '.join(argv[1:])}", flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    timed_out = threading.Event()

    def stop() -> None:
        timed_out.set()
        os.killpg(proc.pid, signal.SIGTERM)  # its servers' atexit hooks and PDEATHSIG clean up

    timer = threading.Timer(step.timeout, stop)
    timer.start()
    try:
        for line in proc.stdout:
            line = line.rstrip("\n")
            print(line, flush=True)
            if line.startswith("figure="):
                emit(line)
        proc.wait()
    finally:
        timer.cancel()
    if timed_out.is_set():
        print(f"!! {step.name} ran longer than {step.timeout}s and was stopped", flush=True)
    elif proc.returncode:
        print(f"!! {step.name} exited with {proc.returncode}", flush=True)
    return proc.returncode == 0 and not timed_out.is_set(), time.monotonic() - start


def settle(pg_url: str) -> None:
    """Put what the last step wrote on disk before the next step starts: a ``CHECKPOINT`` of the
    shared PostgreSQL, then ``sync()``, so one step's writeback does not land on the next step's
    fsyncs (``vmstat`` showed up to ~100 MB/s of it for seconds after the inbox steps). In
    ``make bench`` it then takes 0.0-0.2 s: most of it was written by the time the step ended."""
    import psycopg

    start = time.monotonic()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    os.sync()
    print(f"# settled in {time.monotonic() - start:.1f}s (CHECKPOINT, sync)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test, not figures")
    parser.add_argument("--only", action="append", choices=[s.name for s in STEPS], help="run only these steps")
    args = parser.parse_args()

    from tests.servers import PostgresServer, find_pg_bin

    started = time.monotonic()
    lines = header(str(find_pg_bin()))
    for line in lines:
        print(line)
    figures: list[str] = []
    failed: list[str] = []
    durations: list[str] = []
    # fsync on (PostgreSQL's defaults): the figures include the flush of every commit.
    with PostgresServer(database="bench", fsync=True) as postgres:
        env = {**os.environ, "BENCH_PG_URL": postgres.url, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        for step in STEPS:
            if args.only and step.name not in args.only:
                continue
            ok, seconds = run_step(step, args.quick, env, figures.append)
            durations.append(f"{step.name}={seconds:.0f}s")
            settle(postgres.url)
            if not ok:
                failed.append(step.name)

    verdicts = evaluate(parse(figures))
    regressions = gate_misses(verdicts)
    total = time.monotonic() - started
    footer = [
        "steps " + " ".join(durations) + f" total={total:.0f}s load_at_end={load()}"
        + (" quick=yes" if args.quick else ""),
        *(f"failed step={name}" for name in failed),
        *(f"regression {line}" for line in regressions),
    ]
    print("\n== targets")
    for line in verdicts:
        print(line)
    print("\n" + "\n".join(footer))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join([*lines, *figures, *verdicts, *footer]) + "\n")
    print(f"\nwritten: {RESULTS.relative_to(ROOT)} ({len(TARGETS)} targets, {len(figures)} figures)")
    if regressions:
        print(f"\n{len(regressions)} figure(s) regressed more than 10 % against the stored baseline (see above);"
              " bench/README.md says how to refresh the baseline once a slowdown is meant")
    return 1 if failed or regressions else 0


if __name__ == "__main__":
    sys.exit(main())
