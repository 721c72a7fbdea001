"""The concurrent worker's parts, each alone (issue 26): the per-thread job timeouts (a heap of
deadlines), the provider connections split among clients past 50, and the Redis round trips rq
makes before every job (the suspension check and the state), which the worker sends once a
second. Real threads and a real redis-server; no run, no model."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from rq import Queue
from rq.job import Job
from rq.suspension import resume, suspend

from nexo_django.core.llm import http
from nexo_django.durable.worker import ConcurrentWorker, _Watchdog
from tests.servers import wait_until

pytestmark = [pytest.mark.redis]


class Fired(BaseException):
    """What a test's watchdog raises."""


def _sleeper(watchdog: _Watchdog, seconds: float, got: dict[str, Any], name: str, disarm_after: float | None) -> None:
    key = watchdog.arm(seconds, Fired)
    try:
        end = time.monotonic() + (disarm_after if disarm_after is not None else 10.0)
        while time.monotonic() < end:  # Python instructions, so an async exception can land
            time.sleep(0.005)
        watchdog.disarm(key)
        got[name] = ("disarmed", time.monotonic())
    except Fired:
        got[name] = ("fired", time.monotonic())


def test_the_earliest_deadline_fires_first_in_its_own_thread_and_a_disarmed_one_never() -> None:
    watchdog = _Watchdog()
    got: dict[str, Any] = {}
    threads = [
        threading.Thread(target=_sleeper, args=(watchdog, 3.0, got, "late", None)),  # armed first
        threading.Thread(target=_sleeper, args=(watchdog, 0.2, got, "early", None)),
        threading.Thread(target=_sleeper, args=(watchdog, 0.3, got, "disarmed", 0.05)),
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
        time.sleep(0.02)
    for thread in threads:
        thread.join(15)
    assert got["early"][0] == "fired" and got["late"][0] == "fired" and got["disarmed"][0] == "disarmed"
    # the early one did not wait for the deadline armed before it
    assert got["early"][1] < got["late"][1] and got["early"][1] - started < 2.0
    time.sleep(0.4)  # past the disarmed one's deadline: nothing lands in its thread's code later
    assert watchdog._armed == {}


@pytest.fixture
def fresh_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http, "_clients", [])
    monkeypatch.setattr(http, "_tls", None)
    monkeypatch.setattr(http, "_local", threading.local())
    monkeypatch.setattr(http, "_next_shard", 0)
    monkeypatch.setattr(http, "_max_connections", 50)


