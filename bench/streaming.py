"""Benchmark: runs that stream their answer cost a concurrent worker about what runs that do not
(issue 33, point 1).

The same loopback OpenAI-compatible server as ``bench.concurrency`` (a tool call, then the final
answer, ``--delay`` seconds each), once answering the final turn at once and once streaming it (20
pieces spread over the same ``--delay``, so the model's time is the same); each time ``--runs``
runs (``bench.agents.Echoer``) through one ``manage.py nexo_worker --concurrency N`` on PostgreSQL
with Django's connection pool of ``--pool``. Streaming, every run sends its text to its readers
(the notifier: a connection of its own per process, outside the pool). Printed: both sides' figures
(as ``bench.concurrency`` prints them) and the ratio of their times (target: at most 1.2).

    python -m bench.streaming [--runs 200] [--pool 10] [--delay 1.0]
"""

from __future__ import annotations

import argparse
import json
import os

from bench.common import figure, note, postgres_url, setup_django
from bench.concurrency import SlowServer, nexo_concurrent, nexo_settings, print_side


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--pool", type=int, default=10)
    parser.add_argument("--delay", type=float, default=1.0)
    args = parser.parse_args()

    from tests.servers import RedisServer

    server = SlowServer(args.delay).start()
    os.environ["BENCH_NEXO"] = json.dumps(nexo_settings(server))
    results = {}
    with RedisServer() as redis_server:
        setup_django(postgres_url(), redis_url=redis_server.url)
        for side, stream in (("plain", False), ("streaming", True)):
            server.stream = stream
            note(f"nexo: one concurrent worker, {args.runs} runs, pool of {args.pool}, answers {side}")
            result = results[side] = nexo_concurrent(server, redis_server.url, args.runs, args.pool)
            print_side(f"nexo_concurrent_worker_{side}", result, 1, runs_running_peak=result["running"],
                       pool=args.pool, pg_connections=result["db_connections"])  # fmt: skip
    figure("streaming_vs_plain", runs=args.runs, pool=args.pool,
           seconds_ratio=results["streaming"]["seconds"] / results["plain"]["seconds"])  # fmt: skip


if __name__ == "__main__":
    main()
