"""What every benchmark shares: figure lines, statistics, databases, query and transaction counts.

A benchmark prints one line per figure: ``figure=NAME key=value key=value ...``. bench/run.py
collects those lines, adds the versions and the machine, and compares them with the targets.
Numbers never fail anything; only a crash does.
"""

from __future__ import annotations

import atexit
import cProfile
import io
import os
import pstats
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# bench/run.py stops a benchmark that overruns with SIGTERM: exit through atexit, so the servers
# it started are stopped and its scratch directory removed.
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

# --- output -------------------------------------------------------------------------------------


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value == 0 or abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    text = str(value)
    return text.replace(" ", "_") if text else "-"


def figure(name: str, **values: Any) -> None:
    """Print one summary line: ``figure=NAME key=value ...`` (flushed, so run.py sees it live)."""
    pairs = " ".join(f"{key}={fmt(value)}" for key, value in values.items())
    print(f"figure={name} {pairs}", flush=True)


def note(text: str) -> None:
    """Progress and context for a person; run.py keeps it out of the figures."""
    print(f"# {text}", file=sys.stderr, flush=True)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))])


def ms(ns: float) -> float:
    return ns / 1e6


@contextmanager
def stopwatch(label: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    note(f"{label}: {time.perf_counter() - start:.2f}s")


def profile(func: Callable[[], Any], *, top: int = 30, sort: str = "cumulative") -> str:
    """cProfile ``func`` and return the top of the table (used by ``--profile`` flags)."""
    profiler = cProfile.Profile()
    profiler.runcall(func)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(sort).print_stats(top)
    return out.getvalue()


# --- databases ----------------------------------------------------------------------------------


_SCRATCH: list[Path] = []


def scratch() -> Path:
    """This process's temporary directory, removed when it exits."""
    if not _SCRATCH:
        path = Path(tempfile.mkdtemp(prefix="nexo-bench-"))
        _SCRATCH.append(path)
        atexit.register(shutil.rmtree, path, True)
    return _SCRATCH[0]


def sqlite_url() -> str:
    """A fresh SQLite file in the scratch directory (the file is created by migrate)."""
    return f"sqlite:///{scratch() / f'bench-{uuid.uuid4().hex[:8]}.sqlite3'}"


def postgres_url() -> str:
    """A fresh database on the benchmark PostgreSQL: the one run.py started (BENCH_PG_URL), or a
    server this process starts for itself (stopped at exit by tests/servers.py). Both run with
    fsync on (PostgreSQL's defaults), unlike the test suite's."""
    base = os.environ.get("BENCH_PG_URL")
    if not base:
        from tests.servers import PostgresServer

        server = PostgresServer(database="postgres_bench", fsync=True).start()
        base = server.url
        os.environ["BENCH_PG_URL"] = base
    import psycopg

    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return base.rsplit("/", 1)[0] + "/" + name


#: SQLite variants: Django's defaults (rollback journal, synchronous=FULL: an fsync of the file
#: and its journal per commit); WAL with synchronous=FULL (one fsync of the WAL per commit: what
#: docs/deployment.md recommends and the W002/W003 checks ask for); WAL with NORMAL (no fsync at
#: commit, only at checkpoints: a power loss can drop the last commits, such as an `executing`
#: mark, so it is not durable and is labelled so); and no sync at all (what is left is CPU and SQL).
SQLITE_MODES = {
    "sqlite": "",
    "sqlite-wal-full": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL",
    "sqlite-wal-normal": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
    "sqlite-nosync": "PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF",
}
#: ``postgres-prepared``: Django's ``server_side_binding`` with psycopg preparing a statement
#: from its fifth run (``prepare_threshold``; Django's default is never, for poolers' sake)
DATABASES = (*SQLITE_MODES, "postgres", "postgres-prepared")
PREPARED_OPTIONS = "?server_side_binding=true&prepare_threshold=5"


def database_url(kind: str) -> str:
    if kind in SQLITE_MODES:
        url = sqlite_url()
        pragmas = SQLITE_MODES[kind]
        return url + ("?init_command=" + quote(pragmas) if pragmas else "")
    if kind == "postgres":
        return postgres_url()
    if kind == "postgres-prepared":
        return postgres_url() + PREPARED_OPTIONS
    raise SystemExit(f"unknown database {kind!r}: use one of {', '.join(DATABASES)}")


def setup_django(db_url: str, *, redis_url: str | None = None) -> None:
    """Point bench.settings at ``db_url`` (and a Redis queue, if given), set Django up, migrate."""
    os.environ["BENCH_DB_URL"] = db_url
    if redis_url:
        os.environ["BENCH_REDIS_URL"] = redis_url
    else:
        os.environ.pop("BENCH_REDIS_URL", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def db_label() -> str:
    """``sqlite`` (Django's defaults), ``sqlite-wal-full``, ``sqlite-wal-normal``,
    ``sqlite-nosync``, or ``postgresql-fsync`` / ``postgresql-nofsync`` (read from the server),
    ``-prepared`` added with ``postgres-prepared``."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SHOW fsync")
            fsync = cursor.fetchone()[0]
            cursor.execute("SHOW synchronous_commit")
            sync_commit = cursor.fetchone()[0]
        label = "postgresql-fsync" if fsync == "on" and sync_commit == "on" else "postgresql-nofsync"
        options = connection.settings_dict.get("OPTIONS", {})
        prepared = options.get("server_side_binding") is True and options.get("prepare_threshold") is not None
        return label + ("-prepared" if prepared else "")
    if connection.vendor != "sqlite":
        return str(connection.vendor)
    init = connection.settings_dict.get("OPTIONS", {}).get("init_command", "")
    return next((kind for kind, pragmas in SQLITE_MODES.items() if pragmas == init), "sqlite-custom")


# --- counting queries and transactions ----------------------------------------------------------

WRITE_VERBS = ("INSERT", "UPDATE", "DELETE", "REPLACE")
#: what marks a PostgreSQL statement whose commit does not wait for the disk (nexo_django.durable.sql)
NO_WAIT_MARK = "set_config('synchronous_commit', 'off', true)"


@dataclass
class Counts:
    """Statements and transactions seen on the default connection while counting."""

    queries: int = 0
    writes: int = 0
    commits: int = 0  # atomic blocks committed
    write_commits: int = 0  # ... of which wrote something
    autocommit_statements: int = 0  # statements outside any atomic block: one transaction each
    autocommit_writes: int = 0
    #: write transactions whose commit did not wait for the disk (``sql.Batch(durable=False)``)
    no_wait_writes: int = 0
    _dirty: bool = field(default=False, repr=False)
    _no_wait: bool = field(default=False, repr=False)

    @property
    def transactions(self) -> int:
        return self.commits + self.autocommit_statements

    @property
    def write_transactions(self) -> int:
        """Transactions that wrote something."""
        return self.write_commits + self.autocommit_writes

    @property
    def durable_write_transactions(self) -> int:
        """What costs a durable flush (an fsync with default settings): the write transactions
        but those that committed without waiting for the disk."""
        return self.write_transactions - self.no_wait_writes


@contextmanager
def counting() -> Iterator[Counts]:
    """Count statements (an execute wrapper) and commits (the connection's ``commit``)."""
    from django.db import connection

    counts = Counts()

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        verb = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        if verb in ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK"):  # bookkeeping, not work
            return execute(sql, params, many, context)
        # A WITH statement writes if one of its parts does (nexo_django.durable.sql.Batch on PostgreSQL).
        is_write = verb in WRITE_VERBS or (verb == "WITH" and any(f"AS ({v} " in sql for v in WRITE_VERBS))
        counts.queries += 1
        counts.writes += is_write
        if connection.in_atomic_block:
            counts._dirty = counts._dirty or is_write
            counts._no_wait = counts._no_wait or sql.startswith("SET LOCAL synchronous_commit TO OFF")
        else:
            counts.autocommit_statements += 1
            counts.autocommit_writes += is_write
            counts.no_wait_writes += is_write and NO_WAIT_MARK in sql
        return execute(sql, params, many, context)

    connection.ensure_connection()
    original_commit = connection.commit

    def commit() -> None:
        counts.commits += 1
        counts.write_commits += counts._dirty
        if counts._dirty and connection.vendor == "sqlite":
            counts._no_wait = connection.connection.execute("PRAGMA synchronous").fetchone()[0] < 2
        counts.no_wait_writes += counts._dirty and counts._no_wait
        counts._dirty = counts._no_wait = False
        original_commit()

    connection.commit = commit  # type: ignore[method-assign]
    try:
        with connection.execute_wrapper(wrapper):
            yield counts
    finally:
        del connection.commit  # back to the class's method


# --- storage ------------------------------------------------------------------------------------

RUN_TABLES = ("agentrun", "runmessage", "toolcall", "decision", "runevent")


def nexo_tables() -> list[str]:
    from django.apps import apps

    return [apps.get_model("nexo_django", name)._meta.db_table for name in RUN_TABLES]


def stored_bytes() -> int:
    """Bytes the nexo tables take in the database, indexes included (pages in use)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT sum(pg_total_relation_size(c)) FROM unnest(%s::regclass[]) AS c", [nexo_tables()]
            )
            return int(cursor.fetchone()[0])
        # SQLite: the whole file's pages in use (no dbstat in every build); the other tables
        # do not change during a benchmark.
        cursor.execute("PRAGMA page_count")
        pages = cursor.fetchone()[0]
        cursor.execute("PRAGMA freelist_count")
        free = cursor.fetchone()[0]
        cursor.execute("PRAGMA page_size")
        return int((pages - free) * cursor.fetchone()[0])


def row_bytes(run_id: Any) -> dict[str, int]:
    """The payload of one run's rows per table: column values as stored, without indexes."""
    from django.apps import apps
    from django.db import connection

    sizes: dict[str, int] = {}
    pk = run_id.hex if connection.vendor == "sqlite" else str(run_id)
    for name in RUN_TABLES:
        model = apps.get_model("nexo_django", name)
        table = model._meta.db_table
        if name == "agentrun":
            where, join = "t.id = %s", ""
        elif name == "decision":
            call_table = apps.get_model("nexo_django", "toolcall")._meta.db_table
            where, join = "c.run_id = %s", f" JOIN {call_table} c ON c.id = t.tool_call_id"
        else:
            where, join = "t.run_id = %s", ""
        if connection.vendor == "postgresql":
            size = "pg_column_size(t.*)"
        else:
            columns = [f.column for f in model._meta.concrete_fields]
            size = " + ".join(f"coalesce(length(CAST(t.{c} AS BLOB)), 0)" for c in columns)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT coalesce(sum({size}), 0) FROM {table} t{join} WHERE {where}", [pk])
            sizes[name] = int(cursor.fetchone()[0])
    return sizes
