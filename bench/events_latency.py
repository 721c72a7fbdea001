"""Benchmark: a run's events from the worker's commit to the run page (issue 25, point 5).

Three processes, as deployed: this one (the approver and the page's client), one ``rqworker``
(the forking worker ``manage.py rqworker`` runs) that drives the runs, and one uvicorn serving
the run pages under ASGI; PostgreSQL (fsync on) and Redis between them.

Each sample: a suspended ``VirtualScribe`` run (a scripted gated write, then an answer). The
page's client opens the run's event stream (``runs/<id>/stream/``, Server-Sent Events) and, beside
it, the page's fallback: a poller of ``runs/<id>/events/?after=`` every second (what the run page
did before, at its fastest), both from the same last event. Then ``approve()``: the worker resumes
the run and commits its events (tool call, result, model request, reply, done) in several commits.
An event's latency is the wall time the client got it minus the event's ``created_at`` (taken just
before the worker's commit, so the commit itself, fsync included, is in the figure). Only the
worker's events count (the ``decision`` is this process's). Same machine, one clock.

On PostgreSQL the stream is woken by the trigger's NOTIFY; ``--db sqlite-wal-full`` measures the
other wake-up, the serving process's poll of the events' primary key (every 0.25 s).

    python -m bench.events_latency [--samples N] [--poll-interval S] [--db postgres|sqlite-wal-full]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from datetime import datetime
from typing import Any

from bench.common import (
    REPO_ROOT,
    database_url,
    db_label,
    figure,
    median,
    note,
    p95,
    scratch,
    setup_django,
)
from bench.through_queue import start_workers, wait_for, worker_env

WAIT = 30.0


class Stream(threading.Thread):
    """The page's event stream: each event's id and the wall time it arrived, until ``end``."""

    def __init__(self, url: str, session: str) -> None:
        super().__init__(daemon=True)
        self.url, self.session = url, session
        self.opened = threading.Event()
        self.got: dict[int, tuple[str, float, float]] = {}  # id -> (type, created_at, received)
        self.error: BaseException | None = None

    def run(self) -> None:
        import httpx

        try:
            with httpx.Client(cookies={"sessionid": self.session}, timeout=httpx.Timeout(WAIT)) as client, \
                    client.stream("GET", self.url) as response:
                fields: dict[str, str] = {}
                for line in response.iter_lines():
                    if line.startswith("retry:"):
                        self.opened.set()  # subscribed: the server listens before it sends this
                    if line:
                        name, _, value = line.partition(":")
                        fields[name] = value.removeprefix(" ")
                        continue
                    received = time.time()
                    if fields.get("event") == "end":
                        return
                    if "id" in fields:
                        data = json.loads(fields["data"])
                        self.got[int(fields["id"])] = (data["type"], _seconds(data["at"]), received)
                    fields = {}
        except BaseException as exc:  # noqa: BLE001 - reported by the sample
            self.error = exc
        finally:
            self.opened.set()


class Poller(threading.Thread):
    """The page's fallback: ``events/?after=`` every ``interval`` seconds until ``done``."""

    def __init__(self, url: str, session: str, after: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.url, self.session, self.after, self.interval = url, session, after, interval
        self.got: dict[int, tuple[str, float, float]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        import httpx

        # A page opened at any moment: its first look comes at a random phase of the interval.
        self.stop.wait(random.uniform(0, self.interval))
        with httpx.Client(cookies={"sessionid": self.session}, timeout=httpx.Timeout(WAIT)) as client:
            while not self.stop.is_set():
                page = client.get(self.url, params={"after": self.after}).json()
                received = time.time()
                for event in page["events"]:
                    self.got[event["id"]] = (event["type"], _seconds(event["at"]), received)
                    self.after = event["id"]
                if any(t == "done" for t, _, _ in self.got.values()):
                    return
                self.stop.wait(self.interval)


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def start_uvicorn(port: int) -> subprocess.Popen[bytes]:
    env = {**worker_env(), "DJANGO_SETTINGS_MODULE": "bench.settings"}
    log = (scratch() / "uvicorn.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning", "--lifespan", "off"],
        cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )


def session_for(username: str) -> tuple[str, Any]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_user(username)
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value, user


def measure(base: str, samples: int, interval: float) -> None:
    from bench.agents import VirtualScribe
    from nexo_django.models import AgentRun, RunEvent

    session, user = session_for("page")
    runs = [VirtualScribe.run_later("Write 'hi' to notes.txt", user=user) for _ in range(samples + 2)]
    ids = [r.pk for r in runs]
    suspended = AgentRun.objects.filter(pk__in=ids, status="suspended")
    wait_for(lambda: suspended.count() == len(ids), f"{len(ids)} runs to suspend")
    stream_ms: list[float] = []
    poll_ms: list[float] = []
    for index, run in enumerate(runs):
        run.refresh_from_db()
        after = RunEvent.objects.filter(run=run).order_by("-id").values_list("id", flat=True).first() or 0
        stream = Stream(f"{base}/runs/{run.pk}/stream/?after={after}", session)
        stream.start()
        if not stream.opened.wait(WAIT) or stream.error is not None:
            raise RuntimeError(f"the event stream did not open: {stream.error}")
        poller = Poller(f"{base}/runs/{run.pk}/events/", session, after, interval)
        poller.start()
        run.pending_calls().get().approve()
        stream.join(WAIT)
        poller.join(WAIT + interval)
        poller.stop.set()
        if stream.is_alive() or stream.error is not None:
            raise RuntimeError(f"run {run.pk}: the stream did not end ({stream.error}); got {stream.got}")
        worker = {i: v for i, v in stream.got.items() if v[0] != "decision"}
        if not any(t == "done" for t, _, _ in worker.values()) or set(poller.got) != set(stream.got):
            raise RuntimeError(f"run {run.pk}: the stream got {sorted(stream.got)}, the poller {sorted(poller.got)}")
        if index < 2:
            continue  # warm-up: the worker's and the server's first imports and connections
        stream_ms += [(received - at) * 1e3 for _, at, received in worker.values()]
        poll_ms += [(poller.got[i][2] - at) * 1e3 for i, (_, at, _) in worker.items()]
    figure(
        "events_latency", db=db_label(), samples=samples, events=len(stream_ms),
        sse_median_ms=median(stream_ms), sse_p95_ms=p95(stream_ms),
        poll_every_s=interval, poll_median_ms=median(poll_ms), poll_p95_ms=p95(poll_ms),
        ratio=median(poll_ms) / median(stream_ms),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--db", choices=["postgres", "sqlite-wal-full"], default="postgres",
                        help="postgres: the stream is woken by NOTIFY; sqlite-wal-full: by the server's poll")
    args = parser.parse_args()

    import httpx

    from tests.servers import RedisServer, free_port

    with RedisServer() as redis_server:
        setup_django(database_url(args.db), redis_url=redis_server.url)
        port = free_port()
        server = start_uvicorn(port)
        workers = start_workers(redis_server.url, 1, "rq.worker.Worker", scratch())
        base = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _answers(httpx, base), "uvicorn to answer", timeout=WAIT)
            measure(base, args.samples, args.poll_interval)
        except BaseException:
            note(workers.logs())
            note((scratch() / "uvicorn.log").read_text())
            raise
        finally:
            workers.stop()
            server.terminate()
            server.wait(timeout=10)


def _answers(httpx: Any, base: str) -> bool:
    try:
        httpx.get(f"{base}/admin/login/", timeout=1.0)
    except httpx.TransportError:
        return False
    return True


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
