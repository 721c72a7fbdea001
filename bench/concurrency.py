"""Benchmark: runs in flight per worker process, against a slow model (issue 26).

A loopback OpenAI-compatible server (Chat Completions) answers each request after ``--delay``
seconds (1.0): a tool call (``echo``) first, then a final answer. Against it, measured in one run
on this machine:

- **nexo, concurrent worker**: one ``manage.py nexo_worker --concurrency N`` process, PostgreSQL
  with Django's connection pool (``OPTIONS["pool"]``, ``--pool`` connections at most), real Redis;
  ``--runs`` runs (``bench.agents.Echoer``) sent with ``run_later`` while the worker is suspended
  (``rq suspend``: it waits in rq's suspension loop, having taken a last warm-up run), timed once
  resumed (the sending is shown apart: ``send_s``);
- **the asyncio peer**: the OpenAI Agents SDK's ``Runner.run`` for ``--runs`` runs under
  ``asyncio.gather`` in one process (a child of this one), the same agent shape and server;
- **nexo, today's SimpleWorker**: ``--simple-workers`` ``rqworker`` processes, one run in flight
  each, ``--simple-runs`` runs.

Printed: runs in flight at once (the server's peak of open requests; for nexo also the peak of
runs ``running`` in the database: claimed and not closed, waiting on the model or a CPU), the worker processes' peak
PSS (``/proc/PID/smaps_rollup``, sampled every 0.1 s), runs in flight per GiB of it, runs/s to the last run done
from the start (the gather; for nexo, its first model request, a few milliseconds after the
worker took its first job: rq's suspension loop looks for the resumption once a second), and, for nexo, PostgreSQL connections (peak in
``pg_stat_activity``) beside the pool's size. Each side first runs a few untimed warm-up runs.

    python -m bench.concurrency [--runs 500] [--pool 10] [--delay 1.0] [--simple-workers 8] [--simple-runs 48]
                                [--db postgres|postgres-prepared]

``--db postgres-prepared`` runs nexo's side with prepared statements (Django's
``server_side_binding`` and psycopg's ``prepare_threshold=5``, as docs/deployment.md recommends
where the connections allow them); every figure names its database (``db=``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, database_url, db_label, figure, note, scratch, setup_django
from bench.targets import WORKER_CPU_MS as CPU_TARGET_MS
from bench.targets import WORKER_IN_FLIGHT as IN_FLIGHT_TARGET
from bench.targets import WORKER_RATIO as RATIO_TARGET

GIB = 1024**3
#: seconds any wait of the benchmark may last (a whole run takes ~25 s): past it the benchmark
#: fails with the workers' logs and their threads' stacks (``nexo_worker`` dumps them on SIGUSR2),
#: before ``bench.regression``'s own bound (240 s) would stop it with nothing to show
TIMEOUT = 120.0
APP_NAME = "nexo-bench-worker"
#: the interpreter, in every figure line: the targets hold on 3.12 and 3.13 alike (issue 34)
PYTHON = ".".join(map(str, sys.version_info[:2]))


# --- the slow model --------------------------------------------------------------------------------


class SlowServer:
    """HTTP/1.1 (keep-alive) on 127.0.0.1: every ``POST .../chat/completions`` is answered after
    ``delay`` seconds, a tool call if the transcript does not end with a tool result, else a final
    answer. asyncio, so a thousand open requests cost it no thread each."""

    def __init__(self, delay: float, *, stream: bool = False) -> None:
        self.delay = delay
        #: answer a request that asks for a stream with one (the final answer, a word at a time
        #: over ``delay``), as a provider does
        self.stream = stream
        self.open = 0
        self.peak = 0
        self.served = 0
        self.firsts: list[float] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> SlowServer:
        threading.Thread(target=self._serve, daemon=True, name="slow-model").start()
        if not self._ready.wait(10):
            raise RuntimeError("the slow model server did not start")
        return self

    def reset(self) -> None:
        self.peak = self.open
        self.served = 0
        self.firsts: list[float] = []  # when each run's first request came (monotonic)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=4096)
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            async with server:
                await server.serve_forever()

        self._loop.run_until_complete(main())

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                length = 0
                while True:
                    header = await reader.readline()
                    if header in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = header.decode("latin-1").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                body = json.loads(await reader.readexactly(length)) if length else {}
                if ((body.get("messages") or [{}])[-1]).get("role") != "tool":
                    self.firsts.append(time.monotonic())
                self.open += 1
                self.peak = max(self.peak, self.open)
                try:
                    answer = self.answer(body)
                    if self.stream and body.get("stream") and answer["choices"][0]["finish_reason"] == "stop":
                        await self._stream(writer, answer)
                        self.served += 1
                        continue
                    await asyncio.sleep(self.delay)
                    data = json.dumps(answer).encode()
                finally:
                    self.open -= 1
                self.served += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(data), data))  # fmt: skip
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    #: pieces of a streamed answer, sent ``delay / STREAM_PIECES`` seconds apart
    STREAM_PIECES = 20

    async def _stream(self, writer: asyncio.StreamWriter, answer: dict[str, Any]) -> None:
        """The answer as Chat Completions chunks (Server-Sent Events, chunked encoding)."""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")

        def event(data: Any) -> None:
            line = f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(line), line))

        head = {"id": answer["id"], "object": "chat.completion.chunk", "created": 0, "model": answer["model"]}
        for i in range(self.STREAM_PIECES):
            await asyncio.sleep(self.delay / self.STREAM_PIECES)
            delta = {"role": "assistant", "content": f"word{i} "} if i == 0 else {"content": f"word{i} "}
            event({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
            await writer.drain()
        event({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        event({**head, "choices": [], "usage": answer["usage"]})
        event("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or [{}]
        if messages[-1].get("role") == "tool":
            message: dict[str, Any] = {"role": "assistant", "content": "Done."}
            finish = "stop"
        else:
            call = {"id": f"call_{self.served}", "type": "function",
                    "function": {"name": "echo", "arguments": json.dumps({"text": "hi"})}}  # fmt: skip
            message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
        return {
            "id": f"chatcmpl-{self.served}", "object": "chat.completion", "created": 0, "model": body.get("model", ""),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }  # fmt: skip


# --- measuring processes -----------------------------------------------------------------------------


def pss_bytes(pid: int) -> int:
    """The process's proportional set size (shared pages divided among their sharers)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler:
    """Every 0.1 s: the summed PSS of ``pids()`` and whatever ``extra`` returns; keeps the peaks."""

    def __init__(self, pids: Callable[[], list[int]], *extra: Callable[[], int]) -> None:
        self.pids = pids
        self.extra = extra
        self.peak_pss = 0
        self.peaks = [0] * len(extra)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="sampler")

    def __enter__(self) -> Sampler:
        self._cpu = sum(cpu_seconds(pid) for pid in self.pids())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu = sum(cpu_seconds(pid) for pid in self.pids()) - self._cpu
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak_pss = max(self.peak_pss, sum(pss_bytes(pid) for pid in self.pids()))
            self.peaks = [max(peak, read()) for peak, read in zip(self.peaks, self.extra, strict=True)]
            self._stop.wait(0.1)


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


