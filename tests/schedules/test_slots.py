"""When slots fall: cron in a named timezone across the DST nights, intervals, and bad input
refused with the fix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from nexo_django.core.errors import ConfigurationError
from nexo_django.durable import schedules
from nexo_django.durable.slots import Calendar, check_cron, zone
from nexo_django.models import AgentRun
from nexo_django.schedule_models import ScheduleSlot
from tests.schedules.helpers import make


def walk(cal: Calendar, start: datetime, n: int) -> list[str]:
    found, at = [], start
    for _ in range(n):
        at = cal.following(at)
        found.append(at.astimezone(cal.tz).isoformat())
    return found


def test_berlin_spring_forward_runs_the_skipped_time_once_at_three() -> None:
    cal = Calendar.of("30 2 * * *", None, "Europe/Berlin")
    assert walk(cal, datetime(2026, 3, 27, 12, tzinfo=UTC), 3) == [
        "2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]


def test_berlin_fall_back_runs_a_fixed_time_once() -> None:
    cal = Calendar.of("30 2 * * *", None, "Europe/Berlin")
    assert walk(cal, datetime(2026, 10, 24, 12, tzinfo=UTC), 3) == [
        "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00", "2026-10-27T02:30:00+01:00"]


def test_new_york_fall_back_runs_an_hourly_schedule_every_real_hour() -> None:
    cal = Calendar.of("0 * * * *", None, "America/New_York")
    assert walk(cal, datetime(2026, 11, 1, 4, 30, tzinfo=UTC), 4) == [
        "2026-11-01T01:00:00-04:00", "2026-11-01T01:00:00-05:00", "2026-11-01T02:00:00-05:00",
        "2026-11-01T03:00:00-05:00"]


def test_new_york_spring_forward_has_no_two_oclock() -> None:
    cal = Calendar.of("0 * * * *", None, "America/New_York")
    assert walk(cal, datetime(2026, 3, 8, 5, 30, tzinfo=UTC), 3) == [
        "2026-03-08T01:00:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-08T04:00:00-04:00"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_ticking_through_both_berlin_nights_starts_one_run_a_night() -> None:
    make(cron="30 2 * * *", timezone="Europe/Berlin", now=datetime(2026, 3, 28, 12, tzinfo=UTC))
    for night in (datetime(2026, 3, 29, tzinfo=UTC), datetime(2026, 10, 25, tzinfo=UTC)):
        now = night
        while now < night + timedelta(hours=6):  # a tick every ten minutes through the night
            schedules.tick(now)
            now += timedelta(minutes=10)
        if night.month == 3:
            schedules.tick(datetime(2026, 10, 24, 12, tzinfo=UTC))  # the summer: missed, the latest ran
    started = list(ScheduleSlot.objects.filter(outcome="started").order_by("slot").values_list("slot", flat=True))
    berlin = zone("Europe/Berlin")
    local = [s.astimezone(berlin).isoformat() for s in started]
    assert local[0] == "2026-03-29T03:00:00+02:00"
    assert local[-1] == "2026-10-25T02:30:00+02:00"
    assert len(local) == 3  # spring night, the summer's latest missed slot, the autumn night: once each
    assert AgentRun.objects.count() == 3


def test_an_interval_counts_from_the_epoch() -> None:
    cal = Calendar.of("", 3600, "UTC")
    assert cal.following(datetime(2026, 6, 1, 7, 0, tzinfo=UTC)) == datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
    assert cal.following(datetime(2026, 6, 1, 7, 59, 59, tzinfo=UTC)) == datetime(2026, 6, 1, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize(("expression", "words"), [
    ("61 * * * *", "is not valid"), ("* * * *", "has 4 field(s)"), ("* * * * * *", "has 6 field(s)"),
    ("0 0 30 2 *", "never falls on a date"), ("*/0 * * * *", "is not valid"), ("", "has 0 field(s)"),
    ("0 7 * * 1-5\x00", "printable"), ("9" * 300, "at most 200"), ("; rm -rf /", "has 4 field(s)"),
])
def test_bad_cron_expressions_are_refused_with_the_fix(expression: str, words: str) -> None:
    with pytest.raises(ConfigurationError, match="cron expression") as caught:
        check_cron(expression)
    assert words in str(caught.value)


@pytest.mark.parametrize("name", ["Mars/Olympus", "", " UTC", "../../etc/passwd", "Europe/Berlin\x00", "x" * 500])
def test_bad_timezones_are_refused(name: str) -> None:
    with pytest.raises(ConfigurationError, match="timezone"):
        zone(name)


@pytest.mark.parametrize(("cron", "interval", "words"), [
    ("0 7 * * *", 60, "not both or neither"), ("", None, "not both or neither"),
    ("", 5, "from 60 to a year"), ("", 10**9, "from 60 to a year"),
])
def test_cron_or_interval_exactly_one(cron: str, interval: int | None, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        Calendar.of(cron, interval, "UTC")
