"""Live progress: a run's events as they are committed, and the model's text as it is written.

The events are the run's ``RunEvent`` rows: the database is the source of truth and the stream
a reader of it (an event's id is its place: a reader resumes after the last id it saw). What this
module adds is the *wake-up*: a reader sleeps until something may have happened to its run.

- On PostgreSQL a trigger on the events table (migration 0009) sends ``NOTIFY nexo_events`` with
  the run's id when an event row commits, from whatever process wrote it (a worker on another
  machine, the admin). One listening connection per serving process (:class:`Hub`) wakes every
  stream of that run: nothing touches the database while nothing happens.
- Elsewhere (SQLite) the hub polls, one indexed query per interval for every stream of the
  process (the events' primary key: ``id > last``), and only while a stream is open.

The model's text as it is written (deltas) is never stored. It travels by the first of these
that the settings give (:func:`delta_channel`, the same answer in the worker and the page):

- ``"postgresql"``: ``NOTIFY nexo_deltas`` on the database;
- ``"redis"``: ``PUBLISH nexo_deltas`` on the run queue's Redis (every worker of a queue that
  is not inline reaches it, whatever the database), read by one subscription per process;
- ``"process"``: an inline queue runs the run in the process that serves its pages, which hands
  the pieces to that process's streams directly.

A reader that missed some gets the finished message from the transcript, as every reader does.

Per run, event ids are in commit order: every writer of a run's events holds the run's row lock
from before it inserts them until it commits (the journal's fenced batch, a decision's
``lock_first``, a cancel's compare-and-set, a person settling an unknown outcome), so a reader
after id N never misses a later commit with a smaller id.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections, router

from ..models import TERMINAL_RUN_STATUSES, AgentRun, RunEvent, RunStatus
from . import dispatch, live_text

log = logging.getLogger("nexo_django.live")

#: The channels: a run's events committed (PostgreSQL; payload: the run id), and text deltas
#: (PostgreSQL or Redis; payload: JSON ``{"run": id, "turn": n, "attempt": k, "text": "..."}``).
EVENTS_CHANNEL = "nexo_events"
DELTAS_CHANNEL = "nexo_deltas"
#: NOTIFY payloads are at most 8000 bytes; a longer delta is sent in pieces.
DELTA_CHARS = 1500
#: Seconds a worker waits for Redis to take a delta; after a failure it sends none for
#: :data:`REDIS_PAUSE` seconds (live text never slows a run down).
REDIS_TIMEOUT = 1.0
REDIS_PAUSE = 5.0
#: How often the polling hub looks (seconds), while a stream is open.
POLL_INTERVAL = 0.25


def _alias() -> str:
    return router.db_for_read(RunEvent)


def uses_notify() -> bool:
    return bool(connections[_alias()].vendor == "postgresql")


def delta_channel() -> str:
    """How the model's text travels from a run to its pages: ``"postgresql"``, ``"redis"`` or
    ``"process"`` (see the module's docstring)."""
    if uses_notify():
        return "postgresql"
    try:
        return "process" if dispatch.is_inline() else "redis"
    except Exception:  # a misnamed queue: the checks and the run say so; no text travels far
        return "process"


def publish_delta(run_id: Any, turn: int, attempt: int, text: str) -> None:
    """Tell the readers of ``run_id`` that the model wrote ``text`` (part of turn ``turn``), by
    :func:`delta_channel`. Never raises: live text is a courtesy, the transcript is the record."""
    if not text:
        return
    pieces = [text[start : start + DELTA_CHARS] for start in range(0, len(text), DELTA_CHARS)]
    payloads: list[dict[str, Any]] = [
        {"run": str(run_id), "turn": turn, "attempt": attempt, "text": piece} for piece in pieces
    ]
    # Kept for a page opened mid-turn (in this process for an inline queue, else on the queue's
    # Redis); each piece says where it ends in the kept text.
    if live_text.in_process():
        end = live_text.keep_here(run_id, turn, attempt, text)
    else:
        end = _redis_publisher.keep(run_id, turn, attempt, text)
    if end is not None:
        at = end - live_text.size(text)
        for payload, piece in zip(payloads, pieces, strict=True):
            at += live_text.size(piece)
            payload["end"] = at
    channel = delta_channel()
    if channel == "postgresql":
        _notifier.send(payloads)
    elif channel == "redis":
        _redis_publisher.publish([json.dumps(payload) for payload in payloads])
    else:
        for found in list(_hubs.values()):
            found.wake_from_thread(str(run_id), payloads)


def deltas_sent(timeout: float = 1.0) -> None:
    """Wait (``timeout`` seconds at most) until the deltas this process handed over so far are
    sent: a run calls it before it commits the finished message, so that a reader gets the text
    before the event that ends it (NOTIFYs of two connections reach a listener in commit order)."""
    if _notifier.thread is not None:
        _notifier.wait_sent(timeout)


def _psycopg_params() -> dict[str, Any]:
    """psycopg's connection parameters of the events' database, for a connection of our own."""
    params = dict(connections[_alias()].get_connection_params())
    for key in ("context", "cursor_factory", "prepare_threshold"):
        params.pop(key, None)
    return params


class _Notifier:
    """The ``"postgresql"`` channel's sender: one per process, a thread with a connection of its
    own (autocommit, outside Django's pool), sending every delta waiting in one statement. A run
    hands its deltas over and goes on: streaming takes no connection of the run's, so a run waiting
    on its model holds none (a streaming run held a connection of the pool for its whole answer,
    and ten of them took all of a pool of ten: issue 33). Silent for :data:`REDIS_PAUSE` seconds
    after a failure, as the Redis channel is."""

    #: Deltas waiting at most; past it the oldest are dropped (a reader then gets the message).
    BACKLOG = 10_000
    #: Seconds without a delta after which the connection is closed (a stream sends one every
    #: 0.1 s): a process that streams no more holds none (nor keeps a test database from being
    #: dropped).
    IDLE = 1.0

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.waiting: collections.deque[str] = collections.deque(maxlen=self.BACKLOG)
        #: deltas handed over, and deltas sent (or given up), since the process started
        self.handed = self.done = 0
        self.thread: threading.Thread | None = None
        self.conn: Any = None
        self.paused_until = 0.0

    def send(self, payloads: list[dict[str, Any]]) -> None:
        with self.cond:
            for payload in payloads:
                # NOTIFY folds identical payloads of one transaction into one: each is numbered.
                self.handed += 1
                self.waiting.append(json.dumps({**payload, "n": self.handed}))
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, daemon=True, name="nexo-deltas")
                self.thread.start()
            self.cond.notify_all()

    def wait_sent(self, timeout: float) -> None:
        with self.cond:
            target = self.handed
            self.cond.wait_for(lambda: self.done >= target, timeout)

    def _loop(self) -> None:
        while True:
            with self.cond:
                if not self.cond.wait_for(lambda: bool(self.waiting), self.IDLE if self.conn is not None else None):
                    idle = True
                else:
                    idle = False
                    batch = list(self.waiting)
                    self.waiting.clear()
                    upto = self.handed
            if idle:  # no stream for a while: the connection is closed, not held for nothing
                self._close()
                continue
            try:
                if time.monotonic() >= self.paused_until:
                    self._notify(batch)
            except Exception as exc:  # psycopg.Error, OSError: the runs go on; readers get the messages
                self.paused_until = time.monotonic() + REDIS_PAUSE
                self._close()
                log.debug("%d deltas not sent (none for %s s): %s", len(batch), REDIS_PAUSE, exc)
            with self.cond:
                self.done = upto
                self.cond.notify_all()

    def _notify(self, batch: list[str]) -> None:
        if self.conn is None or self.conn.closed:
            import psycopg

            params = {k: v for k, v in _psycopg_params().items() if k != "connect_timeout"}
            # Never a prepared statement: a transaction-mode pooler may sit between.
            self.conn = psycopg.connect(autocommit=True, connect_timeout=5, prepare_threshold=None, **params)
        # One statement, one transaction: its notifications reach a listener together, in order.
        self.conn.execute("SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", [DELTAS_CHANNEL, batch])

    def _close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


