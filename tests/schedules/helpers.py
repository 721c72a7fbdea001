"""Helpers of the schedule tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from nexo_django.durable import schedules
from nexo_django.schedule_models import Schedule

T0 = datetime(2026, 6, 1, 6, 59, 30, tzinfo=UTC)
#: the first slot of a schedule made by :func:`make` with its defaults
SLOT_OF = datetime(2026, 6, 1, 7, 0, tzinfo=UTC)


def make(now: datetime = T0, **fields: Any) -> Schedule:
    """A schedule checked and armed as the admin's form does, from ``now``."""
    values: dict[str, Any] = {"name": "nightly", "target": "tests.schedule_agents.Nightly", "prompt": "Triage.",
                              "cron": "0 7 * * *", "timezone": "UTC"}
    values.update(fields)
    schedule = Schedule(**values)
    schedules.prepare(schedule, now)
    schedule.save()
    return schedule
