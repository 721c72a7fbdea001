"""Benchmark 4: the approval inbox in the admin at 1k, 10k and 100k pending calls.

Each size holds that many suspended runs, each with one pending call, two transcript messages and
ten events (so 1M events at 100k). Rows are bulk-inserted (executemany on SQLite, COPY on
PostgreSQL) and the insertion is timed apart. At each size the pages are rendered with Django's
test Client as a logged-in superuser: the inbox changelist and the decision page (the figures
with targets), plus the runs changelist and a run's page, and the user-facing run list (its first
and its last page). Queries are counted with
CaptureQueriesContext on one render.

    python -m bench.inbox --db sqlite|postgres [--sizes 1000,10000,100000] [--renders N] [--profile]
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from bench.common import (
    DATABASES,
    database_url,
    db_label,
    figure,
    median,
    ms,
    note,
    profile,
    setup_django,
)

EVENTS_PER_RUN = 10
BATCH = 20_000
AGENTS = ["app.agents.Scribe", "app.agents.Researcher", "app.agents.Janitor", "app.agents.Mailer"]
TOOLS = [("write", "write"), ("shell", "shell"), ("bump", "shell")]
EVENT_TYPES = ["created", "model_request", "model_reply", "tool_call", "tool_result"]
BASE_TIME = datetime(2025, 1, 1, tzinfo=UTC)


class Inserter:
    """Raw multi-row inserts for the nexo tables: the columns of each model, constants adapted
    once, the varying ones per row."""

    def __init__(self) -> None:
        from django.db import connection

        self.connection = connection
        self.pg = connection.vendor == "postgresql"

    def value(self, v: Any) -> Any:
        if isinstance(v, (dict, list)):
            return json.dumps(v)
        if self.pg:
            return v
        if isinstance(v, uuid.UUID):
            return v.hex
        if isinstance(v, datetime):
            return self.connection.ops.adapt_datetimefield_value(v)
        if isinstance(v, bool):
            return int(v)
        return v

    def columns(self, model: Any, given: Sequence[str]) -> tuple[list[str], list[Any]]:
        """The table's columns (auto primary keys left to the database) and, for those not in
        ``given``, each field's default."""
        names: list[str] = []
        defaults: list[Any] = []
        for field in written_fields(model):
            names.append(field.column)
            if field.attname in given:
                defaults.append(None)
            elif field.has_default():
                defaults.append(self.value(field.get_default()))
            elif field.null:
                defaults.append(None)
            elif getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
                defaults.append(self.value(BASE_TIME))
            else:
                raise RuntimeError(f"{model.__name__}.{field.name} needs a value in the benchmark data")
        return names, defaults

    def insert(self, model: Any, given: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
        """Insert rows whose values are those of ``given`` (attnames), in that order."""
        names, defaults = self.columns(model, given)
        index = {f.attname: i for i, f in enumerate(written_fields(model))}
        slots = [index[name] for name in given]
        table = self.connection.ops.quote_name(model._meta.db_table)
        columns = ", ".join(self.connection.ops.quote_name(n) for n in names)
        count = 0

        def full(row: Sequence[Any]) -> list[Any]:
            values = list(defaults)
            for slot, v in zip(slots, row, strict=True):
                values[slot] = v
            return values

        with self.connection.cursor() as cursor:
            if self.pg:
                raw = cursor.cursor  # the psycopg cursor: COPY is not in the DB-API
                with raw.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(full(row))
                        count += 1
            else:
                sql = f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(names))})"
                batch: list[list[Any]] = []
                for row in rows:
                    batch.append(full(row))
                    if len(batch) >= BATCH:
                        cursor.executemany(sql, batch)
                        count += len(batch)
                        batch = []
                if batch:
                    cursor.executemany(sql, batch)
                    count += len(batch)
        return count


def written_fields(model: Any) -> list[Any]:
    """The columns an INSERT writes: not an automatic key, not a column the database generates."""
    return [
        f for f in model._meta.concrete_fields
        if not (f.primary_key and f.get_internal_type() in ("AutoField", "BigAutoField"))
        and not getattr(f, "generated", False)
    ]  # fmt: skip


