"""The tallies behind the approvals dashboard, written in the commit that records a decision.

``decide()`` adds :func:`record` to its batch: upserts of the rows the decision adds to each
table, its day's and its month's (``grain`` "d" and "m"): :class:`InsightTally` (agent, tool,
outcome, source, reviewer, rule), :class:`InsightTarget` (agent, tool, target, outcome; the
least and greatest exact target), :class:`InsightWait` (a person's wait, by bucket) and, for an
approval by a person, :class:`InsightReviewer` (all time). The tables are kept apart so that no
key crosses targets with reviewers. The dashboard then sums rows bounded by the history's
variety per day or month, never by its volume; a period of more than 30 days reads months.

Waits are kept as a bounded histogram, a column per bucket of one row per key (``b0`` ..
``b79``): bucket 0 is under a second, bucket ``b`` is ``[RATIO**(b-1), RATIO**b)`` seconds, the
last holds every longer wait (over about 14 months). A median read from it is the bucket's geometric middle,
within ``sqrt(RATIO)`` (about 12 %) of the exact one: PostgreSQL's ``percentile_cont`` would read
every decision of the period; this reads the buckets, on both databases alike.

:func:`rebuild` counts an existing history again (the bench, and an installation that had
decisions before these tables), reading the decisions in chunks by primary key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, router, transaction
from django.db.models import Model

from ...models import (
    WAIT_BUCKETS,
    Decision,
    InsightReviewer,
    InsightTally,
    InsightTarget,
    InsightWait,
    ToolCall,
)
from .. import rules, sql

RATIO = 1.25
MAX_BUCKET = WAIT_BUCKETS - 1
#: the columns of the wait histogram, bucket by bucket
BUCKET_COLUMNS = tuple(f"b{i}" for i in range(WAIT_BUCKETS))
#: targets longer than this are not kept (their kind is "other": no suggestion is made of them)
MAX_TARGET = 1000
#: decisions whose wait is not a person's: a rule's, and an expiry's
UNTIMED = frozenset({"rule", "expiry"})


def bucket_of(seconds: float) -> int:
    if seconds < 1:
        return 0
    return min(MAX_BUCKET, 1 + int(math.floor(math.log(seconds) / math.log(RATIO))))


def bucket_value(bucket: int) -> float:
    """The seconds a bucket stands for: its geometric middle (0.5 s for the first)."""
    if bucket <= 0:
        return 0.5
    return float(RATIO ** (bucket - 0.5))


def target_of(capability: str, args: Any) -> tuple[str, str, str]:
    """(kind, target, exact) of a call: what a rule would match. A path tool's target is its
    normalised path's folder with a trailing ``/``, its exact target the path the gate sees; a
    shell call's both are the whole command; a tool without one has ``("none", "", "")``."""
    if capability in rules.PATH_CAPABILITIES:
        path = rules.gate_path(capability, args)
        if path is None or len(path) > MAX_TARGET:
            return "other", "", ""
        return "path", path.rsplit("/", 1)[0] + "/", path
    if capability == "shell":
        command = args.get("command") if isinstance(args, dict) else None
        if not isinstance(command, str) or not command or len(command) > MAX_TARGET or "\x00" in command:
            return "other", "", ""
        return "shell", command, command
    return "none", "", ""


def outcome_of(verdict: str, source: str) -> str:
    return "expired" if source == "expiry" else str(verdict)


@dataclass(frozen=True)
class Table:
    """A tally table: the columns of its key, those added up, those kept least and greatest."""

    model: type[Model]
    key: tuple[str, ...]
    added: tuple[str, ...]
    least: tuple[str, ...] = ()
    greatest: tuple[str, ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.key, *self.added, *self.least, *self.greatest)


TALLY = Table(InsightTally, ("grain", "day", "agent", "tool", "outcome", "source", "reviewer", "rule"),
              ("count", "wait_sum"))
TARGET = Table(InsightTarget, ("grain", "day", "agent", "tool", "kind", "target", "outcome", "source"),
               ("count", "wait_sum"), ("first_target",), ("last_target",))
REVIEWER = Table(InsightReviewer, ("agent", "tool", "kind", "target", "reviewer"), ("count",))
WAIT = Table(InsightWait, ("grain", "day", "agent", "tool", "reviewer"), ("count", *BUCKET_COLUMNS))
TABLES = (TALLY, TARGET, REVIEWER, WAIT)


def _conflict(conn: Any, table: Table, added: tuple[str, ...] | None = None) -> str:
    """The ``ON CONFLICT`` clause that adds a row of ``table`` to the one there (only the
    ``added`` columns, if given: the others are left as they are)."""
    q = conn.ops.quote_name
    name = q(table.model._meta.db_table)
    # Targets are compared by code point, as Python compares them (suggest's common prefix of
    # the least and greatest is then that of every target between): PostgreSQL's "C" collation
    # (bytes of UTF-8), SQLite's BINARY (its default).
    pg = conn.vendor == "postgresql"
    c = ' COLLATE "C"' if pg else ""
    sets = [f"{q(col)} = {name}.{q(col)} + excluded.{q(col)}" for col in (table.added if added is None else added)]
    sets += [f"{q(col)} = {'LEAST' if pg else 'MIN'}({name}.{q(col)}{c}, excluded.{q(col)}{c})" for col in table.least]
    sets += [f"{q(col)} = {'GREATEST' if pg else 'MAX'}({name}.{q(col)}{c}, excluded.{q(col)}{c})"
             for col in table.greatest]
    return f"ON CONFLICT ({', '.join(q(col) for col in table.key)}) DO UPDATE SET {', '.join(sets)}"