_notifier = _Notifier()


class _RedisPublisher:
    """The worker's side of the Redis channel: its own connection to the queue's Redis, with a
    short timeout and no retry, silent for a while after a failure."""

    def __init__(self) -> None:
        self.client: Any = None
        #: the run queue the client was made for (``dispatch.get_queue`` makes a new one when the
        #: settings change)
        self.queue: Any = None
        self.paused_until = 0.0
        self.lock = threading.Lock()

    def publish(self, payloads: list[str]) -> None:
        try:
            with self.lock:
                client = self._client()
            if time.monotonic() < self.paused_until:
                return
            for payload in payloads:
                client.publish(DELTAS_CHANNEL, payload)
        except Exception as exc:  # redis.RedisError, OSError, a queue that cannot be built
            self.paused_until = time.monotonic() + REDIS_PAUSE
            log.debug("delta not sent to Redis (none for %s s): %s", REDIS_PAUSE, exc)

    def keep(self, run_id: Any, turn: int, attempt: int, text: str) -> int | None:
        """Keep ``text`` as the run's text so far on Redis (``live_text.keep_on``); its end, or
        None (paused, or Redis did not answer: then nothing is sent for a while)."""
        try:
            with self.lock:
                client = self._client()
            if time.monotonic() < self.paused_until:
                return None
            return live_text.keep_on(client, run_id, turn, attempt, text)
        except Exception as exc:  # redis.RedisError, OSError, a queue that cannot be built
            self.paused_until = time.monotonic() + REDIS_PAUSE
            log.debug("run %s: its text so far not kept (nothing sent for %s s): %s", run_id, REDIS_PAUSE, exc)
            return None

    def _client(self) -> Any:
        """The client of the run queue's Redis; a new one (and no pause) when that changed."""
        queue = dispatch.get_queue()
        if self.client is None or self.queue is not queue:
            if self.client is not None:
                self.client.connection_pool.disconnect()
            self.client = dispatch.redis_with_timeout(REDIS_TIMEOUT, retries=False)
            self.queue, self.paused_until = queue, 0.0
        return self.client


