"""Benchmark: the scheduler's CPU per fired run, and its CPU while idle, with 1,000 schedules.

1,000 hourly schedules (``Schedule`` rows, each armed), on a real Redis queue with no worker: what
is measured is the scheduler's side, up to the job in Redis, not the runs. ``idle_tick``: a
``tick()`` that finds nothing due (its one indexed read), CPU per tick; ``fired``: ``--fire``
schedules made due, then one ``tick()`` starts their runs (each: the compare-and-set, the slot's
row, ``run_later``'s rows, the job sent at commit), CPU per run. Beside them, measured in the same
process: ``plain_rq_enqueue``, rq's own ``Queue.enqueue_call`` of a job, and ``run_later``, the same
agent's run started directly (what a fired slot does besides its scheduling). CPU is the
process's (``time.process_time``), so waits on the database and Redis are not counted.

    python -m bench.schedules --db sqlite|postgres [--schedules 1000] [--fire 200] [--idle 200]
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

from bench.common import DATABASES, database_url, db_label, figure, note, setup_django


def cpu_ms(fn: object, count: int) -> float:
    start = time.process_time()
    fn()  # type: ignore[operator]
    return (time.process_time() - start) * 1000 / max(count, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", choices=DATABASES, default="sqlite")
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--fire", type=int, default=200)
    parser.add_argument("--idle", type=int, default=200)
    args = parser.parse_args()

    from tests.servers import RedisServer

    with RedisServer() as redis_server:
        setup_django(database_url(args.db), redis_url=redis_server.url)
        from django.db import connection
        from django.test.utils import CaptureQueriesContext
        from django.utils import timezone

        from bench.agents import Nightly
        from nexo_django.durable import dispatch, schedules
        from nexo_django.models import AgentRun
        from nexo_django.schedule_models import Schedule

        now = timezone.now()
        nxt = schedules.Calendar.of("0 * * * *", None, "UTC").following(now + timedelta(hours=2))
        Schedule.objects.bulk_create(
            Schedule(name=f"bench {i}", target="bench.agents.Nightly", prompt="Triage.", cron="0 * * * *",
                     next_slot=nxt, kind="agent") for i in range(args.schedules))
        note(f"{args.schedules} schedules, next slot {nxt.isoformat()}")

        def idle() -> None:
            for _ in range(args.idle):
                if schedules.tick(now).fired:
                    raise RuntimeError("an idle tick fired something")

        idle()  # warm-up
        idle_cpu = cpu_ms(idle, args.idle)
        with CaptureQueriesContext(connection) as captured:
            schedules.tick(now)
        figure("schedules_idle_tick", db=db_label(), schedules=args.schedules, cpu_ms_per_tick=idle_cpu,
               queries=len(captured.captured_queries))

        queue = dispatch.get_queue()

        def plain() -> None:
            for i in range(args.fire):
                queue.enqueue_call(func="bench.jobs.noop", job_id=f"bench-noop-{i}", result_ttl=600)

        def direct() -> None:
            for _ in range(args.fire):
                Nightly.run_later("Triage.")

        slot = nxt - timedelta(hours=3)
        due = list(Schedule.objects.order_by("pk").values_list("pk", flat=True)[:args.fire])

        def fire() -> None:
            fired = schedules.tick(slot + timedelta(seconds=1))
            if len(fired.started) != len(due):
                raise RuntimeError(f"{len(fired.started)} runs started, {len(due)} expected: {fired}")

        Nightly.run_later("warm-up")
        Schedule.objects.filter(pk__in=due).update(next_slot=slot)
        before = AgentRun.objects.count()
        fired_cpu = cpu_ms(fire, len(due))
        assert AgentRun.objects.count() - before == len(due)
        plain_cpu = cpu_ms(plain, args.fire)
        direct_cpu = cpu_ms(direct, args.fire)
        figure("schedules_fired", db=db_label(), schedules=args.schedules, runs=len(due),
               cpu_ms_per_fired_run=fired_cpu, peer_run_later_cpu_ms=direct_cpu, peer_plain_rq_enqueue_cpu_ms=plain_cpu)
        # Idle again after the slot: the same single read.
        figure("schedules_idle_after", db=db_label(), cpu_ms_per_tick=cpu_ms(idle, args.idle))


if __name__ == "__main__":
    main()