Rows = dict[Table, list[tuple[Any, ...]]]


def rows_of(
    call: ToolCall, *, verdict: str, source: str, reviewer: int | None, rule: int | None, at: datetime,
    target: tuple[str, str, str] | None = None,
) -> Rows:
    """The rows one decision adds to each table (``target``: ``target_of`` the call, if known)."""
    kind, folder, exact = target or target_of(call.capability, call.args)
    wait = max(0.0, (at - call.created_at).total_seconds()) if call.created_at is not None else 0.0
    outcome, who = outcome_of(verdict, source), reviewer or 0
    rows: Rows = {TALLY: [], TARGET: [], REVIEWER: [], WAIT: []}
    for grain, day in (("d", at.date()), ("m", at.date().replace(day=1))):
        rows[TALLY].append((grain, day, call.agent, call.name, outcome, source, who, rule or 0, 1, wait))
        rows[TARGET].append((grain, day, call.agent, call.name, kind, folder, outcome, source, 1, wait, exact, exact))
        # Waits are a person's: a rule decides at once, an expiry is the deadline, not a wait.
        if source not in UNTIMED:
            histogram = [0] * WAIT_BUCKETS
            histogram[bucket_of(wait)] = 1
            rows[WAIT].append((grain, day, call.agent, call.name, who, 1, *histogram))
    if outcome == "approved" and source not in UNTIMED and who:
        rows[REVIEWER].append((call.agent, call.name, kind, folder, who, 1))
    return rows


def record(
    batch: sql.Batch, call: ToolCall, *, verdict: str, source: str, reviewer: int | None, rule: int | None,
    at: datetime,
) -> None:
    """Count one decision: its upserts become steps of the deciding batch (in its transaction;
    on PostgreSQL part of its one statement). Its day's and its month's rows differ in key, so
    no statement writes a row twice."""
    for table, found in rows_of(call, verdict=verdict, source=source, reviewer=reviewer, rule=rule, at=at).items():
        if not found:
            continue
        if table is WAIT:
            # The wait's own bucket only: two short rows, not two of eighty-six values.
            n = len(WAIT.key)
            bucket = found[0][n + 1:].index(1)
            added = ("count", BUCKET_COLUMNS[bucket])
            batch.insert(WAIT.model, (*WAIT.key, *added), [(*row[:n], 1, 1) for row in found],
                         on_conflict=_conflict(batch.conn, WAIT, added))
            continue
        batch.insert(table.model, table.columns, found, on_conflict=_conflict(batch.conn, table))


class Merged:
    """Rows of many decisions added up in memory by key, to be written at once."""

    def __init__(self) -> None:
        self.rows: dict[Table, dict[tuple[Any, ...], list[Any]]] = {t: {} for t in TABLES}

    def add(self, rows: Rows) -> None:
        for table, found in rows.items():
            n = len(table.key)
            into = self.rows[table]
            for row in found:
                merged = into.get(row[:n])
                if merged is None:
                    into[row[:n]] = list(row[n:])
                    continue
                i = 0
                for _ in table.added:
                    merged[i] += row[n + i]
                    i += 1
                for _ in table.least:
                    merged[i] = min(merged[i], row[n + i])
                    i += 1
                for _ in table.greatest:
                    merged[i] = max(merged[i], row[n + i])
                    i += 1

    def result(self) -> Rows:
        return {t: [(*k, *v) for k, v in found.items()] for t, found in self.rows.items()}


def write(rows: Rows, *, alias: str | None = None) -> None:
    """Add rows (their counts and sums are added to those already there). Rows of one key are
    added up first: one upsert may not write a row twice (PostgreSQL refuses it)."""
    alias = alias or router.db_for_write(InsightTally)
    conn = connections[alias]
    merged = Merged()
    merged.add(rows)
    for table, found in merged.result().items():
        sql.insert(table.model, table.columns, found, db=(alias, conn), on_conflict=_conflict(conn, table))


def rebuild(*, chunk: int = 20_000, alias: str | None = None) -> int:
    """Count every decision again (the tallies are emptied first); the number counted. Rows are
    merged in memory per key before they are written, a chunk of decisions at a time."""
    alias = alias or router.db_for_write(InsightTally)
    counted = 0
    with transaction.atomic(using=alias):
        for table in TABLES:
            table.model._default_manager.using(alias).all().delete()
        last = 0
        while True:
            found = list(
                Decision.objects.using(alias).filter(pk__gt=last).order_by("pk")
                .values_list("pk", "verdict", "source", "decided_by_id", "rule_id", "decided_at",
                             "tool_call__agent", "tool_call__name", "tool_call__capability", "tool_call__args",
                             "tool_call__created_at")[:chunk]
            )
            if not found:
                return counted
            last = found[-1][0]
            merged = Merged()
            for _, verdict, source, by, rule, at, agent, name, capability, args, created in found:
                call = ToolCall(agent=agent, name=name, capability=capability, args=args, created_at=created)
                merged.add(rows_of(call, verdict=verdict, source=source, reviewer=by, rule=rule, at=at))
            write(merged.result(), alias=alias)
            counted += len(found)