def _clients_of_threads(count: int) -> list[Any]:
    got: list[Any] = [None] * count

    def look(i: int) -> None:
        first = http.shared_client()
        assert http.shared_client() is first  # a thread keeps to its client
        got[i] = first

    threads = [threading.Thread(target=look, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return got


def _limit(client: Any) -> int:
    return int(client._transport._pool._max_connections)


def test_up_to_fifty_connections_every_thread_shares_one_client(fresh_clients: None) -> None:
    clients = _clients_of_threads(20)
    assert len({id(c) for c in clients}) == 1 and _limit(clients[0]) == 50


def test_past_fifty_each_thread_has_a_client_of_its_own_made_when_first_needed(fresh_clients: None) -> None:
    http.set_max_connections(500)
    clients = _clients_of_threads(40)
    distinct = {id(c): c for c in clients}
    assert len(distinct) == 40 and {_limit(c) for c in distinct.values()} == {1}
    assert len(http._clients) == 500 and sum(c is not None for c in http._clients) == 40  # the bound: 500
    # one TLS context for all of them (not forty loads of the CA certificates)
    contexts = {id(c._transport._pool._ssl_context) for c in distinct.values()}
    assert len(contexts) == 1
    for client in distinct.values():
        client.close()


def test_past_the_bound_threads_share_the_clients_round_robin(fresh_clients: None) -> None:
    http.set_max_connections(60)
    clients = _clients_of_threads(90)
    distinct = {id(c): c for c in clients}
    assert len(distinct) == 60 and sum(_limit(c) for c in distinct.values()) == 60
    for client in distinct.values():
        client.close()


@pytest.fixture
def redis(redis_server: Any) -> Iterator[Any]:
    """A client of the suite's redis-server (started again if a test stopped it)."""
    from redis import Redis

    if not redis_server.running:
        redis_server.restart()
    client = Redis.from_url(redis_server.url)
    yield client
    client.close()


def test_rq_asks_about_suspension_and_sends_its_state_once_a_second(redis: Any) -> None:
    worker = ConcurrentWorker([Queue("parts", connection=redis)], connection=redis, concurrency=4)
    given, redis = redis, worker.connection  # its own client (on a pool of its own)
    sent: list[str] = []
    execute = redis.execute_command

    def counting(*args: Any, **kwargs: Any) -> Any:
        sent.append(str(args[0]))
        return execute(*args, **kwargs)

    pipeline = redis.pipeline

    def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
        sent.append("PIPELINE")
        return pipeline(*args, **kwargs)

    redis.execute_command = counting  # type: ignore[method-assign]
    redis.pipeline = counting_pipeline  # type: ignore[method-assign]
    for _ in range(50):  # rq's loop before each of 50 jobs taken in quick succession
        worker.check_for_suspension(burst=False)
        worker.set_state("idle")
    assert sent.count("HSET") == 1  # the state, once
    assert sent.count("PIPELINE") == 1  # the suspension check (with a heartbeat), once
    suspend(given)
    try:
        time.sleep(1.05)
        stopper = threading.Timer(0.3, resume, args=(given,))
        stopper.start()
        began = time.monotonic()
        worker.check_for_suspension(burst=False)  # a second on: asks again, and obeys
        assert time.monotonic() - began >= 0.25
        stopper.join()
    finally:
        resume(given)
        redis.execute_command = execute  # type: ignore[method-assign]
        redis.pipeline = pipeline  # type: ignore[method-assign]


def test_after_waiting_for_a_job_the_worker_asks_about_a_suspension_at_once(redis: Any) -> None:
    """An `rq suspend` sent while the worker waited on an empty queue stops it after the one job
    it was waiting for, as with rq's own workers (the once-a-second rule is for jobs taken back
    to back)."""
    queue = Queue("parts-wait", connection=redis)
    queue.empty()
    worker = ConcurrentWorker([queue], connection=redis, concurrency=4)
    worker.check_for_suspension(burst=False)
    assert worker._suspension_checked > 0  # asked just now: the next job would not ask again
    enqueuer = threading.Timer(0.3, queue.enqueue_call, kwargs={"func": "builtins.print"})
    enqueuer.start()
    job, _ = worker.dequeue_job_and_maintain_ttl(timeout=5)  # waits for the job
    enqueuer.join()  # the job can be taken before the enqueuing thread has read its reply
    assert job is not None and worker._suspension_checked == float("-inf")
    queue.enqueue_call(func="builtins.print")
    worker.check_for_suspension(burst=False)
    job, _ = worker.dequeue_job_and_maintain_ttl(timeout=5)  # there at once: no wait
    assert job is not None and worker._suspension_checked > 0
    queue.empty()


def test_a_job_taken_without_asking_is_followed_by_asking_before_waiting(redis: Any) -> None:
    """Jobs taken back to back skip the suspension check (once a second); if the queue is then
    empty, the worker asks before it waits, so an `rq suspend` sent meanwhile is obeyed now, not
    after whatever job comes next."""
    queue = Queue("parts-ask", connection=redis)
    queue.empty()
    worker = ConcurrentWorker([queue], connection=redis, concurrency=1)
    worker.register_birth()
    timers: list[threading.Timer] = []
    try:
        worker.check_for_suspension(burst=False)  # asked just now
        queue.enqueue_call(func="builtins.print")
        suspend(redis)
        worker.check_for_suspension(burst=False)  # within the second: not asked
        job, _ = worker.dequeue_job_and_maintain_ttl(timeout=5)  # there at once
        assert job is not None and worker._suspension_skipped
        worker._slots.release()  # the job is done
        states: list[str] = []
        timers += [
            threading.Timer(0.5, lambda: states.append(worker.get_state())),
            threading.Timer(0.8, resume, args=(redis,)),
            threading.Timer(1.2, queue.enqueue_call, kwargs={"func": "builtins.print"}),
        ]
        for timer in timers:
            timer.start()
        worker.check_for_suspension(burst=False)  # still within the second
        began = time.monotonic()
        job, _ = worker.dequeue_job_and_maintain_ttl(timeout=5)
        assert states == ["suspended"]  # it asked before waiting, and obeyed
        assert job is not None and time.monotonic() - began >= 1.0
    finally:
        for timer in timers:  # the job can be taken before the enqueuing thread has its reply:
            timer.join()  # an unjoined thread failed in the next test when the client closed
        resume(redis)
        worker.register_death()
        queue.empty()


def test_a_job_starting_while_the_worker_is_suspended_leaves_its_state_suspended(redis: Any) -> None:
    """A job's thread records its start (rq's ``prepare_execution``, with the worker's state
    "busy") after the main thread may have gone on into rq's suspension loop, which writes
    "suspended" once and sleeps: the job's "busy" must not overwrite it, or `rq suspend` is obeyed
    and nobody can tell (the benchmark waiting for every worker to say "suspended" hung)."""
    queue = Queue("parts-suspended-state", connection=redis)
    queue.empty()
    worker = ConcurrentWorker([queue], connection=redis, concurrency=2)
    worker.register_birth()
    job = queue.enqueue_call(func="builtins.print")

    def state() -> bytes | None:
        return redis.hget(worker.key, "state")

    suspend(redis)
    loop = threading.Thread(target=worker.check_for_suspension, args=(False,), name="main, suspended")
    try:
        loop.start()
        wait_until(lambda: state() == b"suspended", timeout=5, interval=0.01, what="the worker to say suspended")
        worker.prepare_execution(job)  # the job's thread, after the suspension loop began
        assert worker.execution is not None and worker.execution.job_id == job.id  # recorded all the same
        assert state() == b"suspended"
    finally:
        resume(redis)
        loop.join(5)
    try:
        assert not loop.is_alive() and state() not in (b"suspended", None)  # the loop's end restores it
        worker.set_state("idle")  # the main thread's own states are sent again
        assert state() == b"idle"
    finally:
        queue.empty()
        _retire(worker)


def test_a_job_start_sent_as_the_worker_suspends_does_not_land_after_suspended(
    redis: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other order: the job's thread has put "busy" in its start's pipeline when the main
    thread goes into the suspension loop; the pipeline is sent a moment later. The start is sent
    whole before "suspended" is written, never after it."""
    from redis.client import Pipeline

    queue = Queue("parts-suspending", connection=redis)
    queue.empty()
    worker = ConcurrentWorker([queue], connection=redis, concurrency=2)
    worker.register_birth()
    job = queue.enqueue_call(func="builtins.print")
    loop = threading.Thread(target=worker.check_for_suspension, args=(False,), name="main, suspending")
    execute = Pipeline.execute

    def late(pipe: Any, *args: Any, **kwargs: Any) -> Any:
        if any(command[0][:1] == ("HSET",) and "busy" in command[0] for command in pipe.command_stack):
            suspend(redis)
            loop.start()  # the main thread, into the loop while the start is on its way
            time.sleep(0.3)
        return execute(pipe, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "execute", late)
    try:
        worker.prepare_execution(job)
        monkeypatch.undo()
        assert loop.is_alive()
        wait_until(lambda: redis.hget(worker.key, "state") == b"suspended", timeout=5, interval=0.01,
                   what="the worker to say suspended")  # fmt: skip
        time.sleep(0.1)
        assert redis.hget(worker.key, "state") == b"suspended"
    finally:
        monkeypatch.undo()
        resume(redis)
        if loop.ident is not None:
            loop.join(5)
        queue.empty()
        _retire(worker)


def _retire(worker: ConcurrentWorker) -> None:
    """The end of a worker a test drove by hand (not through work()): its key and its own pool."""
    worker.register_death()
    worker.connection.connection_pool.disconnect()  # its own pool: close() leaves it open
    worker.connection.close()


def test_a_burst_of_jobs_is_taken_and_started_in_three_round_trips_one_per_free_thread(
    redis: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = Queue("parts-burst", connection=redis)
    queue.empty()
    ids = [queue.enqueue_call(func="builtins.print", args=(i,)).id for i in range(10)]
    worker = ConcurrentWorker([queue], connection=redis, concurrency=4)
    from redis.client import Pipeline

    sent: list[list[str]] = []
    execute = Pipeline.execute

    def recording(pipe: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append([str(command[0][0]) for command in pipe.command_stack])
        return execute(pipe, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "execute", recording)
    job, _ = worker.dequeue_job_and_maintain_ttl(timeout=5)
    monkeypatch.undo()
    # Three more ids in one round trip, their three jobs in another, and the start of all four
    # recorded (as rq records a job's) in a third.
    assert [c for c in sent if set(c) & {"LMOVE", "HGETALL"}] == [["LMOVE"] * 3, ["HGETALL"] * 3]
    assert [c.count("LREM") for c in sent if "LREM" in c] == [4]
    assert job.id == ids[0]
    assert [j.id for j, _ in worker._prefetched] == ids[1:4]  # one per free thread: 4 threads
    assert not worker._slots.acquire(blocking=False)  # each holds its thread's slot
    assert worker.dequeue_job_and_maintain_ttl(timeout=5)[0].id == ids[1]  # no round trip
    started = queue.started_job_registry
    assert sorted(started.get_job_ids()) == sorted(ids[:4])
    assert {Job.fetch(i, connection=redis).get_status() for i in ids[:4]} == {"started"}
    assert redis.llen(f"{queue.key}:intermediate") == 0
    # Stopping, the jobs taken and not handed to a thread go back to the front of the queue, in
    # their order, queued again.
    worker._return_prefetched()
    assert queue.job_ids == ids[2:]
    assert sorted(started.get_job_ids()) == sorted(ids[:2])
    assert {Job.fetch(i, connection=redis).get_status() for i in ids[2:4]} == {"queued"}
    assert worker._slots.acquire(blocking=False) and worker._slots.acquire(blocking=False)
    assert not worker._slots.acquire(blocking=False)  # the two started ones still hold theirs
    queue.empty()
    redis.delete(started.key)


def test_threads_share_a_bounded_pool_of_redis_connections(redis_server: Any) -> None:
    """redis-py's own pool refuses a 101st connection at once; the worker's threads wait for one
    of its ``REDIS_CONNECTIONS`` instead (a burst of jobs starting together asked for more)."""
    from redis import BlockingConnectionPool, Redis
    from redis.exceptions import MaxConnectionsError

    from nexo_django.durable.worker import REDIS_CONNECTIONS

    watcher = Redis.from_url(redis_server.url)

    def blocked() -> int:
        return int(watcher.info("clients")["blocked_clients"])

    def at_once(client: Any, threads: int, holding: int) -> list[BaseException]:
        """``threads`` threads each wait on an empty list through ``client``, all at once (a
        barrier); once ``holding`` of them hold a connection, the list is filled and they end."""
        errors: list[BaseException] = []
        barrier = threading.Barrier(threads + 1)

        def hold() -> None:
            barrier.wait(30)
            try:
                client.blpop(["parts-nothing"], timeout=30)
            except BaseException as exc:
                errors.append(exc)

        running = [threading.Thread(target=hold) for _ in range(threads)]
        for thread in running:
            thread.start()
        barrier.wait(30)
        deadline = time.monotonic() + 30
        while blocked() < holding and time.monotonic() < deadline:
            time.sleep(0.01)
        assert blocked() == holding
        if errors:  # those refused at once are refused by now: wait for each thread to be either
            while blocked() + len(errors) < threads and time.monotonic() < deadline:
                time.sleep(0.01)
        watcher.rpush("parts-nothing", *range(threads))
        for thread in running:
            thread.join(30)
        watcher.delete("parts-nothing")
        return errors

    plain = Redis.from_url(redis_server.url)
    errors = at_once(plain, 150, 100)  # redis-py's default pool: 100 connections at most
    assert len(errors) == 50 and all(isinstance(e, MaxConnectionsError) for e in errors)  # what happened before
    plain.connection_pool.disconnect()
    plain.close()

    client = Redis.from_url(redis_server.url)
    given_pool, given_queue = client.connection_pool, Queue("parts-pool", connection=client)
    worker = ConcurrentWorker([given_queue], connection=client, concurrency=300)
    assert isinstance(worker.connection.connection_pool, BlockingConnectionPool)
    assert worker.queues[0].connection.connection_pool is worker.connection.connection_pool
    # the client it was given (other code may share it) and its queue are left as they were
    assert client.connection_pool is given_pool and given_queue.connection is client
    assert worker.connection is not client
    assert at_once(worker.connection, 150, REDIS_CONNECTIONS) == []
    assert len(worker.connection.connection_pool._connections) <= REDIS_CONNECTIONS
    worker.connection.connection_pool.disconnect()  # its own pool: close() leaves it open
    worker.connection.close()
    client.close()
    watcher.close()


def test_the_worker_starts_its_threads_before_taking_a_job(redis: Any) -> None:
    worker = ConcurrentWorker([Queue("parts-start", connection=redis)], connection=redis, concurrency=25)
    assert worker._threads == []
    worker.bootstrap()
    try:
        assert len(worker._threads) == 25 and all(t.is_alive() for t in worker._threads)
    finally:
        worker.teardown()  # no job in flight: each thread is told to end
    for thread in worker._threads:
        thread.join(5)
        assert not thread.is_alive()


def _record(*items: Any) -> None:
    """A job: appends its items to the Redis list ``parts-done`` (on the suite's Redis)."""
    from rq import get_current_job

    job = get_current_job()
    assert job is not None
    job.connection.rpush("parts-done", *[str(item) for item in items])


def _fail_once(key: str) -> None:
    """A job that fails the first time it runs (its retry then succeeds)."""
    from rq import get_current_job

    job = get_current_job()
    assert job is not None
    if job.connection.incr(key) == 1:
        raise RuntimeError("the first try fails")
    job.connection.rpush("parts-done", "retried")


def _spin(seconds: float) -> None:
    """A job of Python instructions for ``seconds`` (an exception raised into it lands)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.02)


@pytest.mark.timeout(30)  # it hung for ever (pytest-timeout's SIGALRM: the worker's timeouts are not alarms)
def test_work_called_again_on_the_same_worker_runs_the_new_jobs(redis: Any) -> None:
    """rq's workers can work() again after a burst; this one's threads ended at the first one's
    end, were still counted, and the second burst waited for ever with its job left started."""
    queue = Queue("parts-again", connection=redis)
    queue.empty()
    redis.delete("parts-done")
    worker = ConcurrentWorker([queue], connection=redis, concurrency=2)
    queue.enqueue_call(func=_record, args=("first",))
    worker.work(burst=True)
    # its own pool's connections are closed when it stops (they were left to the garbage collector)
    assert worker.connection is not redis and worker.connection.connection_pool._connections
    assert all(c._sock is None for c in worker.connection.connection_pool._connections)
    queue.enqueue_call(func=_record, args=("second",))
    worker.work(burst=True)
    assert redis.lrange("parts-done", 0, -1) == [b"first", b"second"]
    assert queue.started_job_registry.count == 0 and queue.finished_job_registry.count == 2


def test_a_burst_waits_for_the_dependents_and_retries_its_jobs_enqueue(redis: Any) -> None:
    """A burst ends once nothing is queued and nothing is in flight: a job ending may enqueue its
    dependents or its retry, which the burst then runs (it returned with them still queued)."""
    from rq import Retry

    queue = Queue("parts-burst-deps", connection=redis)
    queue.empty()
    redis.delete("parts-done", "parts-tries")
    parent = queue.enqueue_call(func=_record, args=("parent",))
    queue.enqueue_call(func=_record, args=("child",), depends_on=parent)
    queue.enqueue_call(func=_fail_once, args=("parts-tries",), retry=Retry(max=1))
    ConcurrentWorker([queue], connection=redis, concurrency=4).work(burst=True)
    assert sorted(redis.lrange("parts-done", 0, -1)) == [b"child", b"parent", b"retried"]
    assert queue.count == 0 and queue.finished_job_registry.count == 3


def _upper(item: str) -> str:
    """A job returning its item in capitals."""
    return item.upper()


def test_jobs_ending_together_are_recorded_in_one_transaction_each_as_rq_records_a_success(
    redis: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The end of a job (its success, its result, the finished registry, out of the started one,
    the worker's counts) is written for the jobs ending at the same moment in one MULTI/EXEC by
    one thread, not in four round trips by each; a job with dependents is recorded by its own
    thread, as rq does (test_a_burst_waits_for_the_dependents_and_retries_its_jobs_enqueue)."""
    from redis.client import Pipeline

    queue = Queue("parts-ends", connection=redis)
    queue.empty()
    ids = [queue.enqueue_call(func=_upper, args=(f"item {i}",), result_ttl=600).id for i in range(5)]
    worker = ConcurrentWorker([queue], connection=redis, concurrency=8)
    # The thread that records the ends waits, once, until the five are all waiting for it.
    record = worker._end_together
    first = threading.Event()

    def held(batch: list[Any]) -> None:
        if not first.is_set():
            first.set()
            deadline = time.monotonic() + 10
            while len(batch) + worker._ends.qsize() < 5 and time.monotonic() < deadline:
                time.sleep(0.01)
            while worker._ends.qsize():  # what the thread would take next time, taken now
                batch.append(worker._ends.get_nowait())
        record(batch)

    monkeypatch.setattr(worker, "_end_together", held)
    results: list[int] = []
    execute = Pipeline.execute

    def recording(pipe: Any, *args: Any, **kwargs: Any) -> Any:
        if pipe.transaction:
            results.append(sum(str(command[0][0]) == "XADD" for command in pipe.command_stack))
        return execute(pipe, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "execute", recording)
    worker.work(burst=True)
    monkeypatch.undo()
    assert max(results) == 5, results  # the five ends in one transaction
    assert sum(results) == 5  # every job's result written once
    for i, job_id in enumerate(ids):
        job = Job.fetch(job_id, connection=redis)
        assert job.get_status() == "finished" and job.return_value() == f"ITEM {i}"
        assert job.args == (f"item {i}",) and job.worker_name == worker.name
        assert job.started_at is not None and job.ended_at is not None and job.started_at <= job.ended_at
        assert 0 < redis.ttl(job.key) <= 600  # rq's cleanup: kept for its result_ttl
    finished = set(queue.finished_job_registry.get_job_ids())
    assert finished == set(ids)
    assert queue.started_job_registry.count == 0
    assert not [key for job_id in ids for key in redis.keys(f"rq:execution:{job_id}:*")]  # executions deleted
    assert int(redis.hget(worker.key, "successful_job_count") or 0) == 5
    queue.empty()


@pytest.mark.timeout(60)
def test_rqs_stop_job_command_stops_that_job_and_no_other(redis: Any) -> None:
    """rq's ``stop-job`` reaches the job's own thread: that job is stopped (rq's "stopped", in its
    failed registry), its neighbour finishes. (A run's job stops at the run's next commit instead,
    through the journal: ``journal.stop_run_at_next_commit``.)"""
    from rq.command import send_stop_job_command

    queue = Queue("parts-stop", connection=redis)
    queue.empty()
    redis.delete("parts-done")
    worker = ConcurrentWorker([queue], connection=redis, concurrency=2)
    doomed = queue.enqueue_call(func=_spin, args=(20,))
    neighbour = queue.enqueue_call(func=_spin, args=(1.5,))
    seen: list[set[str]] = []

    def stop_when_both_run() -> None:
        deadline = time.monotonic() + 10
        while set(worker.in_flight()) != {doomed.id, neighbour.id} and time.monotonic() < deadline:
            time.sleep(0.02)
        seen.append(set(worker.in_flight()))
        send_stop_job_command(redis, doomed.id)

    threading.Thread(target=stop_when_both_run, daemon=True).start()
    began = time.monotonic()
    worker.work(burst=True)  # returns once both jobs ended
    assert seen == [{doomed.id, neighbour.id}] and time.monotonic() - began < 15
    assert doomed.get_status(refresh=True) == "stopped" and doomed.id in queue.failed_job_registry
    assert neighbour.get_status(refresh=True) == "finished"


class _SlowHandOff:
    """The worker's queue of tasks for its threads, each task handed over ``delay`` seconds late:
    a job is in flight (taken) before any thread runs it."""

    def __init__(self, tasks: Any, delay: float) -> None:
        self.tasks, self.delay = tasks, delay

    def put(self, task: Any) -> None:
        self.tasks.put(task)

    def get(self) -> Any:
        task = self.tasks.get()
        if task is not None:
            time.sleep(self.delay)
        return task


@pytest.mark.timeout(60)
def test_a_stop_sent_before_the_jobs_thread_has_it_stops_the_job(redis: Any) -> None:
    """rq's ``stop-job`` for a job taken and not yet running in its thread (a thread picks it up a
    moment later): it was logged as stopping and then ignored, and the job ran to its end (seen
    once in a loaded ``make test`` in the test above)."""
    from rq.command import send_stop_job_command

    queue = Queue("parts-stop-early", connection=redis)
    queue.empty()
    worker = ConcurrentWorker([queue], connection=redis, concurrency=2)
    worker._tasks = _SlowHandOff(worker._tasks, 0.5)  # type: ignore[assignment]
    doomed = queue.enqueue_call(func=_spin, args=(10,))
    neighbour = queue.enqueue_call(func=_spin, args=(0.1,))  # taken with it: both started together

    def stop_once_taken() -> None:
        wait_until(lambda: doomed.id in worker.in_flight() and doomed.get_status(refresh=True) == "started",
                   interval=0.005, what="the job taken and started")  # fmt: skip
        assert not worker._job_threads  # no thread has it yet
        send_stop_job_command(redis, doomed.id)

    stopper = threading.Thread(target=stop_once_taken, daemon=True)
    stopper.start()
    began = time.monotonic()
    worker.work(burst=True)
    stopper.join(5)
    assert time.monotonic() - began < 5
    assert doomed.get_status(refresh=True) == "stopped" and doomed.id in queue.failed_job_registry
    assert neighbour.get_status(refresh=True) == "finished"
    queue.empty()


@pytest.mark.timeout(60)
def test_a_stop_for_a_job_taken_with_others_and_not_yet_handed_out_stops_it(redis: Any) -> None:
    """Jobs taken together are started (in rq's view) at once and handed to threads one by one;
    a stop-job for one still waiting to be handed out was "not working on job, ignored", and the
    job then ran to its end."""
    queue = Queue("parts-stop-taken", connection=redis)
    queue.empty()
    worker = ConcurrentWorker([queue], connection=redis, concurrency=3)
    first = queue.enqueue_call(func=_spin, args=(0.1,))
    doomed = queue.enqueue_call(func=_spin, args=(10,))
    last = queue.enqueue_call(func=_spin, args=(0.1,))
    job, job_queue = worker.dequeue_job_and_maintain_ttl(timeout=5)  # the first, and the two with it
    assert job.id == first.id and [j.id for j, _ in worker._prefetched] == [doomed.id, last.id]
    assert doomed.get_status(refresh=True) == "started"  # what rq's stop-job command asks
    assert worker.stop_job(doomed.id)
    began = time.monotonic()
    try:
        worker.execute_job(job, job_queue)
        while worker._prefetched:  # what the main loop does next: hand them out, one by one
            worker.execute_job(*worker._prefetched.popleft())
        wait_until(lambda: not worker.in_flight(), timeout=15, interval=0.02, what="the three jobs to end")
        assert time.monotonic() - began < 5
    finally:
        worker.teardown()
    assert doomed.get_status(refresh=True) == "stopped" and doomed.id in queue.failed_job_registry
    assert first.get_status(refresh=True) == "finished" and last.get_status(refresh=True) == "finished"
    queue.empty()


@pytest.mark.timeout(60)
def test_unsubscribing_with_the_command_thread_between_two_reads_ends_at_once(redis: Any) -> None:
    """The thread that reads rq's commands waits for one at a time; a shutdown stops it and (redis-py
    8.2) waits for it to end. Caught after the channel was left, before its next read, it waited
    rq's 60 s for that read: a SIGTERMed worker took a minute to exit (two failures in one loaded
    make test). It waits PUBSUB_WAIT now."""
    worker = ConcurrentWorker([Queue("parts-unsubscribe", connection=redis)], connection=redis, concurrency=1)
    worker.subscribe()
    pubsub, thread = worker.pubsub, worker.pubsub_thread
    assert pubsub is not None and thread is not None
    wait_until(lambda: pubsub.subscribed, timeout=10, what="the channel subscribed")
    pubsub.unsubscribe()
    # The thread reads the unsubscribe's reply, then waits for a subscription again.
    wait_until(lambda: not pubsub.subscribed, timeout=10, what="the channel left")
    time.sleep(0.3)  # into its wait for a new subscription
    began = time.monotonic()
    worker.unsubscribe()
    took = time.monotonic() - began
    assert not thread.is_alive()
    assert took < 5, f"unsubscribe took {took:.1f} s"