# --- nexo ---------------------------------------------------------------------------------------------


def nexo_settings(server: SlowServer) -> dict[str, Any]:
    return {"MODEL": "openai:bench-slow", "PROVIDERS": {"openai": {"base_url": server.url, "api_key": "bench"}}}


def worker_env(pool: int | None) -> dict[str, str]:
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1",
           "BENCH_DB_APP": APP_NAME}  # fmt: skip
    if pool is not None:
        env["BENCH_DB_POOL"] = json.dumps({"min_size": 2, "max_size": pool, "timeout": 60})
    return env


def db_connections() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APP_NAME])
        return int(cursor.fetchone()[0])


def running_runs() -> int:
    """Runs claimed and not closed yet: what the workers carry (waiting on the model or on a CPU)."""
    from nexo_django.models import AgentRun

    return AgentRun.objects.filter(status="running").count()


def send_runs(count: int) -> list[Any]:
    from bench.agents import Echoer

    return [Echoer.run_later(f"echo {i}") for i in range(count)]


def all_done(ids: list[Any]) -> bool:
    from nexo_django.models import AgentRun

    ended = AgentRun.objects.filter(pk__in=ids, status__in=("done", "failed", "cancelled", "needs_attention"))
    return ended.count() == len(ids)


def check_done(ids: list[Any]) -> None:
    from nexo_django.models import AgentRun

    bad = list(AgentRun.objects.filter(pk__in=ids).exclude(status="done").values_list("status", "error")[:3])
    if bad:
        raise RuntimeError(f"runs did not end done: {bad}")


