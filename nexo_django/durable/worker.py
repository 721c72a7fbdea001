"""A worker that carries many runs at once: rq's own worker, its jobs run in threads.

A run spends nearly all of its life waiting on its model over HTTP, and its loop is synchronous.
So the worker is rq's (``SimpleWorker``: jobs, registries, failure handling, the dashboard and
``rq``'s commands are rq's own) with one change: ``execute_job`` hands the job to one of
``concurrency`` threads (all started with the worker) and goes back to the queue while a thread
is free; a burst of jobs is taken one per free thread, a few round trips for all. Each thread has its
own Django connection, handed back before every model request (``journal.release_connection_
before_model``), so connections are bounded by the pool, not by the runs in flight. Leases,
heartbeats and recovery are per run, as in any worker; a job timeout is raised in its own
thread only (:class:`ThreadDeathPenalty`); SIGTERM stops taking jobs and each run in flight
goes back to the queue at its next commit (``journal.stop_at_next_commit``), within
``shutdown_grace`` seconds; what is still running then is left to the reconciler, as after a
lost machine. docs/deployment.md says why threads rather than asyncio, and how to size it.
"""

from __future__ import annotations

import collections
import copy
import ctypes
import heapq
import logging
import os
import queue as queues
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

from django.db import connections
from redis import BlockingConnectionPool, ConnectionPool, Redis
from redis.exceptions import RedisError, WatchError
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.job import Job as RqJob
from rq.job import JobStatus, _job_stack
from rq.timeouts import BaseDeathPenalty
from rq.utils import as_text, now, utcformat
from rq.worker import SimpleWorker, WorkerStatus

from ..core.llm import http
from . import dispatch, journal

if TYPE_CHECKING:
    from rq.job import Job
    from rq.queue import Queue

__all__ = ["ConcurrentWorker", "JobStopped", "JobTimeout", "ThreadDeathPenalty"]

log = logging.getLogger("nexo_django.worker")

#: Runs in flight at once when the class is named without a concurrency (``rqworker
#: --worker-class``); ``manage.py nexo_worker --concurrency N`` sets it.
DEFAULT_CONCURRENCY = 10
#: Seconds a warm shutdown waits for the runs in flight to reach their next commit.
DEFAULT_SHUTDOWN_GRACE = 30.0
#: Seconds between two heartbeats of the worker while every thread is busy.
BUSY_HEARTBEAT = 5.0
#: Jobs taken at most in one round trip beside the one the worker waited for, one per free thread.
PREFETCH = 500
#: Redis connections the worker's threads share at most, and seconds a thread waits for one.
REDIS_CONNECTIONS = 50
REDIS_WAIT = 60.0
#: how long the thread that reads rq's commands (its pubsub thread) waits for one at a time: the
#: longest a shutdown waits for that thread to end (rq waits 60 s, which redis-py 8.2's
#: ``PubSubWorkerThread.stop()``, joining the thread without a timeout, made a worker's shutdown
#: wait whenever the thread was between two reads: up to a minute after a SIGTERM)
PUBSUB_WAIT = 1.0


# --- job timeouts, per thread --------------------------------------------------------------------


