from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from nexo_django.recovery import reconcile


class Command(BaseCommand):
    help = "Bring back runs whose worker died or whose job was lost. Run it on a schedule."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--every", type=float, default=0, help="Repeat every N seconds (0: once).")
        parser.add_argument("--times", type=int, default=0, help="With --every: stop after N rounds (0: forever).")

    def handle(self, *args: Any, every: float, times: int, **options: Any) -> None:
        rounds = 0
        while True:
            report = reconcile()
            self.stdout.write(str(report))
            for warning in report.warnings:
                self.stderr.write(f"warning: {warning}")
            rounds += 1
            if not every or (times and rounds >= times):
                return
            time.sleep(every)
