"""One scheduler process for the race tests: ``python -m tests.schedules.race_tick <now> <go-file>``
waits for ``go-file`` to exist, then ticks at ``now`` (ISO) and prints the outcomes as JSON."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path

import django


def main() -> None:
    django.setup()
    from nexo_django.durable import schedules

    now, go = datetime.fromisoformat(sys.argv[1]), Path(sys.argv[2])
    while not go.exists():
        time.sleep(0.005)
    report = schedules.tick(now)
    print(json.dumps([[f.schedule, f.outcome] for f in report.fired]))


if __name__ == "__main__":
    main()