def suspended(redis: Any, processes: int) -> bool:
    """Whether ``processes`` workers say they are suspended (rq's state, set in its suspension loop)."""
    from rq.worker import Worker, WorkerStatus

    return sum(w.get_state() == WorkerStatus.SUSPENDED for w in Worker.all(connection=redis)) >= processes


def suspend_all(redis: Any, processes: int) -> None:
    """After ``rq suspend``, wait until every worker is in rq's suspension loop. A worker waiting
    for a job when the suspension comes notices it only after its next job, so warm-up runs are
    sent one at a time until all say so: a suspended worker takes none, so each goes to one still
    waiting. One run per worker at once hung (2026-12-03): a worker with free threads takes as many
    jobs as are queued, and one that went into the suspension loop before taking any left a run
    queued that no worker would take."""
    from rq import Queue

    sent: list[Any] = []
    for _ in range(10 * processes):
        if suspended(redis, processes):
            break
        last = [r.pk for r in send_runs(1)]
        sent += last
        # the last worker waiting may have gone into the suspension loop just before taking it
        wait_for(lambda last=last: all_done(last) or suspended(redis, processes), "a warm-up run sent after `rq suspend`")
        deadline = time.monotonic() + 3  # the worker that took it reaches the suspension loop
        while not suspended(redis, processes) and time.monotonic() < deadline:
            time.sleep(0.05)
    if not suspended(redis, processes):
        raise TimeoutError(f"the workers were not all suspended after {10 * processes} warm-up runs")
    queues = Queue.all(connection=redis)
    untaken = {job for queue in queues for job in queue.job_ids}
    for queue in queues:  # a warm-up run no worker took: not in the timed part
        queue.empty()
    taken = [pk for pk in sent if not any(str(pk) in job for job in untaken)]
    wait_for(lambda: all_done(taken), "the warm-up runs the workers took before they suspended")


def ramp(server: SlowServer) -> float:
    """Seconds from the first run's first model request to the last run's, as the server saw
    them: how long the side took to start them all. While the ramp is longer than a run lasts,
    the first runs end before the last start, and fewer than all are in flight at once."""
    return server.firsts[-1] - server.firsts[0] if server.firsts else 0.0


def measure_nexo(server: SlowServer, workers: Any, count: int, warmup: int) -> dict[str, float]:
    import django_rq
    from rq.suspension import resume, suspend

    warm = [r.pk for r in send_runs(warmup)]
    wait_for(lambda: all_done(warm), "the warm-up runs")
    # The runs are all sent while the workers are suspended (rq's own `rq suspend`), then the
    # workers resume: like the peer's gather, the timed part starts with every run ready.
    redis = django_rq.get_connection("default")
    suspend(redis)
    suspend_all(redis, len(workers.pids))
    start = time.perf_counter()
    ids = [r.pk for r in send_runs(count)]
    sent = time.perf_counter() - start
    server.reset()
    with Sampler(lambda: workers.pids, db_connections, running_runs) as sampler:
        resume(redis)
        wait_for(lambda: all_done(ids), f"{count} runs")
        # Timed from the first run's first model request, a few milliseconds after the worker
        # took its first job: rq's suspension loop notices the resumption within a second, and
        # that wait is the benchmark's, not the worker's.
        elapsed = time.monotonic() - server.firsts[0]
    check_done(ids)
    return {"ramp_s": ramp(server), "in_flight": server.peak, "pss": sampler.peak_pss, "runs_per_s": count / elapsed,
            "seconds": elapsed, "send_s": sent, "db_connections": sampler.peaks[0], "running": sampler.peaks[1],
            "cpu_ms_per_run": sampler.cpu * 1e3 / count}  # fmt: skip


