"""When a schedule's slots fall: a cron expression read in a named timezone (croniter, which rq
itself depends on), or an interval counted from the Unix epoch. Each check refuses bad input with
one sentence naming the fix (the admin's form shows it).

Daylight saving time: a wall-clock time the spring change skips runs once, at the first instant
after it (``30 2 * * *`` on the night Europe/Berlin goes from 02:00 to 03:00 runs at 03:00); a
wall-clock time the autumn change repeats runs once, the first time, for an expression with a
fixed hour (``30 2 * * *``), and in each of the two hours for one whose hour field is a wildcard
(``0 * * * *`` runs every real hour), as cronie does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from ..core.errors import ConfigurationError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: the aliases croniter reads, and whether their hour is fixed
ALIASES = {"@yearly": True, "@annually": True, "@monthly": True, "@weekly": True, "@daily": True,
           "@midnight": True, "@hourly": False}
#: slots walked at most to find the missed ones; past that, the latest is found directly
WALK = 1000


def zone(name: str) -> ZoneInfo:
    if not isinstance(name, str) or not name or name != name.strip():
        raise ConfigurationError(f"timezone {name!r}: give an IANA name such as 'UTC' or 'Europe/Berlin'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ConfigurationError(
            f"timezone {name!r} is not a known IANA name ({type(exc).__name__}); give one such as 'UTC', "
            "'Europe/Berlin' or 'America/New_York'") from exc


def check_cron(expression: str) -> str:
    """The expression, stripped, if croniter reads it as five fields (minute hour day month weekday)
    or an alias such as ``@daily``; ``ConfigurationError`` otherwise."""
    text = (expression or "").strip()
    if "\x00" in text or len(text) > 200:
        raise ConfigurationError("cron expression: at most 200 printable characters, e.g. '0 7 * * 1-5'")
    fields = text.split()
    if text.lower() in ALIASES:
        return text.lower()
    if len(fields) != 5:
        raise ConfigurationError(
            f"cron expression {text!r} has {len(fields)} field(s); give five (minute hour day month weekday), "
            "e.g. '0 7 * * 1-5' for 07:00 on weekdays, or @hourly/@daily/@weekly/@monthly")
    try:
        valid = croniter.is_valid(text)
    except Exception:  # croniter raises its own errors on some inputs instead of answering False
        valid = False
    if not valid:
        raise ConfigurationError(
            f"cron expression {text!r} is not valid: each field takes numbers in its range (minute 0-59, hour 0-23, "
            "day 1-31, month 1-12, weekday 0-6), '*', ranges 'a-b', lists 'a,b' and steps '*/n'")
    try:
        croniter(text, EPOCH).get_next(datetime)
    except Exception as exc:  # e.g. '0 0 30 2 *': croniter searches, then gives up
        raise ConfigurationError(f"cron expression {text!r} never falls on a date; check its day and month") from exc
    return text


def check_interval(seconds: Any) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 60 <= seconds <= 366 * 86400:
        raise ConfigurationError(f"interval {seconds!r}: give a whole number of seconds from 60 to a year")
    return seconds


@dataclass(frozen=True)
class Calendar:
    """A schedule's slots: ``cron`` in ``tz``, or every ``interval`` seconds since the epoch."""

    cron: str
    interval: int | None
    tz: ZoneInfo

    @classmethod
    def of(cls, cron: str, interval: int | None, timezone: str) -> Calendar:
        if bool(cron and cron.strip()) == bool(interval):
            raise ConfigurationError("give either a cron expression or an interval in seconds, not both or neither")
        if interval:
            return cls("", check_interval(interval), zone(timezone))
        return cls(check_cron(cron), None, zone(timezone))

    @property
    def fixed_hour(self) -> bool:
        if self.cron in ALIASES:
            return ALIASES[self.cron]
        return "*" not in self.cron.split()[1]

    def following(self, after: datetime) -> datetime:
        """The first slot strictly after ``after`` (an aware datetime), in UTC."""
        if self.interval:
            steps = (after - EPOCH) // timedelta(seconds=self.interval) + 1
            return EPOCH + steps * timedelta(seconds=self.interval)
        local = after.astimezone(self.tz)
        for _ in range(4):  # a repeated wall-clock time is skipped at most once in a row
            found: datetime = _iterator(self.cron, local).get_next(datetime)
            if not (self.fixed_hour and repeated(found, self.tz)):
                return found.astimezone(UTC)
            local = found
        return found.astimezone(UTC)

    def due(self, first: datetime, now: datetime) -> tuple[list[datetime], int, datetime]:
        """The slots from ``first`` up to ``now`` (ascending; at most :data:`WALK`, the last of them
        the latest due), how many there are in all, and the first slot after ``now``."""
        found: list[datetime] = []
        slot = first
        while slot <= now and len(found) < WALK:
            found.append(slot)
            slot = self.following(slot)
        if slot > now:
            return found, len(found), slot
        latest = self.latest(now)
        count = WALK + 1 + self._between(slot, latest)
        return [*found, latest], count, self.following(now)

    def latest(self, now: datetime) -> datetime:
        """The last slot at or before ``now``."""
        if self.interval:
            return EPOCH + ((now - EPOCH) // timedelta(seconds=self.interval)) * timedelta(seconds=self.interval)
        found: datetime = croniter(self.cron, now.astimezone(self.tz)).get_prev(datetime)
        if self.fixed_hour and repeated(found, self.tz):
            found = croniter(self.cron, found).get_prev(datetime)
        return found.astimezone(UTC)

    def _between(self, first: datetime, last: datetime) -> int:
        if self.interval:
            return max(0, int((last - first) // timedelta(seconds=self.interval)) - 1)
        return 0  # not counted: more than WALK slots were missed, the exact number does not matter


_local = threading.local()


def _iterator(expression: str, start: datetime) -> croniter:
    """croniter's iterator of ``expression`` from ``start``: one per expression and thread, moved
    with ``set_current`` (building one parses the expression again, most of the cost of a slot)."""
    found: dict[str, croniter] | None = getattr(_local, "iterators", None)
    if found is None:
        found = _local.iterators = {}
    iterator = found.get(expression)
    if iterator is None:
        if len(found) > 1000:
            found.clear()
        iterator = found[expression] = croniter(expression, start)
    else:
        iterator.set_current(start, force=True)
    return iterator


def repeated(moment: datetime, tz: ZoneInfo) -> bool:
    """Whether ``moment`` is the second occurrence of a wall-clock time the autumn change repeats."""
    naive = moment.astimezone(tz).replace(tzinfo=None)
    first, second = naive.replace(tzinfo=tz, fold=0), naive.replace(tzinfo=tz, fold=1)
    return first.utcoffset() != second.utcoffset() and moment.utcoffset() == second.utcoffset()
