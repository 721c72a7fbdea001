"""What a run's pages show of rows that grow with the run: a window of them, never all.

A turn can hold 10,000 calls, and then 10,000 results in the transcript and 10,000 events. Each
page and JSON response of a run (the admin's run page, the user's run page, the status the page
polls) shows counts by status and a window of at most a fixed number of rows, with links to the
windows before and after it: its size and its queries are the same at 10 calls and at 10,000.
Windows are keyset pages (``?calls_from=<id>``, ``?transcript_from=<seq>``...): reading one costs
an index probe, whatever its place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, QuerySet
from django.http import HttpRequest

from .models import AgentRun, CallStatus, ToolCall

#: Calls a run's page lists at once (the admin's table; the user's page's calls waiting).
CALLS_SHOWN = 50
#: Pending calls the status JSON gives at once (``pending_after`` pages on).
PENDING_SHOWN = 50
#: Transcript messages the user's run page shows at once.
MESSAGES_SHOWN = 50
#: HTML bytes of all the messages of one window together (each gets its share, within its own
#: budget): a window of big messages stays under a megabyte.
WINDOW_BYTES = 400_000
#: HTML bytes of all the pending calls' arguments on the user's page together.
PENDING_BYTES = 240_000
#: Pending calls whose multi-line arguments the user's page shows again as text.
TEXT_CALLS = 3


@dataclass
class Window:
    """Rows of an ordered queryset at one place: ``earlier`` rows come before them, ``later``
    after; ``earlier_from`` and ``later_from`` are the keys that open the windows next to it."""

    rows: list[Any]
    total: int
    earlier: int = 0
    later: int = 0
    earlier_from: Any = None
    later_from: Any = None
    key: str = "pk"

    @property
    def clipped(self) -> bool:
        return bool(self.earlier or self.later)

    @property
    def first_number(self) -> int:
        """The place of the first row shown, counted from 1."""
        return self.earlier + 1

    @property
    def last_number(self) -> int:
        return self.earlier + len(self.rows)


def window(qs: QuerySet[Any], key: str, *, limit: int, start: Any = None, tail: bool = False) -> Window:
    """At most ``limit`` rows of ``qs`` (ascending by ``key``): from ``start`` on, or, with no
    ``start``, the first ones (or the last ones, ``tail``). Four queries at most, each by index."""
    ordered = qs.order_by(key)
    total = ordered.count()
    if start is not None:
        rows = list(ordered.filter(**{f"{key}__gte": start})[:limit])
    elif tail:
        rows = list(reversed(ordered.reverse()[:limit]))
    else:
        rows = list(ordered[:limit])
    if not rows:
        return Window([], total, earlier=total, key=key)
    first, last = getattr(rows[0], key), getattr(rows[-1], key)
    earlier = ordered.filter(**{f"{key}__lt": first}).count() if (start is not None or tail) else 0
    later = total - earlier - len(rows)
    before = None
    if earlier:
        # The window before this one starts ``limit`` rows earlier.
        keys = list(ordered.filter(**{f"{key}__lt": first}).reverse().values_list(key, flat=True)[:limit])
        before = keys[-1] if keys else None
    after = None
    if later:
        after = ordered.filter(**{f"{key}__gt": last}).values_list(key, flat=True).first()
    return Window(rows, total, earlier=earlier, later=later, earlier_from=before, later_from=after, key=key)


def int_param(request: HttpRequest, name: str) -> int | None:
    """A whole-number query parameter, or None when it is absent or not one."""
    raw = request.GET.get(name)
    try:
        return int(raw) if raw is not None and raw != "" else None
    except ValueError:
        return None


def call_counts(run: AgentRun) -> dict[str, int]:
    """The run's calls by status (one grouped query), in the order of :class:`CallStatus`."""
    found = dict(
        ToolCall.objects.filter(run=run).order_by().values_list("status").annotate(n=Count("id")).values_list("status", "n")
    )
    return {status: found[status] for status in CallStatus.values if found.get(status)}


def calls_window(run: AgentRun, *, start: int | None = None, limit: int = CALLS_SHOWN) -> Window:
    """The run's calls in the order they were made, ``limit`` at a time, from call ``start``."""
    qs = ToolCall.objects.filter(run=run).defer("args", "result").select_related("decision", "decision__decided_by")
    return window(qs, "id", limit=limit, start=start)


def pending_window(run: AgentRun, *, after: int | None = None, limit: int = PENDING_SHOWN) -> tuple[list[ToolCall], int]:
    """The run's calls waiting for a decision, oldest first: at most ``limit`` after call
    ``after``, and how many wait in all."""
    qs = ToolCall.objects.filter(run=run, status=CallStatus.PENDING_APPROVAL).order_by("id")
    total = qs.count()
    shown = qs.filter(id__gt=after) if after is not None else qs
    rows = list(shown[:limit])
    for row in rows:
        row.run = run  # known: no query per call for its run
    return rows, total


def budget_each(total: int, count: int, *, floor: int = 2_000, ceiling: int | None = None) -> int:
    """Each of ``count`` pieces' share of ``total`` bytes, at least ``floor``."""
    share = max(floor, total // max(1, count))
    return min(share, ceiling) if ceiling is not None else share