_redis_publisher = _RedisPublisher()


def _async_redis() -> Any:
    """A ``redis.asyncio`` client of the run queue's Redis (the same server and options as the
    queue's own connection), for a subscription: no read timeout."""
    import redis.asyncio as aioredis
    from redis import connection as sync

    pool = dispatch.get_queue().connection.connection_pool
    options = {k: v for k, v in pool.connection_kwargs.items() if k != "socket_timeout"}
    if issubclass(pool.connection_class, sync.UnixDomainSocketConnection):
        cls: type = aioredis.UnixDomainSocketConnection
    elif issubclass(pool.connection_class, sync.SSLConnection):
        cls = aioredis.SSLConnection
    else:
        cls = aioredis.Connection
    return aioredis.Redis(connection_pool=aioredis.ConnectionPool(connection_class=cls, **options))


class Subscription:
    """One stream's wake-ups: :meth:`wait` returns ``"events"`` when the run may have new events,
    a delta dict, or ``None`` after ``timeout``."""

    def __init__(self, hub: Hub, run_id: str) -> None:
        self.hub = hub
        self.run_id = run_id
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1000)

    def put(self, item: Any) -> None:
        with contextlib.suppress(asyncio.QueueFull):  # a reader that lags reads the rows anyway
            self.queue.put_nowait(item)

    async def wait(self, timeout: float) -> Any:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return None

    def close(self) -> None:
        self.hub.unsubscribe(self)