def nexo_concurrent(server: SlowServer, redis_url: str, count: int, pool: int) -> dict[str, float]:
    from tests.rq_workers import RQWorkers

    workers = RQWorkers(queues=["default"], redis_url=redis_url, env=worker_env(pool), log_dir=scratch(),
                        concurrency=count, extra_args=["--shutdown-grace", "5"], cwd=REPO_ROOT).start()  # fmt: skip
    try:
        return measure_nexo(server, workers, count, warmup=5)
    except BaseException:
        for pid in workers.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR2)  # its threads' stacks, into its log
        time.sleep(1.0)
        note(workers.logs())
        raise
    finally:
        workers.stop()


def nexo_simple(server: SlowServer, redis_url: str, processes: int, count: int) -> dict[str, float]:
    from tests.rq_workers import RQWorkers

    workers = RQWorkers(queues=["default"], redis_url=redis_url, env=worker_env(None), log_dir=scratch(),
                        count=processes, worker_class="rq.worker.SimpleWorker", cwd=REPO_ROOT).start()  # fmt: skip
    try:
        return measure_nexo(server, workers, count, warmup=processes)
    except BaseException:
        note(workers.logs())
        raise
    finally:
        workers.stop()


# --- the asyncio peer -----------------------------------------------------------------------------------


async def peer_runs(url: str, count: int) -> float:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no exporter, no network
    client = AsyncOpenAI(base_url=url, api_key="bench", max_retries=0, timeout=120)

    @function_tool
    def echo(text: str) -> str:
        """Returns its text."""
        return text

    agent = Agent(name="echoer", instructions="Call echo once, then answer.", tools=[echo],
                  model=OpenAIChatCompletionsModel(model="bench-slow", openai_client=client))  # fmt: skip
    for _ in range(3):  # warm-up, untimed
        await Runner.run(agent, "echo")
    print("ready", flush=True)
    sys.stdin.readline()  # the parent resets the server's counters meanwhile
    start = time.perf_counter()
    results = await asyncio.gather(*(Runner.run(agent, f"echo {i}") for i in range(count)))
    elapsed = time.perf_counter() - start
    if any(r.final_output != "Done." for r in results):
        raise RuntimeError("a peer run did not end with the final answer")
    return elapsed


