"""Whether several querysets have rows, in one statement: the reconciler's first look.

A reconciler round has about ten things to look at (expired leases, overdue calls and questions,
notices due, lost jobs, forgotten runs...), and on a healthy installation every one of them finds
nothing. Asked one by one that is a statement each, and their round trips were most of a round's
cost (issue 34: 9 statements, 3 a few waves earlier). :func:`existing` asks all of them in one
``SELECT EXISTS (...), EXISTS (...), ...``; each part only then does its own work, with the very
queryset it was probed with, so a part is skipped only when its own query would have found nothing
(a row arriving after the probe is found by the next round, as one arriving after the part's own
query would be).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import QuerySet

__all__ = ["existing"]


def existing(querysets: Mapping[str, QuerySet[Any] | None]) -> dict[str, bool]:
    """``{name: queryset.exists()}`` for every queryset, in one statement when they read the same
    database (one each otherwise). A None stands for a part with no cheap look of its own: True,
    so that part always runs."""
    found = {name: True for name, qs in querysets.items() if qs is None}
    probed = {name: qs for name, qs in querysets.items() if qs is not None}
    aliases = {qs.db for qs in probed.values()}
    if len(aliases) != 1:
        return {**found, **{name: qs.exists() for name, qs in probed.items()}}
    alias = aliases.pop()
    conn = connections[alias]
    parts, params = [], []
    for name, qs in probed.items():
        try:
            sql, values = qs.order_by().values("pk")[:1].query.get_compiler(using=alias).as_sql()
        except EmptyResultSet:  # .none(), or a filter nothing can match: no statement needed
            found[name] = False
            continue
        parts.append((name, f"EXISTS ({sql})"))
        params.extend(values)
    if not parts:
        return found
    with conn.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(sql for _, sql in parts), params)
        row = cursor.fetchone()
    return {**found, **{name: bool(flag) for (name, _), flag in zip(parts, row, strict=True)}}