def add_pending(ins: Inserter, start: int, stop: int) -> None:
    """Runs ``start``..``stop-1``: suspended, one pending call each, 2 messages, 10 events."""
    from django.db import transaction

    from nexo_django.models import AgentRun, RunEvent, RunMessage, ToolCall, args_digest

    ids = [uuid.uuid5(uuid.NAMESPACE_OID, f"bench-run-{i}") for i in range(start, stop)]
    when = [ins.value(BASE_TIME + timedelta(seconds=i)) for i in range(start, stop)]
    run_ids = [ins.value(u) for u in ids]
    suspended = ins.value("suspended")
    with transaction.atomic():
        if ins.pg:
            # The rows are consistent by construction: skip the per-row foreign key triggers
            # (a superuser setting, local to this transaction).
            with ins.connection.cursor() as cursor:
                cursor.execute("SET LOCAL session_replication_role = replica")
        ins.insert(AgentRun, ["id", "agent", "prompt", "status", "created_at", "updated_at", "generation"], (
            (run_ids[k], AGENTS[i % len(AGENTS)], f"Task number {i}: tidy the notes.", suspended,
             when[k], when[k], 1)
            for k, i in enumerate(range(start, stop))
        ))  # fmt: skip
        calls = []
        for k, i in enumerate(range(start, stop)):
            name, capability = TOOLS[i % len(TOOLS)]
            args = {"path": f"notes/{i}.txt", "content": f"note {i}\n" * 3} if name == "write" else (
                {"command": f"echo {i}"} if name == "shell" else {"label": str(i)})
            calls.append((run_ids[k], AGENTS[i % len(AGENTS)], "call_0_0", name, capability, ins.value(args),
                          args_digest(args), "pending_approval", ins.value(False), when[k], when[k]))  # fmt: skip
        ins.insert(ToolCall, ["run_id", "agent", "tool_call_id", "name", "capability", "args", "digest",
                              "status", "idempotent", "created_at", "updated_at"], calls)  # fmt: skip
        user = ins.value({"role": "user", "content": "Tidy the notes."})
        ins.insert(RunMessage, ["run_id", "seq", "role", "data", "created_at"], (
            row for k, (name, _) in ((k, TOOLS[i % len(TOOLS)]) for k, i in enumerate(range(start, stop)))
            for row in (
                (run_ids[k], 0, "user", user, when[k]),
                (run_ids[k], 1, "assistant", ins.value({"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_0_0", "name": name, "args": json.loads(calls[k][5])}]}), when[k]),
            )
        ))  # fmt: skip
        payloads = [ins.value({"turn": 1, "n": n}) for n in range(EVENTS_PER_RUN)]
        ins.insert(RunEvent, ["run_id", "type", "data", "created_at"], (
            (run_ids[k], EVENT_TYPES[n % len(EVENT_TYPES)], payloads[n], when[k])
            for k in range(len(ids)) for n in range(EVENTS_PER_RUN)
        ))  # fmt: skip
    if ins.pg:
        with ins.connection.cursor() as cursor:
            # What autovacuum does after a load like this: statistics, and the visibility map
            # that lets counts and DISTINCTs be answered from an index alone.
            cursor.execute("VACUUM (ANALYZE)")


def render(client: Any, url: str, renders: int, expect: str) -> tuple[float, int]:
    """Median ms over ``renders`` GETs (after two warm-ups) and the queries of one."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(2):
        response = client.get(url)
        if response.status_code != 200 or expect.encode() not in response.content:
            raise RuntimeError(f"GET {url}: {response.status_code}, expected {expect!r} in the page")
    times = []
    for _ in range(renders):
        start = time.perf_counter_ns()
        client.get(url)
        times.append(time.perf_counter_ns() - start)
    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    return ms(median(times)), len(captured.captured_queries)


def render_three(client: Any, url: str) -> None:
    for _ in range(3):
        client.get(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", choices=DATABASES, default="sqlite")
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--renders", type=int, default=10)
    parser.add_argument("--profile", action="store_true", help="cProfile the pages at the largest size")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))

    setup_django(database_url(args.db))
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    from nexo_django.models import PendingApproval

    user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", "bench")
    client = Client()
    client.force_login(user)
    ins = Inserter()
    have = 0
    for size in sizes:
        start = time.perf_counter()
        add_pending(ins, have, size)
        inserted = time.perf_counter() - start
        have = size
        pending = PendingApproval.objects.filter(status="pending_approval")
        if pending.count() != size:
            raise RuntimeError(f"expected {size} pending calls, found {pending.count()}")
        newest = pending.order_by("-created_at").first()
        assert newest is not None
        pages = {
            "inbox": (reverse("admin:nexo_django_pendingapproval_changelist"), f"({size} waiting)"),
            "decision": (reverse("admin:nexo_django_pendingapproval_change", args=[newest.pk]), "Decide"),
            "runs": (reverse("admin:nexo_django_agentrun_changelist"), f"{size} agent runs"),
            "run": (reverse("admin:nexo_django_agentrun_change", args=[newest.run_id]), str(newest.run_id)[:8]),
            # The user-facing pages (nexo_django.urls): the run list, its last page, a run's page.
            "user_runs": (reverse("nexo_django:run_list"), "Page 1 of"),
            "user_runs_last": (reverse("nexo_django:run_list") + f"?page={(size + 24) // 25}", "Newer"),
        }
        note(f"{size} pending calls: inserted {size} runs, {size} calls, {2 * size} messages, "
             f"{EVENTS_PER_RUN * size} events in {inserted:.1f}s")  # fmt: skip
        if args.profile and size == sizes[-1]:
            for page, (url, _) in pages.items():
                print(f"--- {page} {url}")
                print(profile(partial(render_three, client, url), top=35, sort="tottime"))
            continue
        for page, (url, expect) in pages.items():
            median_ms, queries = render(client, url, args.renders, expect)
            figure(f"{page}_page", db=db_label(), pending=size, events=EVENTS_PER_RUN * size,
                   median_ms=median_ms, queries=queries)  # fmt: skip
        figure("inbox_insert", db=db_label(), pending=size, seconds=inserted)


if __name__ == "__main__":
    main()