def peer(server: SlowServer, count: int) -> dict[str, float]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.concurrency", "--peer-child", server.url, "--runs", str(count)],
        cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the peer did not start")
        server.reset()
        with Sampler(lambda: [proc.pid]) as sampler:
            start = time.perf_counter()
            proc.stdin.write("go\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            # From the gather: the SDK's work before its first model request (about 1.8 s of
            # CPU for 500 runs) is its runs' work, as nexo's claims are nexo's.
            elapsed = time.perf_counter() - start
        inner = float(json.loads(line)["seconds"])
        ramp_s = ramp(server)
    finally:
        proc.stdin.close()
        proc.wait(30)
    return {"in_flight": server.peak, "pss": sampler.peak_pss, "runs_per_s": count / elapsed,
            "seconds": elapsed, "gather_s": inner, "cpu_ms_per_run": sampler.cpu * 1e3 / count,
            "ramp_s": ramp_s}  # fmt: skip


# --- main ---------------------------------------------------------------------------------------------------


def print_side(side: str, result: dict[str, float], processes: int, **extra: Any) -> None:
    pss = result["pss"]
    figure(
        "concurrency", side=side, processes=processes, runs_in_flight=result["in_flight"],
        pss_mib=pss / 2**20, runs_in_flight_per_gib=result["in_flight"] / (pss / GIB) if pss else 0.0,
        runs_per_s=result["runs_per_s"], seconds=result["seconds"], cpu_ms_per_run=result["cpu_ms_per_run"], **extra,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=500, help="runs at once, on each concurrent side")
    parser.add_argument("--pool", type=int, default=10, help="the concurrent worker's PostgreSQL pool (max_size)")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds the server takes per request")
    parser.add_argument("--simple-workers", type=int, default=8)
    parser.add_argument("--simple-runs", type=int, default=48)
    parser.add_argument("--skip", action="append", default=[], choices=["peer", "simple"])
    parser.add_argument("--db", default="postgres", choices=["postgres", "postgres-prepared"],
                        help="postgres-prepared: Django's server_side_binding, psycopg preparing a statement from its "
                             "5th run (docs/deployment.md)")
    parser.add_argument("--peer-child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer_child:
        seconds = asyncio.run(peer_runs(args.peer_child, args.runs))
        print(json.dumps({"seconds": seconds}), flush=True)
        return

    from tests.servers import RedisServer

    server = SlowServer(args.delay).start()
    note(f"slow model at {server.url}: {args.delay:g} s a request")
    os.environ["BENCH_NEXO"] = json.dumps(nexo_settings(server))
    with RedisServer() as redis_server:
        setup_django(database_url(args.db), redis_url=redis_server.url)
        db = db_label()
        note(f"nexo: one concurrent worker, {args.runs} runs, pool of {args.pool}, {db}")
        nexo = nexo_concurrent(server, redis_server.url, args.runs, args.pool)
        print_side("nexo_concurrent_worker", nexo, 1, python=PYTHON, db=db, runs_running_peak=nexo["running"], pool=args.pool,
                   pg_connections=nexo["db_connections"], send_s=nexo["send_s"], ramp_s=nexo["ramp_s"])  # fmt: skip
        if "peer" not in args.skip:
            note(f"peer: the OpenAI Agents SDK, {args.runs} Runner.run under asyncio.gather")
            other = peer(server, args.runs)
            print_side("openai_agents_gather", other, 1, python=PYTHON, gather_s=other["gather_s"], ramp_s=other["ramp_s"])
            ratio = nexo["runs_per_s"] / other["runs_per_s"]
            figure("concurrency_vs_peer", runs=args.runs, python=PYTHON, db=db, nexo_runs_per_s=nexo["runs_per_s"],
                   peer_runs_per_s=other["runs_per_s"], runs_per_s_ratio=ratio,
                   per_gib_ratio=(nexo["in_flight"] / nexo["pss"]) / (other["in_flight"] / other["pss"]))  # fmt: skip
        else:
            ratio = None
        # Issue 34's targets for one process at --delay 1 and 500 runs (PostgreSQL): at most 4 ms of
        # CPU a run, at least 480 model requests open at once, at least twice the peer's runs/s.
        figure("concurrency_target", runs=args.runs, python=PYTHON, db=db, cpu_ms_per_run=nexo["cpu_ms_per_run"],
               cpu_target_ms=CPU_TARGET_MS, runs_in_flight=nexo["in_flight"],
               in_flight_target=round(args.runs * IN_FLIGHT_TARGET), runs_per_s_ratio=ratio if ratio is not None else "-",
               ratio_target=RATIO_TARGET,
               met="yes" if (nexo["cpu_ms_per_run"] <= CPU_TARGET_MS and nexo["in_flight"] >= args.runs * IN_FLIGHT_TARGET
                             and ratio is not None and ratio >= RATIO_TARGET) else "no")  # fmt: skip
        if "simple" not in args.skip:
            note(f"nexo today: {args.simple_workers} SimpleWorker processes, {args.simple_runs} runs")
            simple = nexo_simple(server, redis_server.url, args.simple_workers, args.simple_runs)
            print_side("nexo_simple_workers", simple, args.simple_workers, python=PYTHON, runs_running_peak=simple["running"],
                       pg_connections=simple["db_connections"])  # fmt: skip


if __name__ == "__main__":
    main()
