"""The tallies behind the approvals dashboard, written in the commit that records a decision.

``decide()`` adds :func:`record` to its batch: one upsert of an :class:`InsightTally` row (the
day, agent, tool, target, outcome, source, reviewer and rule of the decision; its count, summed
wait and least and greatest exact target) and one of an :class:`InsightWait` row (its wait's
bucket). The dashboard then sums rows bounded by the history's variety (days x agents x tools x
targets x reviewers), never by its volume: a million decisions of a hundred kinds are a few
thousand rows.

Waits are kept as a bounded histogram: bucket 0 is under a second, bucket ``b`` is
``[RATIO**(b-1), RATIO**b)`` seconds. A median read from it is the bucket's geometric middle,
within ``sqrt(RATIO)`` (about 12 %) of the exact one: PostgreSQL's ``percentile_cont`` would read
every decision of the period; this reads the buckets, on both databases alike.

:func:`rebuild` counts an existing history again (the bench, and an installation that had
decisions before these tables), reading the decisions in chunks by primary key.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connections, router, transaction

from ...models import Decision, InsightTally, InsightWait, ToolCall
from .. import rules, sql

RATIO = 1.25
MAX_BUCKET = 120
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


#: the columns of a tally row and of a wait row, in the order :func:`rows_of` gives them
TALLY_KEY = ("day", "agent", "tool", "target", "kind", "outcome", "source", "reviewer", "rule")
TALLY_COLUMNS = (*TALLY_KEY, "count", "wait_sum", "first_target", "last_target")
WAIT_KEY = ("day", "agent", "tool", "reviewer", "bucket")
WAIT_COLUMNS = (*WAIT_KEY, "count")


def _conflicts(conn: Any) -> tuple[str, str]:
    """The ``ON CONFLICT`` clauses that add a tally row and a wait row to the ones there."""
    q = conn.ops.quote_name
    # Targets are compared by code point, as Python compares them (suggest's common prefix of
    # the least and greatest is then that of every target between): PostgreSQL's "C" collation
    # (bytes of UTF-8), SQLite's BINARY (its default).
    least, greatest = ("LEAST", "GREATEST") if conn.vendor == "postgresql" else ("MIN", "MAX")
    c = ' COLLATE "C"' if conn.vendor == "postgresql" else ""
    tally = q(InsightTally._meta.db_table)
    tally_sql = (
        f"ON CONFLICT ({', '.join(q(c) for c in TALLY_KEY)}) DO UPDATE SET "
        f"{q('count')} = {tally}.{q('count')} + excluded.{q('count')}, "
        f"{q('wait_sum')} = {tally}.{q('wait_sum')} + excluded.{q('wait_sum')}, "
        f"{q('first_target')} = {least}({tally}.{q('first_target')}{c}, excluded.{q('first_target')}{c}), "
        f"{q('last_target')} = {greatest}({tally}.{q('last_target')}{c}, excluded.{q('last_target')}{c})"
    )
    wait = q(InsightWait._meta.db_table)
    wait_sql = (
        f"ON CONFLICT ({', '.join(q(c) for c in WAIT_KEY)}) DO UPDATE SET "
        f"{q('count')} = {wait}.{q('count')} + excluded.{q('count')}"
    )
    return tally_sql, wait_sql


def rows_of(
    call: ToolCall, *, verdict: str, source: str, reviewer: int | None, rule: int | None, at: datetime
) -> tuple[tuple[Any, ...], tuple[Any, ...] | None]:
    """The tally's and the wait histogram's row of one decision (count 1; no wait row for a
    decision nobody waited for a person to make)."""
    kind, target, exact = target_of(call.capability, call.args)
    wait = max(0.0, (at - call.created_at).total_seconds()) if call.created_at is not None else 0.0
    day = at.date()
    tally = (day, call.agent, call.name, target, kind, outcome_of(verdict, source), source, reviewer or 0,
             rule or 0, 1, wait, exact, exact)
    # Waits are a person's: a rule decides at once, an expiry is the deadline, not a wait.
    timed = None if source in UNTIMED else (day, call.agent, call.name, reviewer or 0, bucket_of(wait), 1)
    return tally, timed


def record(
    batch: sql.Batch, call: ToolCall, *, verdict: str, source: str, reviewer: int | None, rule: int | None,
    at: datetime,
) -> None:
    """Count one decision: its upserts become steps of the deciding batch (in its transaction;
    on PostgreSQL part of its one statement)."""
    tally, wait = rows_of(call, verdict=verdict, source=source, reviewer=reviewer, rule=rule, at=at)
    tally_sql, wait_sql = _conflicts(batch.conn)
    batch.insert(InsightTally, TALLY_COLUMNS, [tally], on_conflict=tally_sql)
    if wait is not None:
        batch.insert(InsightWait, WAIT_COLUMNS, [wait], on_conflict=wait_sql)


def merged(tallies: Iterable[tuple[Any, ...]], waits: Iterable[tuple[Any, ...]]) -> tuple[list[Any], list[Any]]:
    """The rows with one row per key (counts and sums added, the least and greatest target kept):
    one upsert may not write a row twice."""
    by_key: dict[tuple[Any, ...], list[Any]] = {}
    for row in tallies:
        key = tuple(row[:len(TALLY_KEY)])
        seen = by_key.get(key)
        if seen is None:
            by_key[key] = list(row[len(TALLY_KEY):])
        else:
            count, wait, first, last = row[len(TALLY_KEY):]
            seen[0] += count
            seen[1] += wait
            seen[2] = min(seen[2], first)
            seen[3] = max(seen[3], last)
    counts: dict[tuple[Any, ...], int] = {}
    for row in waits:
        key = tuple(row[:len(WAIT_KEY)])
        counts[key] = counts.get(key, 0) + row[len(WAIT_KEY)]
    return [(*k, *v) for k, v in by_key.items()], [(*k, n) for k, n in counts.items()]


def write(tallies: Iterable[tuple[Any, ...]], waits: Iterable[tuple[Any, ...]], *, alias: str | None = None) -> None:
    """Add rows (their counts and sums are added to those already there)."""
    alias = alias or router.db_for_write(InsightTally)
    conn = connections[alias]
    tally_sql, wait_sql = _conflicts(conn)
    tally_rows, wait_rows = merged(tallies, waits)
    sql.insert(InsightTally, TALLY_COLUMNS, tally_rows, db=(alias, conn), on_conflict=tally_sql)
    sql.insert(InsightWait, WAIT_COLUMNS, wait_rows, db=(alias, conn), on_conflict=wait_sql)


def rebuild(*, chunk: int = 20_000, alias: str | None = None) -> int:
    """Count every decision again (the tallies are emptied first); the number counted. Rows are
    merged in memory per key before they are written, a chunk of decisions at a time."""
    alias = alias or router.db_for_write(InsightTally)
    counted = 0
    with transaction.atomic(using=alias):
        InsightTally.objects.using(alias).all().delete()
        InsightWait.objects.using(alias).all().delete()
        last = 0
        while True:
            rows = list(
                Decision.objects.using(alias).filter(pk__gt=last).order_by("pk")
                .values_list("pk", "verdict", "source", "decided_by_id", "rule_id", "decided_at",
                             "tool_call__agent", "tool_call__name", "tool_call__capability", "tool_call__args",
                             "tool_call__created_at")[:chunk]
            )
            if not rows:
                return counted
            last = rows[-1][0]
            tallies, waits = [], []
            for _, verdict, source, by, rule, at, agent, name, capability, args, created in rows:
                call = ToolCall(agent=agent, name=name, capability=capability, args=args, created_at=created)
                tally, wait = rows_of(call, verdict=verdict, source=source, reviewer=by, rule=rule, at=at)
                tallies.append(tally)
                if wait is not None:
                    waits.append(wait)
            write(tallies, waits, alias=alias)
            counted += len(rows)
