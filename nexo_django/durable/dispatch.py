"""The only module that talks to django-rq. Jobs carry ids only and are sent at commit."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.db import transaction
from django.utils.module_loading import import_string

from ..conf import nexo_settings
from ..core.errors import ConfigurationError

JOB_FUNC = "nexo_django.durable.jobs.continue_run"
#: what an inline queue calls at commit, in the caller's process (by name, as rq names its jobs)
INLINE_FUNC = "nexo_django.durable.runs.execute_run"

log = logging.getLogger("nexo_django.dispatch")


def queue_name() -> str:
    return str(nexo_settings.QUEUE)


def queue_config(name: str | None = None) -> dict[str, Any]:
    name = name or queue_name()
    queues = getattr(settings, "RQ_QUEUES", None) or {}
    if name not in queues:
        raise ConfigurationError(
            f'NEXO["QUEUE"] is {name!r} but RQ_QUEUES has no such queue; add it to RQ_QUEUES '
            'or set NEXO["QUEUE"] to one of: ' + ", ".join(sorted(queues))
        )
    return dict(queues[name])


def is_inline(name: str | None = None) -> bool:
    """A queue with ``"ASYNC": False`` runs jobs in this process at commit, with no Redis."""
    return queue_config(name).get("ASYNC", True) is False


def job_id(run_id: Any, generation: int) -> str:
    return f"nexo-run-{run_id}-{generation}"


def enqueue_run(run_id: Any, generation: int, *, at: datetime | None = None) -> None:
    """Wake a worker for the run when the current transaction commits (with ``at``: put its job in
    rq's scheduled job registry, for a worker's scheduler to move to the queue then). Redis being
    unreachable then is logged, not raised: the run is committed as queued and the reconciler
    sends its job again (the caller gets the committed state, not an error about a wake-up)."""
    transaction.on_commit(lambda: send_or_log(str(run_id), generation, at=at))


#: Runs whose last wake-up from this process could not be sent: run id -> why. A page that just
#: woke a run says so instead of promising a worker (bounded: the oldest are dropped).
_unsent: dict[str, str] = {}
UNSENT_KEPT = 1000


def unsent(run_id: Any) -> str | None:
    """Why the last job this process sent for ``run_id`` did not reach Redis, or None if it did
    (or none was sent)."""
    return _unsent.get(str(run_id))


def send_or_log(run_id: str, generation: int, *, at: datetime | None = None) -> bool:
    from redis.exceptions import RedisError

    try:
        send(run_id, generation, at=at)
    except (RedisError, OSError) as exc:
        log.warning("run %s: its job could not be sent (%s: %s); the reconciler will send it again",
                    run_id, type(exc).__name__, exc)
        if len(_unsent) >= UNSENT_KEPT:
            _unsent.pop(next(iter(_unsent)), None)
        _unsent[run_id] = f"{type(exc).__name__}: {exc}"
        return False
    _unsent.pop(run_id, None)
    return True


def send(run_id: str, generation: int, *, at: datetime | None = None) -> None:
    if is_inline():
        # In the caller's process: not a job of a worker, so its connections are left alone.
        import_string(INLINE_FUNC)(run_id)
        return
    options: dict[str, Any] = {
        "job_id": job_id(run_id, generation), "job_timeout": int(nexo_settings.JOB_TIMEOUT), "result_ttl": 3600,
        "failure_ttl": 7 * 24 * 3600, "description": f"nexo run {run_id}",
    }
    if at is not None:
        # rq keeps a scheduled job's time in whole seconds, cut down (ScheduledJobRegistry: timegm):
        # the next whole second, so that a run is never moved to its queue before its time.
        if at.microsecond:
            at = at.replace(microsecond=0) + timedelta(seconds=1)
        get_queue().enqueue_at(at, JOB_FUNC, run_id, **options)
        return
    options["timeout"] = options.pop("job_timeout")
    get_queue().enqueue_call(func=JOB_FUNC, args=(run_id,), **options)


_queues: dict[tuple[str, str], Any] = {}


def get_queue() -> Any:
    """The run queue, kept per process: django-rq opens a new Redis connection per call."""
    name = queue_name()
    key = (name, repr(sorted(queue_config(name).items())))
    queue = _queues.get(key)
    if queue is None:
        import django_rq

        queue = _queues[key] = django_rq.get_queue(name)
    return queue


def make_worker(queues: list[str], worker_class: type, **kwargs: Any) -> Any:
    """An rq worker of ``worker_class`` on ``queues``, built as django-rq builds ``rqworker``'s
    (its Redis connection, job and queue classes, exception handlers from settings)."""
    import django_rq

    return django_rq.get_worker(*queues, worker_class=worker_class, **kwargs)


def _forget_queues(*, setting: str, **kwargs: Any) -> None:
    if setting in ("RQ_QUEUES", "NEXO"):
        _queues.clear()


setting_changed.connect(_forget_queues, dispatch_uid="nexo_django.dispatch.forget_queues")


def job_exists(run_id: Any, generation: int) -> bool:
    """Whether Redis still holds the run's current job (False for inline queues)."""
    return job_status(run_id, generation) is not None