class Hub:
    """The wake-ups of one serving process (one event loop): a LISTEN connection on PostgreSQL,
    a poll of the events' primary key otherwise. It runs only while a stream is subscribed."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop
        self.subscribers: dict[str, set[Subscription]] = {}
        self.task: asyncio.Task[None] | None = None
        #: set once the listener listens (or the poller has its starting point)
        self.ready = asyncio.Event()
        #: set once the Redis subscription is live (or failed); only for the Redis channel
        self.deltas_ready = asyncio.Event()
        #: how the model's text reaches this hub (:func:`delta_channel`), read when it starts
        self.channel = "process"

    async def subscribe(self, run_id: Any) -> Subscription:
        """Subscribe, and return once wake-ups flow: a read made after this misses nothing."""
        sub = Subscription(self, str(run_id))
        self.subscribers.setdefault(sub.run_id, set()).add(sub)
        if self.task is None or self.task.done():
            self.ready, self.deltas_ready = asyncio.Event(), asyncio.Event()
            self.task = asyncio.get_running_loop().create_task(self._run())
        await self.ready.wait()
        if self.channel == "redis":
            with contextlib.suppress(TimeoutError):  # Redis away: the events still flow
                await asyncio.wait_for(self.deltas_ready.wait(), REDIS_TIMEOUT * 2)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self.subscribers.get(sub.run_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self.subscribers[sub.run_id]
        if not self.subscribers and self.task is not None:
            self.task.cancel()
            self.task = None

    def _wake(self, run_id: str, item: Any) -> None:
        for sub in list(self.subscribers.get(run_id, ())):
            sub.put(item)

    def _wake_all(self) -> None:
        for run_id in list(self.subscribers):
            self._wake(run_id, "events")

    def wake_from_thread(self, run_id: str, deltas: list[dict[str, Any]]) -> None:
        """Hand deltas written by a run in another thread of this process to the streams of
        ``run_id`` (the ``"process"`` channel)."""
        if run_id not in self.subscribers or self.loop is None or self.loop.is_closed():
            return
        for delta in deltas:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self.loop.call_soon_threadsafe(self._wake, run_id, delta)

    async def _run(self) -> None:
        self.channel = delta_channel()  # settings and the backend's vendor: no query
        try:
            if self.channel == "postgresql":
                await self._listen()
            elif self.channel == "redis":
                await asyncio.gather(self._poll(), self._redis_deltas())
            else:
                await self._poll()
        except asyncio.CancelledError:
            raise
        except Exception:  # e.g. psycopg missing: the streams are woken by polling instead
            log.warning("live progress: cannot listen for notifications; polling instead", exc_info=True)
            self._wake_all()
            await self._poll()

    async def _listen(self) -> None:
        import psycopg  # only on PostgreSQL, where Django's backend needs it anyway

        params = _psycopg_params()
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(autocommit=True, **params)
            except psycopg.Error as exc:
                log.warning("live progress: cannot LISTEN (%s); retrying", exc)
                self.ready.set()
                self._wake_all()
                await asyncio.sleep(1.0)
                continue
            try:
                async with conn:
                    await conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                    await conn.execute(f"LISTEN {DELTAS_CHANNEL}")
                    self.ready.set()
                    # Whatever committed while the connection was down: every stream reads again.
                    self._wake_all()
                    async for note in conn.notifies():
                        if note.channel == EVENTS_CHANNEL:
                            self._wake(note.payload, "events")
                        else:
                            with contextlib.suppress(ValueError, KeyError, TypeError):
                                delta = json.loads(note.payload)
                                self._wake(str(delta["run"]), delta)
            except psycopg.Error as exc:
                log.warning("live progress: the LISTEN connection ended (%s); reconnecting", exc)
                await asyncio.sleep(0.2)

    async def _redis_deltas(self) -> None:
        """The Redis channel's deltas, from one subscription (reconnected when it drops)."""
        from redis.exceptions import RedisError

        while True:
            client = None
            try:
                client = await sync_to_async(_async_redis)()
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(DELTAS_CHANNEL)
                    self.deltas_ready.set()
                    async for message in pubsub.listen():
                        if message.get("type") != "message":
                            continue
                        with contextlib.suppress(ValueError, KeyError, TypeError):
                            delta = json.loads(message["data"])
                            self._wake(str(delta["run"]), delta)
            except (RedisError, OSError) as exc:
                log.warning("live progress: the Redis subscription for the model's text ended (%s); retrying", exc)
                self.deltas_ready.set()
                await asyncio.sleep(1.0)
            except Exception:  # a connection the async client cannot build: the events still flow
                log.warning("live progress: cannot subscribe to Redis for the model's text", exc_info=True)
                self.deltas_ready.set()
                return
            finally:
                if client is not None:
                    with contextlib.suppress(Exception):
                        await client.aclose()

    async def _poll(self) -> None:
        last = await sync_to_async(_last_event_id)()
        self.ready.set()
        while True:
            await asyncio.sleep(POLL_INTERVAL)
            rows = await sync_to_async(_events_after)(last)
            for event_id, run_id in rows:
                last = max(last, event_id)
                self._wake(str(run_id), "events")


def _last_event_id() -> int:
    return RunEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def _events_after(last: int) -> list[tuple[int, Any]]:
    """The events committed after ``last``, by the primary key (an index probe and a short scan)."""
    return list(RunEvent.objects.filter(id__gt=last).order_by("id").values_list("id", "run_id")[:1000])


_hubs: dict[int, Hub] = {}