class _Watchdog:
    """One thread that raises a job's timeout exception in the thread running it, and only there
    (rq's ``UnixSignalDeathPenalty`` uses SIGALRM: one per process, the main thread's). The
    exception lands at the job's next Python instruction: a model request is bounded by its own
    HTTP timeout. The deadlines are a heap: arming and firing cost a log of the jobs in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        #: key -> (deadline (monotonic), thread ident, exception class)
        self._armed: dict[int, tuple[float, int, type[BaseException]]] = {}
        #: (deadline, key), the earliest first; a disarmed key's entry is dropped when it surfaces
        self._heap: list[tuple[float, int]] = []
        self._fired: set[int] = set()
        self._next = 0
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, exception: type[BaseException]) -> int:
        deadline = time.monotonic() + seconds
        with self._lock:
            self._next += 1
            key = self._next
            self._armed[key] = (deadline, threading.get_ident(), exception)
            earliest = not self._heap or deadline < self._heap[0][0]
            heapq.heappush(self._heap, (deadline, key))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, daemon=True, name="nexo-job-timeouts")
                self._thread.start()
        if earliest:  # the loop sleeps until the earliest deadline: only an earlier one wakes it
            self._wake.set()
        return key

    def disarm(self, key: int) -> None:
        with self._lock:
            if self._armed.pop(key, None) is None and key in self._fired:
                # Fired as the job ended: take back an exception not raised yet, so it cannot
                # land in the worker's own code after the job.
                self._fired.discard(key)
                _async_raise(threading.get_ident(), None)

    def _loop(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                while self._heap and (self._heap[0][1] not in self._armed or self._heap[0][0] <= now):
                    _, key = heapq.heappop(self._heap)
                    armed = self._armed.pop(key, None)
                    if armed is not None:
                        self._fired.add(key)
                        _async_raise(armed[1], armed[2])
                wait = (self._heap[0][0] if self._heap else now + 3600.0) - now
            self._wake.wait(max(wait, 0.0))
            self._wake.clear()


def _async_raise(ident: int, exception: type[BaseException] | None) -> None:
    target = ctypes.py_object(exception) if exception is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), target)


_watchdog = _Watchdog()


JobTimeout = journal.JobTimeout
JobStopped = journal.JobStopped


class ThreadDeathPenalty(BaseDeathPenalty):
    """rq's job timeout for a job run in a thread: raised in that thread alone, so one run past its
    timeout fails and its neighbours go on. It is a :class:`JobTimeout` (a ``RunInterrupted``, not
    rq's ``JobTimeoutException``, an ``Exception`` that a tool running at that moment would turn
    into its result, and the run would go on)."""

    def setup_death_penalty(self) -> None:
        self._key: int | None = None
        if self._timeout is None or self._timeout <= 0:
            return
        message = f"the job exceeded its timeout ({self._timeout} seconds)"
        # Raised asynchronously, the exception is made from its class alone: the class says why.
        exception = type("JobTimeout", (JobTimeout,), {"__init__": lambda exc, *a: JobTimeout.__init__(exc, message)})
        self._key = _watchdog.arm(float(self._timeout), exception)

    def cancel_death_penalty(self) -> None:
        if self._key is not None:
            _watchdog.disarm(self._key)
            self._key = None


# --- the end of a job, recorded with others' ------------------------------------------------------


def _is_run_job(job: RqJob) -> bool:
    """Whether ``job`` runs a durable run (it stops at the run's next commit, by the run's id)."""
    return job.func_name == dispatch.JOB_FUNC and bool(job.args)


def _stopped_before_it_ran(job: RqJob) -> Any:
    """``Job.perform`` for a job that rq's stop-job reached before its thread started it."""
    raise JobStopped(f"job {job.id} was stopped (rq's stop-job) before it ran")


def _perform_persisted(job: RqJob) -> Any:
    """rq's ``Job.perform`` for a job whose key was persisted with its start (``_start_together``):
    the same, less that round trip in the job's thread."""
    _job_stack.push(job)
    try:
        job._result = job._execute()
    finally:
        assert job is _job_stack.pop()
    return job._result


def _run_job_success(job: RqJob, result_ttl: int, *, pipeline: Any, **result: Any) -> None:
    """rq's ``Job._handle_success`` for a run's job (``dispatch.JOB_FUNC``), whose function never
    changes its rq job: of the job's hash, only the fields its run changed are written (its
    status, start, end, last beat, worker), not the whole hash again (``Job.save``: about 30
    fields, its data compressed again), which was most of the CPU of recording a job's end."""
    from rq.results import Result

    job.set_status(JobStatus.FINISHED, pipeline=pipeline)
    pipeline.hset(job.key, mapping={
        "started_at": utcformat(job.started_at) if job.started_at else "",
        "ended_at": utcformat(job.ended_at) if job.ended_at else "",
        "last_heartbeat": utcformat(job.last_heartbeat) if job.last_heartbeat else "",
        "worker_name": job.worker_name or "",
    })  # fmt: skip
    Result.create(job, Result.Type.SUCCESSFUL, return_value=job._result, ttl=result_ttl, pipeline=pipeline, **result)
    job.finished_job_registry.add(job, result_ttl, pipeline)


class _End:
    """A job ended well, handed to the thread that records ends together; ``done`` is set once
    it is recorded, or ``own`` says its thread records it itself, as rq does."""

    __slots__ = ("beat", "done", "execution", "job", "own", "result_ttl")

    def __init__(self, job: Job, execution: Execution | None, result_ttl: int, beat: int | None) -> None:
        self.job = job
        self.execution = execution
        self.result_ttl = result_ttl
        self.beat = beat
        self.own = False
        self.done = threading.Lock()
        self.done.acquire()


