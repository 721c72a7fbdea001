"""The approvals dashboard's numbers, from the tallies (:mod:`.tally`) and two indexed counts.

Every function takes a :class:`Filters` and reads rows bounded by the history's variety, not its
volume: the tallies of the period (one per day and kind of decision), the pending calls' partial
index (``nexo_call_pending_created``) for their ages, and the runs' ``created_at`` index.
Percentiles come from the wait histogram (:func:`.tally.bucket_value`, within about 12 %).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet, Sum
from django.utils import timezone

from ...models import (
    AgentRun,
    CallStatus,
    InsightTally,
    InsightTarget,
    InsightWait,
    RunStatus,
    ToolCall,
)
from .tally import BUCKET_COLUMNS, bucket_value

#: the periods a page may ask for: name -> days (None: all of it)
PERIODS: dict[str, int | None] = {"7d": 7, "30d": 30, "90d": 90, "365d": 365, "all": None}
DEFAULT_PERIOD = "30d"
#: periods up to this many days are counted by day; longer ones by whole months
DAY_GRAIN_DAYS = 30
#: the series of "decisions over time", in the order they are drawn
OUTCOMES = ("approved", "approved by rule", "denied", "denied by rule", "expired")
#: the ages of pending calls: (label, upper bound in seconds; None: older)
AGE_BANDS: tuple[tuple[str, float | None], ...] = (
    ("under 10 min", 600), ("10 min – 1 h", 3600), ("1 h – 1 day", 86400), ("1 – 7 days", 7 * 86400),
    ("over 7 days", None),
)
#: rows of the rates table (the most decided first)
RATE_ROWS = 30


@dataclass(frozen=True)
class Filters:
    period: str = DEFAULT_PERIOD
    agent: str = ""
    tool: str = ""

    @property
    def grain(self) -> str:
        """Days up to :data:`DAY_GRAIN_DAYS`, whole months beyond (their rows are a thirtieth)."""
        days = PERIODS[self.period]
        return "d" if days is not None and days <= DAY_GRAIN_DAYS else "m"

    def since(self, today: date) -> date | None:
        days = PERIODS[self.period]
        if days is None:
            return None
        first = today - timedelta(days=days - 1)
        return first if self.grain == "d" else first.replace(day=1)


def _tallies(filters: Filters, today: date, model: type[Any] = InsightTally) -> QuerySet[Any]:
    qs = model.objects.filter(grain=filters.grain)
    since = filters.since(today)
    if since is not None:
        qs = qs.filter(day__gte=since)
    if filters.agent:
        qs = qs.filter(agent=filters.agent)
    if filters.tool:
        qs = qs.filter(tool=filters.tool)
    return qs


def _series(outcome: str, source: str) -> str:
    if source == "rule":
        return f"{outcome} by rule"
    return outcome


def over_time(filters: Filters, today: date) -> list[dict[str, Any]]:
    """One row per day (per month, for a long period) that has decisions: the day (the month's
    first) and a count per :data:`OUTCOMES` name."""
    days: dict[date, dict[str, int]] = defaultdict(lambda: dict.fromkeys(OUTCOMES, 0))
    rows = (_tallies(filters, today).values("day", "outcome", "source").annotate(n=Sum("count")).order_by())
    for row in rows:
        days[row["day"]][_series(row["outcome"], row["source"])] += row["n"]
    return [{"day": day, **counts} for day, counts in sorted(days.items())]


def _user_names(ids: set[int]) -> dict[int, str]:
    user = get_user_model()
    return {pk: str(name) for pk, name in user.objects.filter(pk__in=ids).values_list("pk", user.USERNAME_FIELD)}


def by_reviewer(filters: Filters, today: date) -> list[dict[str, Any]]:
    """Each reviewer's approvals and denials (decisions a person made under their name)."""
    rows = (_tallies(filters, today).filter(reviewer__gt=0).values("reviewer", "outcome")
            .annotate(n=Sum("count")).order_by())
    counts: dict[int, dict[str, int]] = defaultdict(lambda: {"approved": 0, "denied": 0})
    for row in rows:
        counts[row["reviewer"]][row["outcome"]] = counts[row["reviewer"]].get(row["outcome"], 0) + row["n"]
    names = _user_names(set(counts))
    out = [{"reviewer": names.get(pk, f"user #{pk} (deleted)"), "reviewer_id": pk, **c} for pk, c in counts.items()]
    return sorted(out, key=lambda r: (-(r["approved"] + r["denied"]), r["reviewer"]))


