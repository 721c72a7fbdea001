"""The schedules of the chaos run (bench/chaos.py): a few schedules ticked by two racing scheduler
threads through the tick's clock seam while workers die, Redis is flushed and PostgreSQL
restarted; then the invariants of the slots.

The clock runs :data:`SPEED` times faster than the wall clock (an interval is at least 60 s), so
an interval of 120 s is a slot every two seconds of chaos. Half the schedules run on overlap, the
others skip while their previous run is active. Each slot's run is a scripted agent with no tool
(``Ticked``): its part of the verdict is about the slots, not the calls:

- ``slot_runs_doubled``: runs beyond the first that carry one (schedule, slot);
- ``slots_half_fired``: a slot recorded as started with no run, or a scheduled run whose slot row
  does not name it;
- ``schedules_not_ticking``: schedules paused, or that fired nothing (started or skipped) at a
  tick after the chaos, at a time past all their next slots.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from nexo_django import Agent
from nexo_django.testing import ScriptedModel, reply

#: virtual seconds per real second
SPEED = 60.0
INTERVAL = 120
TICKED = "bench.chaos_schedules.Ticked"


class Ticked(Agent):
    """Scripted: answers at once (each run has a fresh transcript)."""

    model = ScriptedModel([reply("(scripted) ticked.")])


class ChaosSchedules:
    def __init__(self, count: int) -> None:
        self.count = count
        self.base: datetime | None = None
        self.started = time.monotonic()
        self.after: Counter[str] = Counter()

    def clock(self) -> datetime:
        assert self.base is not None
        return self.base + timedelta(seconds=(time.monotonic() - self.started) * SPEED)

    def create(self) -> None:
        from django.utils import timezone

        from nexo_django.durable import schedules
        from nexo_django.schedule_models import Schedule

        self.base, self.started = timezone.now(), time.monotonic()
        for k in range(self.count):
            schedule = Schedule(name=f"chaos-schedule-{k}", target=TICKED, prompt=f"tick {k}", interval=INTERVAL,
                                overlap="run" if k % 2 == 0 else "skip", max_failures=0)
            schedules.prepare(schedule, self.clock())
            schedule.save()

    def tick(self) -> None:
        from nexo_django.durable import schedules

        schedules.tick(self.clock())

    def tick_after(self) -> None:
        """One tick once the chaos is over, past every schedule's next slot: each must fire."""
        from django.db.models import Max

        from nexo_django.durable import schedules
        from nexo_django.schedule_models import Schedule

        latest = Schedule.objects.aggregate(m=Max("next_slot"))["m"] or self.clock()
        for fired in schedules.tick(max(latest, self.clock()) + timedelta(seconds=1)).fired:
            self.after[fired.schedule] += fired.outcome in ("started", "skipped")

    def verdict(self) -> dict[str, Any]:
        from nexo_django.models import AgentRun
        from nexo_django.schedule_models import Schedule, ScheduleSlot

        runs = list(AgentRun.objects.filter(agent=TICKED).values_list("pk", "status", "options"))
        keys = Counter((str((options or {}).get("_schedule", {}).get("schedule")),
                        str((options or {}).get("_schedule", {}).get("slot"))) for _, _, options in runs)
        slots = ScheduleSlot.objects.filter(schedule__target=TICKED)
        started = {(str(s), slot.isoformat()): run for s, slot, run in
                   slots.filter(outcome="started").values_list("schedule_id", "slot", "run_id")}
        half = sum(1 for run in started.values() if run is None)
        half += sum(1 for pk, _, options in runs if started.get(
            (str(options["_schedule"]["schedule"]), options["_schedule"]["slot"])) != pk)
        schedules = list(Schedule.objects.filter(target=TICKED).values_list("name", "enabled"))
        statuses = Counter(status for _, status, _ in runs)
        return {
            "schedules": len(schedules), "schedule_slots": slots.count(),
            "schedule_slots_skipped": slots.filter(outcome="skipped").count(),
            "schedule_runs": len(runs), "schedule_runs_done": statuses["done"],
            "slot_runs_doubled": sum(n - 1 for n in keys.values() if n > 1),
            "slots_half_fired": half,
            "schedules_not_ticking": sum(1 for name, enabled in schedules if not enabled or not self.after[name]),
        }
