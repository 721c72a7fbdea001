from __future__ import annotations

import faulthandler
import gc
import signal
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from redis.exceptions import ConnectionError as RedisConnectionError

from nexo_django.durable import dispatch
from nexo_django.durable.worker import DEFAULT_CONCURRENCY, DEFAULT_SHUTDOWN_GRACE, ConcurrentWorker


class Command(BaseCommand):
    help = (
        "An rq worker that carries up to --concurrency runs at once, in threads (a run waiting on its "
        "model holds no database connection). The queues default to NEXO['QUEUE']."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queues", nargs="*", help="Queues to take jobs from (default: NEXO['QUEUE']).")
        parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                            help=f"Runs in flight at once (default {DEFAULT_CONCURRENCY}).")
        parser.add_argument("--shutdown-grace", type=float, default=DEFAULT_SHUTDOWN_GRACE,
                            help="On SIGTERM, seconds the runs in flight have to reach their next commit "
                            f"(default {DEFAULT_SHUTDOWN_GRACE:g}); the rest are left to the reconciler.")
        parser.add_argument("--name", default=None, help="The worker's name in rq (default: random).")
        parser.add_argument("--burst", action="store_true", help="Quit once the queues are empty.")
        parser.add_argument("--with-scheduler", action="store_true", help="Run rq's scheduler too.")
        parser.add_argument("--worker-ttl", type=int, default=420, help="rq's worker TTL, in seconds.")

    def handle(self, *args: Any, **options: Any) -> None:
        from rq.logutils import setup_loghandlers

        if options["concurrency"] < 1:
            raise CommandError(f"--concurrency must be at least 1, not {options['concurrency']}")
        if options["shutdown_grace"] < 0:
            raise CommandError(f"--shutdown-grace must be 0 or more, not {options['shutdown_grace']:g}")
        queues = options["queues"] or [dispatch.queue_name()]
        for name in queues:
            if dispatch.is_inline(name):
                raise CommandError(f"queue {name!r} is inline (\"ASYNC\": False): its jobs run at commit, "
                                   "in the process that sends them; a worker has nothing to take from it")
        verbosity = options["verbosity"]
        level = "DEBUG" if verbosity >= 2 else "WARNING" if verbosity == 0 else "INFO"
        setup_loghandlers(level)
        worker = dispatch.make_worker(
            queues, ConcurrentWorker, name=options["name"], worker_ttl=options["worker_ttl"],
            concurrency=options["concurrency"], shutdown_grace=options["shutdown_grace"],
        )
        for conn in connections.all(initialized_only=True):
            conn.close()  # each thread opens its own
        # What is alive now (Django, the apps, the worker) lives as long as the process: out of
        # the collector's sight, its full collections no longer walk it (a few % of a run's CPU).
        gc.collect()
        gc.freeze()
        # `kill -USR2 <pid>` writes every thread's stack to stderr (the worker's log) and the
        # worker goes on: what a run, or the worker itself, is waiting on (rq uses no SIGUSR2).
        # faulthandler writes at once, even with the GIL held, but 100 threads at most, newest
        # first: past that the main thread (taking jobs, rq's suspension loop) is cut off, so it is
        # written again by a Python handler, which runs as soon as the main thread runs Python.
        signal.signal(signal.SIGUSR2, _main_thread_stack)
        faulthandler.register(signal.SIGUSR2, all_threads=True, chain=True)
        try:
            worker.work(burst=options["burst"], with_scheduler=options["with_scheduler"], logging_level=level)
        except RedisConnectionError as exc:
            self.stderr.write(str(exc))
            sys.exit(1)


def _main_thread_stack(signum: int, frame: Any) -> None:
    """The main thread's stack on stderr, after faulthandler's dump of every thread (which stops at
    100 threads, before the main one when hundreds of runs are in flight)."""
    import traceback

    stack = "".join(traceback.format_stack(frame))
    sys.stderr.write(f"Main thread, as Python sees it (most recent call last):\n{stack}")  # one write
    sys.stderr.flush()