def percentile(histogram: dict[int, int], fraction: float) -> float | None:
    """The nearest-rank percentile of a wait histogram (bucket -> count), in seconds."""
    total = sum(histogram.values())
    if not total:
        return None
    rank = max(1, -(-int(fraction * total * 1000) // 1000))  # ceil(fraction * total), exactly
    seen = 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= rank:
            return bucket_value(bucket)
    return bucket_value(max(histogram))


WAIT_KEYS = ("agent", "tool", "reviewer")


def waits(filters: Filters, today: date, by: str) -> list[dict[str, Any]]:
    """Median and p90 of the time to a person's decision, by ``agent``, ``tool`` or ``reviewer``."""
    return all_waits(filters, today, (by,))[by]


def all_waits(filters: Filters, today: date, keys: tuple[str, ...] = WAIT_KEYS) -> dict[str, list[dict[str, Any]]]:
    """:func:`waits` by each of ``keys`` from one pass over the period's histogram rows (the
    dashboard draws all three: one query, not three), each bucket's column summed per key."""
    qs = _tallies(filters, today, InsightWait)
    groups: dict[str, dict[Any, dict[int, int]]] = {key: defaultdict(dict) for key in keys}
    sums = {column: Sum(column) for column in BUCKET_COLUMNS}
    for row in qs.values_list(*keys).annotate(**sums).order_by():
        values, counts = row[:len(keys)], row[len(keys):]
        for key, value in zip(keys, values, strict=True):
            histogram = groups[key][value]
            for bucket, n in enumerate(counts):
                if n:
                    histogram[bucket] = histogram.get(bucket, 0) + n
    return {key: _wait_rows(key, found) for key, found in groups.items()}


def _wait_rows(by: str, groups: dict[Any, dict[int, int]]) -> list[dict[str, Any]]:
    names = _user_names({k for k in groups if k}) if by == "reviewer" else {}
    out = []
    for key, histogram in groups.items():
        label = (names.get(key, f"user #{key} (deleted)") if key else "nobody named") if by == "reviewer" else key
        out.append({"name": label, "decisions": sum(histogram.values()),
                    "median": percentile(histogram, 0.5), "p90": percentile(histogram, 0.9)})
    return sorted(out, key=lambda r: (-r["decisions"], str(r["name"])))


def pending_ages(filters: Filters, now: datetime) -> dict[str, Any]:
    """The calls waiting now, by age: a count of each band's range of the pending calls' partial
    index (``nexo_call_pending_created``), and the oldest its first entry. One statement with a
    filtered count per band reads each entry's row on SQLite, whose planner picks another index
    of the pending calls for it (five times slower at 100,000 waiting)."""
    qs = ToolCall.objects.filter(status=CallStatus.PENDING_APPROVAL)
    if filters.agent:
        qs = qs.filter(agent=filters.agent)
    if filters.tool:
        qs = qs.filter(name=filters.tool)
    bands = []
    lower: datetime | None = None
    for label, seconds in AGE_BANDS:
        upper = now - timedelta(seconds=seconds) if seconds is not None else None
        band = qs
        if upper is not None:
            band = band.filter(created_at__gt=upper)
        if lower is not None:
            band = band.filter(created_at__lte=lower)
        bands.append({"age": label, "calls": band.count()})
        lower = upper
    oldest = qs.order_by("created_at").values_list("created_at", flat=True).first()
    return {"bands": bands, "total": sum(b["calls"] for b in bands),
            "oldest_seconds": (now - oldest).total_seconds() if oldest is not None else None}


def pattern_of(kind: str, target: str) -> str:
    """How a tally's target reads: a folder as its pattern, a command as itself."""
    if kind == "path":
        return f"{target}*"
    if kind == "none":
        return "(no target)"
    if kind == "other":
        return "(a target no rule can match)"
    return target


def rates(filters: Filters, today: date) -> list[dict[str, Any]]:
    """Approve, deny and expiry rates per tool and target pattern: the most decided first."""
    rows = (_tallies(filters, today, InsightTarget).values("tool", "kind", "target", "outcome").annotate(n=Sum("count"))
            .order_by())
    groups: dict[tuple[str, str, str], dict[str, int]] = defaultdict(lambda: {"approved": 0, "denied": 0, "expired": 0})
    for row in rows:
        groups[(row["tool"], row["kind"], row["target"])][row["outcome"]] += row["n"]
    out: list[dict[str, Any]] = []
    for (tool, kind, target), c in groups.items():
        total = c["approved"] + c["denied"] + c["expired"]
        out.append({"tool": tool, "pattern": pattern_of(kind, target), "decisions": total, **c,
                    "approve_rate": c["approved"] / total, "deny_rate": c["denied"] / total})
    return sorted(out, key=lambda r: (-r["decisions"], r["tool"], r["pattern"]))[:RATE_ROWS]


def runs_by_outcome(filters: Filters, today: date) -> list[dict[str, Any]]:
    """Runs by status, among those whose status last changed in the period (those that finished,
    failed or were cancelled in it; those waiting or running since a day in it): a count of each
    status's range of the runs' ``status, updated_at`` index, which that index alone answers. By
    their start instead, a year's count read every run's row (0.2–0.4 s at 110,000 runs on
    SQLite). The tool filter does not apply: a run is not of one tool."""
    qs = AgentRun.objects.all()
    since = filters.since(today)
    if since is not None:
        qs = qs.filter(updated_at__gte=datetime.combine(since, datetime.min.time(), tzinfo=timezone.get_current_timezone()))
    if filters.agent:
        qs = qs.filter(agent=filters.agent)
    counts = {str(s): n for s in RunStatus if (n := qs.filter(status=s).count())}
    return [{"outcome": status, "runs": counts[status]} for status in sorted(counts, key=lambda s: -counts[s])]


def choices(filters: Filters, today: date) -> dict[str, list[str]]:
    """The agents and tools the filters offer: those decided in the period (one pass over its
    tallies, the agent and tool filters left out so that another can be chosen)."""
    pairs = set(_tallies(Filters(period=filters.period), today).values_list("agent", "tool").distinct().order_by())
    return {"agents": sorted({a for a, _ in pairs if a}), "tools": sorted({t for _, t in pairs})}


def summary(filters: Filters, today: date) -> dict[str, Any]:
    total = _tallies(filters, today).aggregate(n=Sum("count"))
    return {"decisions": total["n"] or 0}
