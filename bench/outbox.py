"""Benchmark: the outbox's delivery of 1,000 notices to a webhook receiver on loopback.

Three ways the notices leave, each timed from the commit that wrote them to the receiver's
arrival of each request (delay: median and p95) and as a whole (throughput):

- ``job``: 1,000 notices written in one commit, delivered by the job sent at that commit
  (``outbox.deliver(keys)``, what a worker runs; here inline, one process);
- ``reconciler``: the same, left to the reconciler (``outbox.deliver_due`` rounds of 500), as when
  Redis or the receiver was down;
- ``one per commit``: 1,000 commits of one notice each (a decision each), each delivered at its
  commit on an inline queue.

Beside them, the floor: the same 1,000 signed POSTs sent by bare httpx to the same receiver, one
new connection each (what the channel does: a guarded client per notice), and over one kept-alive
connection.

    python -m bench.outbox [--db sqlite|postgres] [--notices 1000]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from typing import Any

from bench.common import DATABASES, database_url, db_label, figure, median, note, p95, setup_django

SECRET = "bench-secret"


class Receiver:
    """A webhook receiver that verifies each signature and notes when each key arrived."""

    def __init__(self) -> None:
        from tests.channel_servers import WebhookReceiver

        self.server = WebhookReceiver(SECRET)
        self.arrived: dict[str, float] = {}
        inner = self.server.handle
        lock = threading.Lock()

        def handle(handler: Any, body: bytes) -> Any:
            answer = inner(handler, body)
            with lock:
                self.arrived.setdefault(handler.headers.get("Idempotency-Key", ""), time.perf_counter())
            return answer

        self.server.handle = handle  # type: ignore[method-assign]
        self.server.start()


def make_runs(count: int) -> list[Any]:
    from django.utils import timezone

    from nexo_django.models import AgentRun

    now = timezone.now()
    runs = [AgentRun(id=uuid.uuid4(), agent="bench.agents.Noop", prompt="p", status="done", finished_at=now)
            for _ in range(count)]
    AgentRun.objects.bulk_create(runs, batch_size=500)
    return runs


def write(runs: list[Any], tag: str) -> tuple[list[str], float]:
    """One commit of a ``run.done`` notice per run; the keys and the commit's time."""
    from django.db import transaction
    from django.utils import timezone

    from nexo_django.durable import outbox, sql
    from nexo_django.models import Notice

    now = timezone.now()
    rows = [r for run in runs for r in outbox.rows("run.done", run.pk, [], now, subject=tag)]
    with transaction.atomic():
        sql.insert(Notice, outbox.COLUMNS, rows)
    return [r[2] for r in rows], time.perf_counter()


def report(name: str, receiver: Receiver, keys: list[str], committed: dict[str, float], started: float) -> None:
    missing = [k for k in keys if k not in receiver.arrived]
    assert not missing, f"{name}: {len(missing)} notices never arrived"
    delays = [(receiver.arrived[k] - committed[k]) * 1000 for k in keys]
    total = max(receiver.arrived[k] for k in keys) - started
    figure(f"outbox.{name}", notices=len(keys), per_s=len(keys) / total, delay_median_ms=median(delays),
           delay_p95_ms=p95(delays), total_s=total, db=db_label())


def floor(receiver: Receiver, count: int, keep_alive: bool) -> None:
    import httpx

    from nexo_django.channels.signing import sign

    body = json.dumps({"type": "run.done", "id": "floor"}).encode()
    start = time.perf_counter()
    client = httpx.Client(trust_env=False) if keep_alive else None
    for i in range(count):
        headers = {"Content-Type": "application/json", "Idempotency-Key": f"floor-{keep_alive}-{i}",
                   "X-Nexo-Signature": sign(SECRET, body)}
        if client is not None:
            client.post(receiver.server.url, content=body, headers=headers)
        else:
            with httpx.Client(trust_env=False) as one:
                one.post(receiver.server.url, content=body, headers=headers)
    total = time.perf_counter() - start
    if client is not None:
        client.close()
    figure("outbox.floor_keepalive" if keep_alive else "outbox.floor_new_connection", notices=count,
           per_s=count / total, per_notice_ms=total / count * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", default="sqlite", choices=DATABASES)
    parser.add_argument("--notices", type=int, default=1000)
    args = parser.parse_args()
    setup_django(database_url(args.db))
    from django.test import override_settings

    from nexo_django.durable import outbox

    receiver = Receiver()
    channels = {"bench": {"BACKEND": "webhook", "URL": receiver.server.url, "SECRET": SECRET,
                          "ALLOW_PRIVATE": ["127.0.0.1"], "EVENTS": ["run.done"]}}
    with override_settings(NEXO={"CHANNELS": channels}):
        runs = make_runs(args.notices)
        note(f"{args.notices} runs made; {db_label()}")

        keys, at = write(runs, "job")
        start = time.perf_counter()
        outbox.deliver(keys)
        report("job", receiver, keys, dict.fromkeys(keys, at), start)

        keys, at = write(runs, "reconciler")
        start = time.perf_counter()
        while outbox.deliver_due():
            pass
        report("reconciler", receiver, keys, dict.fromkeys(keys, at), start)

        committed: dict[str, float] = {}
        keys = []
        start = time.perf_counter()
        for i, run in enumerate(runs):
            one, at = write([run], f"single{i}")
            outbox.deliver(one)  # what the commit's job does, at once on an inline queue
            committed[one[0]] = at
            keys += one
        report("one_per_commit", receiver, keys, committed, start)

    floor(receiver, args.notices, keep_alive=False)
    floor(receiver, args.notices, keep_alive=True)
    receiver.server.stop()


if __name__ == "__main__":
    main()