def job_status(run_id: Any, generation: int) -> str | None:
    """The rq status of the run's current job (``"failed"`` when its work horse died), or None
    when Redis holds no such job (always None for inline queues)."""
    if is_inline():
        return None
    from rq.exceptions import NoSuchJobError
    from rq.job import Job

    queue = get_queue()
    try:
        status = Job.fetch(job_id(run_id, generation), connection=queue.connection).get_status()
    except NoSuchJobError:
        return None
    return str(status.value if hasattr(status, "value") else status) if status is not None else None


#: Seconds to wait for Redis when only looking at workers (a check, a page): never hang on it.
PROBE_TIMEOUT = 2.0


def redis_with_timeout(seconds: float, name: str | None = None, *, retries: bool = True) -> Any:
    """A client of queue ``name``'s Redis (the run queue's by default: the address and options
    of django-rq's connection) on a pool of its own, whose connects and reads wait at most
    ``seconds``; with ``retries`` false each command is tried once. The caller disconnects it
    (``client.connection_pool.disconnect()``) when it is done with it."""
    import django_rq
    from redis import ConnectionPool, Redis

    pool = django_rq.get_connection(name or queue_name()).connection_pool
    options = {**pool.connection_kwargs, "socket_connect_timeout": seconds, "socket_timeout": seconds}
    if not retries:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        options["retry"] = Retry(NoBackoff(), 0)
    return Redis(connection_pool=ConnectionPool(connection_class=pool.connection_class, **options))


def workers_listening(name: str | None = None) -> list[str] | None:
    """Names of the live rq workers that listen on queue ``name`` (the run queue by default);
    None for an inline queue, which needs no worker. Raises ``ConnectionError`` (the built-in)
    when Redis cannot be reached within :data:`PROBE_TIMEOUT` seconds."""
    name = name or queue_name()
    if is_inline(name):
        return None
    from redis import RedisError
    from rq import Queue, Worker

    redis = redis_with_timeout(PROBE_TIMEOUT, name)
    try:
        # Worker.all drops registrations whose worker key expired (a worker killed without cleanup).
        names = sorted(w.name for w in Worker.all(queue=Queue(name, connection=redis)))
        if not names:
            names = _unregistered_live_workers(redis, Worker.redis_worker_namespace_prefix, Worker.redis_workers_keys)
    except RedisError as exc:
        raise ConnectionError(f"Redis of queue {name!r} cannot be reached: {exc}") from exc
    finally:
        redis.connection_pool.disconnect()
    return names


#: Worker keys looked at, at most, for workers whose registration Redis lost.
UNREGISTERED_SCAN = 1000


def _unregistered_live_workers(redis: Any, prefix: str, registry: str) -> list[str]:
    """Live rq workers whose registration Redis lost: after a restart without persistence the
    sets that say which worker listens on which queue are gone, while each live worker's next
    heartbeat writes its own key again (``last_heartbeat``, with a TTL), without its queues and
    without a death. Their queue cannot be told, so they count as listening: better no warning
    than a false "no worker listens" while they take jobs."""
    registered = {key.decode() if isinstance(key, bytes) else key for key in redis.smembers(registry)}
    found: list[str] = []
    for n, key in enumerate(redis.scan_iter(match=f"{prefix}*", count=100)):
        if n >= UNREGISTERED_SCAN:
            break
        key = key.decode() if isinstance(key, bytes) else key
        if key in registered:
            continue  # registered, on other queues: Worker.all saw it
        queues, death, heartbeat = redis.hmget(key, "queues", "death", "last_heartbeat")
        if queues is None and death is None and heartbeat is not None:
            found.append(key[len(prefix):])
    return sorted(found)


def job_pending(run_id: Any, generation: int) -> bool:
    """Whether the run's current job still waits in its queue for a worker (False for inline
    queues). A job that a worker took (``started``: the worker may have been killed since),
    that failed (the database was down) or that Redis lost will never claim the run."""
    if is_inline():
        return False
    from rq.job import Job

    queue = get_queue()
    jid = job_id(run_id, generation)
    if queue.connection.hget(Job.key_for(jid), "status") not in (b"queued", "queued"):
        return False
    # Queued, and still in the queue's list (not taken into a worker's hands: rq's intermediate
    # queue, where a worker killed at that moment leaves it).
    return queue.get_job_position(jid) is not None


#: what delivers notices of the outbox (``durable/outbox.py``), by name
NOTICES_JOB_FUNC = "nexo_django.durable.jobs.deliver_notices"
NOTICES_INLINE_FUNC = "nexo_django.durable.outbox.deliver"


def enqueue_notices(keys: list[str]) -> None:
    """Deliver the outbox's notices ``keys`` once the current transaction commits: in this process
    on an inline queue, else by a worker. Redis down is logged, not raised: the notices are
    committed, and the reconciler delivers them."""
    transaction.on_commit(lambda: send_notices_or_log(keys))


def send_notices_or_log(keys: list[str]) -> bool:
    from redis.exceptions import RedisError

    try:
        if is_inline():
            import_string(NOTICES_INLINE_FUNC)(keys)
            return True
        get_queue().enqueue_call(func=NOTICES_JOB_FUNC, args=(keys,), timeout=300, result_ttl=600,
                                 failure_ttl=24 * 3600, description=f"nexo notices ({len(keys)})")
    except (RedisError, OSError) as exc:
        log.warning("outbox: the job of %d notice(s) could not be sent (%s: %s); the reconciler delivers them",
                    len(keys), type(exc).__name__, exc)
        return False
    return True