# --- the worker ----------------------------------------------------------------------------------


class ConcurrentWorker(SimpleWorker):
    """rq's ``SimpleWorker`` running up to ``concurrency`` jobs at once, each in its own thread."""

    death_penalty_class = ThreadDeathPenalty

    def __init__(
        self, *args: Any, concurrency: int = DEFAULT_CONCURRENCY,
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE, **kwargs: Any,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.concurrency = concurrency
        self.shutdown_grace = shutdown_grace
        self._local = threading.local()
        self._slots = threading.Semaphore(concurrency)
        self._tasks: queues.SimpleQueue[tuple[Job, Queue] | None] = queues.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        #: job id -> job, for the jobs whose thread has not finished them
        self._in_flight: dict[str, Job] = {}
        #: job id -> the ident of the thread running it; the jobs asked to stop (rq's stop-job)
        self._job_threads: dict[str, int] = {}
        self._stopped_jobs: set[str] = set()
        #: whether a stop request may interrupt the main thread where it is (waiting for a job)
        self._interruptible = False
        #: the state last sent to Redis on its own, and when (monotonic)
        self._state_sent: tuple[str | None, float] = (None, 0.0)
        #: held while a state is chosen and, for a job's start, sent; the ident of the thread in
        #: rq's suspension loop while it is there (it writes "suspended" once, then sleeps)
        self._state_lock = threading.RLock()
        self._suspended_in: int | None = None
        #: when the worker last asked Redis whether workers are suspended (monotonic), whether it
        #: let the last chance go by (asked less than a second before), and whether it is a burst
        self._suspension_checked = float("-inf")
        self._suspension_skipped = False
        self._burst = False
        #: jobs taken from the queue with the one before, each with its thread's slot already held
        self._prefetched: collections.deque[tuple[Job, Queue]] = collections.deque()
        #: job id -> its execution, for the jobs whose start rq's bookkeeping has recorded already
        self._started_together: dict[str, Execution] = {}
        #: jobs ended well, waiting for the thread that records their ends together (_end_together)
        self._ends: queues.SimpleQueue[_End | None] = queues.SimpleQueue()
        self._ends_thread: threading.Thread | None = None
        #: whether the Redis client is the worker's own (_bound_redis_connections)
        self._own_redis = False
        super().__init__(*args, **kwargs)
        self._bound_redis_connections()
        http.set_max_connections(max(50, concurrency))
        journal.release_connection_before_model()


    def _bound_redis_connections(self) -> None:
        """Have the threads wait for one of ``REDIS_CONNECTIONS`` Redis connections rather than
        open one each: redis-py's own pool refuses its 101st at once ("Too many connections"),
        which a burst of jobs, each starting in its thread (rq's bookkeeping), reached; and a
        Redis server need not hold a connection per run in flight. The worker makes a client of
        its own for that (the client it was given, which other code may share, keeps its pool),
        and its queues use it."""
        pool = self.connection.connection_pool
        if type(pool) is ConnectionPool:  # not a Sentinel's, a cluster's or one of the project's own
            own = Redis(connection_pool=BlockingConnectionPool(
                connection_class=pool.connection_class, max_connections=REDIS_CONNECTIONS, timeout=REDIS_WAIT,
                **pool.connection_kwargs,
            ))  # fmt: skip
            self.connection = own
            self._own_redis = True
            self.queues = [self._on(queue, own) for queue in self.queues]
            self._ordered_queues = self.queues[:]
        elif getattr(pool, "max_connections", REDIS_CONNECTIONS) < REDIS_CONNECTIONS and not isinstance(
            pool, BlockingConnectionPool
        ):
            log.warning(
                "worker %s: its Redis connection pool (%s) opens %d connections at most and refuses more: "
                "with %d runs in flight, use a BlockingConnectionPool", self.name, type(pool).__name__,
                pool.max_connections, self.concurrency,
            )  # fmt: skip

    @staticmethod
    def _on(queue: Queue, connection: Any) -> Queue:
        """A copy of ``queue`` on ``connection`` (the one given is the caller's, left as it is)."""
        if queue.connection is connection:
            return queue
        copied = copy.copy(queue)
        copied.connection = connection
        return copied

    # rq keeps the job being run on the worker (``self.execution``): here one per thread.
    @property
    def execution(self) -> Execution | None:
        return getattr(self._local, "execution", None)

    @execution.setter
    def execution(self, value: Execution | None) -> None:
        self._local.execution = value

    def in_flight(self) -> list[str]:
        with self._lock:
            return sorted(self._in_flight)

    # --- taking jobs -----------------------------------------------------------------------------

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        while True:
            result = self._dequeue(timeout, max_idle_time)
            if result is not None or timeout is not None or self._stop_requested:
                return result
            # A burst with the queues empty: it ends only once no job is in flight, since one that
            # ends may enqueue more (its dependents, its retry), as rq's workers do (they run one
            # job at a time, and look at the queues after it).
            self._interruptible = True
            try:
                with self._lock:
                    if not self._in_flight:
                        return None
                    self._done.wait(BUSY_HEARTBEAT)
            finally:
                self._interruptible = False
            self.heartbeat()

    def _dequeue(self, timeout: int | None, max_idle_time: int | None) -> Any:
        if self._prefetched and not self._stop_requested:
            return self._prefetched.popleft()  # its slot was taken with it
        if not self._wait_for_slot():
            return None
        self._interruptible = True
        try:
            result = None
            if self._suspension_skipped and timeout is not None and not self._stop_requested:
                # It did not ask about a suspension before this job (it asked less than a second
                # ago): take one only if one is there, and ask before waiting for one.
                result = super().dequeue_job_and_maintain_ttl(None, max_idle_time)
                if result is None:
                    self._suspension_checked = float("-inf")
                    self.check_for_suspension(self._burst)
            if result is None and not self._stop_requested:
                waited = time.monotonic()
                result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
                if time.monotonic() - waited > 0.05:
                    # It waited for this job: ask about a suspension before the next, as rq does
                    # (an `rq suspend` sent while it waited stops it after this one job).
                    self._suspension_checked = float("-inf")
        except BaseException:
            self._slots.release()
            raise
        finally:
            self._interruptible = False
        if result is None:
            self._slots.release()
        else:
            self._prefetch(result[1])
            if self._prefetched:
                self._start_together([result, *self._prefetched])
        return result

    def _prefetch(self, queue: Queue) -> None:
        """Take more of ``queue``'s jobs, one per free thread (``PREFETCH`` at most), in two round
        trips (their ids, moved as rq moves them to the queue's intermediate list; then their
        hashes) instead of two each: taking hundreds of jobs a second, the main thread otherwise
        waits for the interpreter's lock on each reply while the runs' threads hold it. Only with
        one queue (rq's own order across several is kept by taking their jobs one at a time)."""
        version = self.get_redis_server_version()
        if len(self._ordered_queues) != 1 or self._stop_requested or version < (6, 2, 0):
            return
        slots = 0
        while slots < PREFETCH and self._slots.acquire(blocking=False):
            slots += 1
        if not slots:
            return
        ids: list[str] = []
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                for _ in range(slots):
                    pipe.lmove(queue.key, queue.intermediate_queue_key)
                ids = [as_text(job_id) for job_id in pipe.execute() if job_id is not None]
            jobs = self.job_class.fetch_many(ids, connection=self.connection, serializer=self.serializer)
        except RedisError:
            # The job already taken goes on; any taken here and not run are rq's (its maintenance
            # fails a job stuck in the intermediate list) and the reconciler's (a queued run).
            log.warning("worker %s: could not take more jobs at once", self.name, exc_info=True)
            jobs = []
        for _ in range(slots - sum(job is not None for job in jobs)):
            self._slots.release()
        for job in jobs:
            if job is None:
                continue  # deleted meanwhile: passed over, as rq's dequeue does
            job.redis_server_version = version
            self.log.info("Worker %s: %s: %s", self.name, queue.name, job.id)
            self._prefetched.append((job, queue))

    def _start_together(self, jobs: list[tuple[Job, Queue]]) -> None:
        """Record the start of jobs taken together in one round trip: what rq records before each
        job in two (its execution, ``prepare_execution``; its start, ``prepare_job_execution``),
        which their threads, all starting at once, otherwise made one by one, each waiting for
        the interpreter's lock on its replies. If it fails, each thread records its own, as rq."""
        executions: dict[str, Execution] = {}
        try:
            with self.connection.pipeline() as pipe:
                longest = 0
                for job, queue in jobs:
                    ttl = self.get_heartbeat_ttl(job)
                    longest = max(longest, ttl)
                    executions[job.id] = Execution.create(job, ttl, pipeline=pipe, worker_name=self.name)
                    job.heartbeat(now(), ttl, pipeline=pipe)
                    job.prepare_for_execution(self.name, pipeline=pipe)
                    pipe.lrem(queue.intermediate_queue_key, 1, job.id)
                    pipe.persist(job.key)  # what rq's Job.perform does first, in the job's thread
                self.set_current_job_id(jobs[-1][0].id, pipeline=pipe)
                self.set_current_job_working_time(0, pipeline=pipe)
                self.set_state(WorkerStatus.BUSY, pipeline=pipe)
                self.heartbeat(longest, pipeline=pipe)
                pipe.execute()
        except RedisError:
            log.warning("worker %s: could not record the start of %d jobs at once", self.name, len(jobs), exc_info=True)
            return
        self._started_together.update(executions)
        for job, _queue in jobs:
            if type(job).perform is RqJob.perform:  # its key is persisted: its thread need not
                job.perform = _perform_persisted.__get__(job)  # type: ignore[method-assign]

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        if self._started_together.pop(job.id, None) is not None:
            return  # recorded with the jobs taken with it (_start_together)
        super().prepare_job_execution(job, remove_from_intermediate_queue)

    def _return_prefetched(self) -> None:
        """Put the jobs taken and not handed to a thread back at the front of their queue, in
        their order, as queued jobs again."""
        while self._prefetched:
            job, queue = self._prefetched.pop()
            execution = self._started_together.pop(job.id, None)
            try:
                with self.connection.pipeline() as pipe:
                    if execution is not None:  # out of the started registry, queued again
                        execution.delete(job=job, pipeline=pipe)
                        job.set_status(JobStatus.QUEUED, pipeline=pipe)
                        if job.ttl:  # its key was persisted with its start: a queued job's TTL again
                            pipe.expire(job.key, job.ttl)
                    else:
                        pipe.lrem(queue.intermediate_queue_key, 1, job.id)
                    queue.push_job_id(job.id, pipeline=pipe, at_front=True)
                    pipe.execute()
            except RedisError:
                log.warning("worker %s: job %s could not be put back on its queue", self.name, job.id, exc_info=True)
            self._slots.release()

    def _wait_for_slot(self) -> bool:
        """Wait until a thread is free (heartbeating meanwhile); False if a stop came first."""
        self._interruptible = True
        try:
            while not self._slots.acquire(timeout=BUSY_HEARTBEAT):
                if self._stop_requested:
                    return False
                self.heartbeat()
        finally:
            self._interruptible = False
        if self._stop_requested:
            self._slots.release()
            return False
        return True

    def execute_job(self, job: Job, queue: Queue) -> None:
        # The main thread only takes jobs: rq's bookkeeping of each (its execution, its start) is
        # done in the job's thread, so that taking the next job waits for nothing but Redis.
        try:
            with self._lock:
                self._in_flight[job.id] = job
                # A thread per job in flight, made as they are first needed (at most concurrency:
                # the slots bound the jobs in flight), then kept.
                if len(self._threads) < len(self._in_flight):
                    self._start_thread()
            self._tasks.put((job, queue))
        except BaseException:
            with self._lock:
                self._in_flight.pop(job.id, None)
            self._slots.release()
            raise

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        super().bootstrap(*args, **kwargs)
        # Every thread is started now, before any job: started as jobs come, each start waits
        # for the new thread to get the interpreter's lock, which the runs already going hold,
        # and the jobs behind it wait too (a burst of 500 jobs took seconds to start).
        with self._lock:
            while len(self._threads) < self.concurrency:
                self._start_thread()
            if self._ends_thread is None or not self._ends_thread.is_alive():
                self._ends_thread = threading.Thread(target=self._record_ends, daemon=True, name="nexo-job-ends")
                self._ends_thread.start()

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._serve, daemon=True, name=f"nexo-run-{len(self._threads)}")
        self._threads.append(thread)
        thread.start()

    def _serve(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            job, queue = task
            with self._lock:
                self._job_threads[job.id] = threading.get_ident()
                # rq's stop-job that came after the job was taken, before this thread had it
                # (stop_job found no thread to raise into): the job stops as it would have here.
                if job.id in self._stopped_jobs and not _is_run_job(job):
                    job.perform = _stopped_before_it_ran.__get__(job)  # type: ignore[method-assign]
            try:
                execution = self._started_together.get(job.id)
                if execution is None:
                    self.prepare_execution(job)  # this thread's execution (self.execution)
                else:
                    self.execution = execution
                self.perform_job(job, queue)
            except BaseException:  # rq records the job's own failures; this is rq's bookkeeping failing
                log.exception("worker %s: job %s could not be finished", self.name, job.id)
                # As rq's Worker does when its work horse fails: the job is failed, not left started.
                try:
                    self.handle_job_failure(job, queue=queue, exc_string=traceback.format_exc())
                except Exception:
                    log.exception("worker %s: job %s could not be filed as failed either", self.name, job.id)
            finally:
                self.execution = None
                self._forget_stop(job)
                # A finished run holds no connection: the next job of this thread opens its own.
                for conn in connections.all(initialized_only=True):
                    conn.close()
                with self._lock:
                    self._in_flight.pop(job.id, None)
                    self._job_threads.pop(job.id, None)
                    self._stopped_jobs.discard(job.id)
                    self._done.notify_all()
                self._slots.release()

    # --- the end of a job ------------------------------------------------------------------------

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        # rq beats the job (one round trip) when it ends, before its success or failure is written:
        # after a success with no callback to run, that beat goes with the success's record.
        if sys.exc_info()[0] is None and job.success_callback is None:
            job.ended_at = job.last_heartbeat = now()
            self._local.beat = heartbeat_ttl
            return
        self._local.beat = None
        super().handle_execution_ended(job, queue, heartbeat_ttl)

    def _beat_now(self, job: Job) -> None:
        """Send the job's end beat put off by ``handle_execution_ended``, if any."""
        beat: int | None = getattr(self._local, "beat", None)
        self._local.beat = None
        if beat is not None:
            job.heartbeat(job.last_heartbeat or now(), beat)

    def handle_job_retry(self, job: Job, queue: Queue, *args: Any, **kwargs: Any) -> None:
        self._beat_now(job)
        super().handle_job_retry(job, queue, *args, **kwargs)

    def handle_job_success(self, job: Job, queue: Queue, started_job_registry: Any) -> None:
        """rq's record of a job's success (its dependents enqueued, its result, the finished
        registry, out of the started one, the worker's counts), made for the jobs that end at the
        same moment in one transaction by one thread (``_record_ends``) rather than in four round
        trips by each job's thread (its end beat; WATCH, the dependents, MULTI/EXEC). A job with
        dependents to enqueue, to repeat, or whose result is not kept is recorded by its own
        thread, by rq's code, as is every job when that thread is not running."""
        result_ttl = job.get_result_ttl(self.default_result_ttl)
        ends = self._ends_thread
        if result_ttl != 0 and not job.repeats_left and ends is not None and ends.is_alive():
            end = _End(job, self.execution, result_ttl, getattr(self._local, "beat", None))
            self._ends.put(end)
            end.done.acquire()  # released once it is recorded, or handed back
            if not end.own:  # its beat went with its record
                self._local.beat = None
                self.execution = None
                time_taken = job.ended_at - job.started_at  # type: ignore[operator]
                if self.log_job_description:
                    self.log.info("Successfully completed %s job in %ss on worker %s", job.description, time_taken, self.name)
                else:
                    self.log.info("Successfully completed job %s in %ss on worker %s", job.id, time_taken, self.name)
                return
        self._beat_now(job)
        super().handle_job_success(job, queue, started_job_registry)

    def _record_ends(self) -> None:
        """The thread that records the jobs' successes: all those waiting, in one transaction."""
        while True:
            end = self._ends.get()
            if end is None:
                return
            batch = [end]
            stop = False
            while len(batch) < PREFETCH:
                try:
                    more = self._ends.get_nowait()
                except queues.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.append(more)
            try:
                self._end_together(batch)
            except Exception:  # Redis unreachable, or a job that cannot be saved: each thread tries, as rq
                log.warning("worker %s: could not record the end of %d jobs at once", self.name, len(batch), exc_info=True)
                for end in batch:
                    end.own = True
            finally:
                for end in batch:
                    end.done.release()
            if stop:
                return

    def _end_together(self, batch: list[_End]) -> None:
        """What rq's ``handle_job_success`` writes, for every job of ``batch`` in one MULTI/EXEC,
        under the WATCH of their dependents' sets (as rq's: a dependent added meanwhile makes it
        start again); a job that has dependents is marked ``own``, for its thread to record."""
        keys = [end.job.dependents_key for end in batch]
        with self.connection.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(*keys)
                    with self.connection.pipeline(transaction=False) as reads:
                        for key in keys:
                            reads.scard(key)
                        counts = reads.execute()
                    pipe.multi()
                    for end, dependents in zip(batch, counts, strict=True):
                        end.own = bool(dependents)
                        if end.own:
                            continue
                        job = end.job
                        run_job = job.func_name == dispatch.JOB_FUNC
                        if end.beat is not None and not run_job:
                            job.heartbeat(job.last_heartbeat or now(), end.beat, pipeline=pipe)
                        self.increment_successful_job_count(pipeline=pipe)
                        self.increment_total_working_time(job.ended_at - job.started_at, pipe)  # type: ignore[operator]
                        execution = end.execution
                        success = _run_job_success if run_job else type(job)._handle_success
                        success(
                            job, end.result_ttl, pipeline=pipe, worker_name=self.name,
                            execution_id=execution.id if execution else None,
                            execution_started_at=execution.created_at if execution else None,
                            execution_ended_at=job.ended_at,
                        )  # fmt: skip
                        job.cleanup(end.result_ttl, pipeline=pipe, remove_from_queue=False)
                        if execution is not None:
                            execution.delete(job=job, pipeline=pipe)
                    self.set_current_job_id(None, pipeline=pipe)
                    pipe.execute()
                    return
                except WatchError:
                    continue

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        # rq beats before and after every job it takes; taking hundreds a second, once a second is
        # plenty (the key lives worker_ttl + 60 seconds). A beat with a TTL or in a pipeline (a
        # job's start) is always sent.
        last = self.last_heartbeat
        if timeout is None and pipeline is None and last is not None and (now() - last).total_seconds() < 1.0:
            return
        super().heartbeat(timeout, pipeline)

    def set_state(self, state: str, pipeline: Any = None) -> None:
        with self._state_lock:
            me = threading.get_ident()
            if self._suspended_in is not None and me != self._suspended_in:
                # Suspended: a job's thread recording its start ("busy") leaves "suspended" as it
                # is. rq's worker records a start before it next asks about a suspension; here
                # the job's thread can do it after the main thread went into the loop.
                return
            if state == WorkerStatus.SUSPENDED and pipeline is None:
                self._suspended_in = me
            elif me == self._suspended_in:
                self._suspended_in = None  # out of the loop (it restores the state before it)
            # Listening for the next job while runs are in flight is still busy, for rq's dashboard.
            if state == WorkerStatus.IDLE and self._in_flight:
                state = WorkerStatus.BUSY
            # rq sets the state around every job it takes: the same state again within a second is
            # not sent (a pipeline's, part of a job's start or end, always is).
            sent = time.monotonic()
            if pipeline is None and state == self._state_sent[0] and sent - self._state_sent[1] < 1.0:
                return
            super().set_state(state, pipeline=pipeline)
            if pipeline is None:
                self._state_sent = (state, sent)

    def prepare_execution(self, job: Job) -> Execution:
        # In the job's thread (rq's main thread does it before it next asks about a suspension):
        # under the state's lock, so that its "busy", sent in its pipeline, cannot land after the
        # suspension loop's "suspended".
        with self._state_lock:
            return super().prepare_execution(job)

    def check_for_suspension(self, burst: bool) -> None:
        # rq asks Redis (with a heartbeat) before every job it takes: taking hundreds a second
        # back to back, once a second is enough for `rq suspend` to be obeyed (after a job it
        # waited for, it asks at once).
        self._burst = burst
        self._suspension_skipped = time.monotonic() - self._suspension_checked < 1.0
        if self._suspension_skipped:
            return
        super().check_for_suspension(burst)
        self._suspension_checked = time.monotonic()

    # --- stopping --------------------------------------------------------------------------------

    def subscribe(self) -> None:
        # rq's, with a short wait for each read of the channel (PUBSUB_WAIT): a command still
        # arrives at once, and unsubscribe() no longer waits up to a minute for the thread.
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]  # rq declares it None
            sleep_time=PUBSUB_WAIT, daemon=True, exception_handler=self._pubsub_exception_handler
        )

    def handle_payload(self, message: Any) -> None:
        """rq's commands (``rq.command``): ``stop-job`` stops that job if it is in flight here,
        whichever thread runs it (rq's own handler looks at one current job only). ``shutdown``
        and ``kill-horse`` are rq's (a warm shutdown; no work horse to kill)."""
        from rq.command import parse_payload

        payload = parse_payload(message)
        if payload.get("command") == "stop-job":
            self.stop_job(str(payload.get("job_id")))
            return
        super().handle_payload(message)

    def stop_job(self, job_id: str) -> bool:
        """Stop a job in flight: a run's job at the run's next commit (the run fails, ``JobStopped``,
        and can be retried), any other job at its next Python instruction in its own thread, or
        before it runs if no thread has it yet. rq files the job as stopped, in its failed
        registry. False if it is not in flight here."""
        with self._lock:
            job = self._in_flight.get(job_id)
            ident = self._job_threads.get(job_id)
            if job is None:  # taken with others and not handed to a thread yet (started, in rq's view)
                job = next((taken for taken, _ in list(self._prefetched) if taken.id == job_id), None)
            if job is None:
                self.log.info("Worker %s: not working on job %s, command ignored", self.name, job_id)
                return False
            self._stopped_jobs.add(job_id)
        self.log.info("Worker %s: stopping job %s", self.name, job_id)
        if _is_run_job(job):
            journal.stop_run_at_next_commit(str(job.args[0]))
        elif ident is not None:
            _async_raise(ident, JobStopped)
        return True

    def _forget_stop(self, job: Job) -> None:
        """After a job: a stop asked for it and not used is dropped (not raised later, elsewhere)."""
        with self._lock:
            asked = job.id in self._stopped_jobs
        if asked:
            _async_raise(threading.get_ident(), None)
            if _is_run_job(job):
                journal._stop_runs.discard(str(job.args[0]))

    def handle_job_failure(self, job: Job, queue: Queue, started_job_registry: Any = None, exc_string: str = "") -> None:
        with self._lock:
            stopped = job.id in self._stopped_jobs
            self._stopped_jobs.discard(job.id)
            if stopped:  # rq's mark of a job stopped on purpose (one at a time: under the lock)
                self._stopped_job_id = job.id
            super().handle_job_failure(job, queue, started_job_registry, exc_string)

    def _shutdown(self) -> None:
        """A warm shutdown: take no more jobs, and have every run in flight stop at its next commit
        (it goes back to the queue there). The main thread is interrupted only while it waits for a
        job, never while it hands one to a thread."""
        self._stop_requested = True
        journal.stop_at_next_commit()
        if self._in_flight:
            self.set_shutdown_requested_date()
        if self.scheduler:
            self.stop_scheduler()
        if self._interruptible:
            raise StopRequested()

    def teardown(self) -> None:
        try:
            self._return_prefetched()
            left = self._drain(self.shutdown_grace if self._stop_requested else None)
            if not left:
                # Each thread was told to end: wait for it, and forget it, so that work() called
                # again starts threads anew (counted and not running, they took jobs for ever).
                for thread in [*self._threads, *([self._ends_thread] if self._ends_thread else [])]:
                    thread.join(BUSY_HEARTBEAT)
                with self._lock:
                    self._threads = [thread for thread in self._threads if thread.is_alive()]
        finally:
            super().teardown()
            if self._own_redis:
                # Its own pool's connections, closed now rather than left to the garbage
                # collector (work() called again opens them anew).
                self.connection.connection_pool.disconnect()
        if left:
            # Runs still in flight must not see the interpreter shut down under them (a closed
            # HTTP client would fail a healthy run): the process ends here as a lost machine
            # would, and their leases hand them to the reconciler.
            log.warning("worker %s: %d run(s) still in flight after %.0f s; leaving them to the reconciler: %s",
                        self.name, len(left), self.shutdown_grace, ", ".join(left))
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    def _drain(self, timeout: float | None) -> list[str]:
        """Wait for the jobs in flight (at most ``timeout`` seconds); the ids of those left."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._in_flight:
                wait = BUSY_HEARTBEAT if deadline is None else min(BUSY_HEARTBEAT, deadline - time.monotonic())
                if wait <= 0:
                    break
                self._done.wait(wait)
            left = sorted(self._in_flight)
            if not left:
                for _ in self._threads:
                    self._tasks.put(None)
                self._ends.put(None)
        return left