def hub() -> Hub:
    """The hub of the running event loop (ASGI servers run one loop per process)."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(id(loop))
    if found is None or found.loop is not loop:
        for key, old in list(_hubs.items()):  # the hubs of loops that ended
            if old.loop is None or old.loop.is_closed():
                del _hubs[key]
        found = _hubs[id(loop)] = Hub(loop)
    return found



# --- the stream ----------------------------------------------------------------------------------

#: Events one read takes at most (a stream that is behind reads again at once).
PAGE = 200
#: A comment line this often keeps proxies from closing an idle stream (seconds).
KEEPALIVE = 15.0
#: A stream ends after this long (seconds); the browser reconnects with ``Last-Event-ID``.
MAX_SECONDS = 300.0


def sse(data: Any, *, event: str | None = None, id: int | None = None) -> str:
    """One Server-Sent Event: ``id:``, ``event:`` and one ``data:`` line of JSON (JSON has no
    raw newline, so one line always holds it)."""
    head = (f"id: {id}\n" if id is not None else "") + (f"event: {event}\n" if event else "")
    return f"{head}data: {json.dumps(data, ensure_ascii=False, default=str)}\n\n"


def event_json(event: RunEvent) -> dict[str, Any]:
    """An event as the JSON endpoint and the stream give it."""
    return {"id": event.id, "type": event.type, "data": event.data, "at": event.created_at.isoformat()}


def _read(run_id: Any, after: int) -> tuple[list[dict[str, Any]], str | None, bool]:
    """The run's events after ``after`` (at most :data:`PAGE`), its status, and whether it is
    terminal. The status is read first: a run's last events commit with its terminal status, so
    events read after a terminal status include them (read the other way round, a commit between
    the two reads ended the stream before its last events)."""
    status = AgentRun.objects.filter(pk=run_id).values_list("status", flat=True).first()
    rows = [event_json(e) for e in RunEvent.objects.filter(run_id=run_id, id__gt=after).order_by("id")[:PAGE]]
    return rows, status, status is None or status in TERMINAL_RUN_STATUSES


def _text_so_far(run_id: Any) -> dict[str, Any] | None:
    """The text kept of the run's turn in progress (``live_text``), or None: none kept, or its
    turn's reply is stored already (the page shows it from the transcript)."""
    kept = live_text.so_far(run_id)
    if kept is None or not kept["text"]:
        return None
    reply = RunEvent.objects.filter(run_id=run_id, type="model_reply").order_by("-id").values_list("data", flat=True).first()
    if isinstance(reply, dict) and isinstance(reply.get("turn"), int) and reply["turn"] >= kept["turn"]:
        return None
    return kept


def status_event(status: str | None) -> str:
    """``event: status``: the run's status and its label, sent whenever the stream sees it change."""
    label = RunStatus(status).label if status in RunStatus.values else str(status)
    return sse({"status": status, "label": label}, event="status")


async def event_stream(run_id: Any, after: int, *, max_seconds: float = MAX_SECONDS) -> AsyncIterator[str]:
    """The run's events after id ``after`` as Server-Sent Events, then each one as it commits,
    with the model's text deltas between them; ends (``event: end``) once the run is finished and
    every event was sent, or after ``max_seconds`` (the client reconnects from its last id).
    First the text of the turn in progress so far (``event: delta`` with ``"so_far": true``), and
    ``event: status`` at the start and whenever the run's status changed (read with its events)."""
    loop = asyncio.get_running_loop()
    ends_at = loop.time() + max_seconds
    sub = await hub().subscribe(run_id)  # before the first read: a commit after it wakes us
    status_sent: str | None = None
    try:
        yield "retry: 1000\n\n"
        # Read after subscribing: a piece written since is in the subscription, and skipped
        # below if the kept text already held it (its end is not past the kept text's).
        kept = await sync_to_async(_text_so_far)(run_id)
        held = (kept["turn"], kept["attempt"], kept["end"]) if kept else None
        if kept is not None:
            yield sse({"turn": kept["turn"], "attempt": kept["attempt"], "text": kept["text"], "so_far": True},
                      event="delta")
        while True:
            rows, status, terminal = await sync_to_async(_read)(run_id, after)
            for row in rows:
                after = row["id"]
                yield sse(row, event=row["type"], id=row["id"])
            if len(rows) == PAGE:
                continue
            if status != status_sent and status is not None:
                status_sent = status
                yield status_event(status)
            if terminal:
                yield sse({"status": status}, event="end")
                return
            while True:
                item = await sub.wait(max(0.0, min(KEEPALIVE, ends_at - loop.time())))
                if isinstance(item, dict):  # the model's text: sent as it comes, not stored, no id
                    end = item.get("end")
                    if held is not None and (item.get("turn"), item.get("attempt")) == held[:2] \
                            and isinstance(end, int) and end <= held[2]:
                        continue  # in the text so far, sent already
                    yield sse({k: item.get(k) for k in ("turn", "attempt", "text")}, event="delta")
                    continue
                if item is None:
                    if loop.time() >= ends_at:
                        return
                    yield ": keepalive\n\n"
                    continue  # nothing was committed: nothing to read
                break  # events may have committed: read them
    finally:
        sub.close()

