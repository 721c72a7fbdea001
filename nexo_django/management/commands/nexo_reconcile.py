from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, close_old_connections

from nexo_django.durable.recovery import reconcile


class Command(BaseCommand):
    help = "Bring back runs whose worker died or whose job was lost. Run it on a schedule."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--every", type=float, default=0, help="Repeat every N seconds (0: once).")
        parser.add_argument("--times", type=int, default=0, help="With --every: stop after N rounds (0: forever).")
        parser.add_argument(
            "--full", action="store_true",
            help="Also look at every suspended run, not only those with a call that changed in the last hour "
            "(after rows were edited by hand).",
        )

    def handle(self, *args: Any, every: float, times: int, full: bool, **options: Any) -> None:
        rounds = 0
        while True:
            try:
                # Its warnings are written below, once: not logged by reconcile() as well.
                report = reconcile(full=full, log_warnings=False)
            except DatabaseError as exc:
                if not every:
                    raise
                # A long-running reconciler outlives a database restart: try again next round.
                self.stderr.write(f"reconcile: database error, next round in {every:g}s: {exc}")
                close_old_connections()
            else:
                self.stdout.write(str(report))
                for warning in report.warnings:
                    self.stderr.write(f"warning: {warning}")
            rounds += 1
            if not every or (times and rounds >= times):
                return
            time.sleep(every)
