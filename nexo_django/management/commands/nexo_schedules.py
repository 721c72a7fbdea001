from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from nexo_django.durable import schedules
from nexo_django.schedule_models import Schedule, ScheduleSlot


class Command(BaseCommand):
    help = ("List the schedules, or fire the slots that have come (`tick`: what rq's cron does every "
            'NEXO["SCHEDULE_TICK"] seconds under `manage.py rqcron nexo_django.durable.schedule_cron`).')

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "tick"], help="list: every schedule; tick: fire what is due, once.")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action == "tick":
            report = schedules.tick()
            for fired in report.fired:
                when = fired.slot.isoformat() if fired.slot else "-"
                line = f"{fired.schedule}: {fired.outcome} {when}"
                self.stdout.write(line + (f" run {fired.run}" if fired.run else "") + (f" ({fired.reason})" if fired.reason else ""))
            self.stdout.write(f"tick: {report}")
            return
        found = False
        for schedule in Schedule.objects.order_by("name"):
            found = True
            last = ScheduleSlot.objects.filter(schedule=schedule).order_by("-slot").first()
            state = "enabled" if schedule.enabled else f"paused ({schedule.paused_reason})"
            when = schedule.cron or f"every {schedule.interval} s"
            following = schedule.next_slot.isoformat() if schedule.next_slot else "not armed yet"
            latest = f"{last.slot.isoformat()} {last.outcome}" if last else "none"
            self.stdout.write(f"{schedule.name}\t{schedule.target}\t{when} {schedule.timezone}\t{state}\t"
                              f"next {following}\tlast {latest}")
        if not found:
            self.stdout.write("no schedules (add one in the admin: Nexo django > Schedules)")
