"""The database journal: the loop's writes, appended as rows and fenced by the run's lease.

Each flush checks the lease in the same transaction as the rows it writes, so a worker that lost
its run writes nothing. A step writes a constant number of rows whatever the run's length.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, DataError, IntegrityError, connection, connections
from django.utils import timezone

from ..conf import nexo_settings
from ..core.agent import WAITING, CallDecision, Journal, open_calls
from ..core.errors import InputRequired, LeaseLost, PendingCall, SecurityError, ToolArgumentError
from ..core.llm.base import Message, add_usage
from ..models import (
    EVENT_COLUMNS,
    MESSAGE_COLUMNS,
    AgentRun,
    CallStatus,
    RunEvent,
    RunMessage,
    RunStatus,
    ToolCall,
    args_digest,
)
from ..storable import UnstorableValue, refuse_call_ids
from . import binding, driver, elicitation, live, outbox, sql
from .deadlines import deadline
from .prefix import prefix as conversation_prefix

if TYPE_CHECKING:
    from ..core.agent import Agent
    from ..core.tools import Tool


log = logging.getLogger("nexo_django.journal")


#: Runs renewed by one heartbeat statement, at most.
BEAT_BATCH = 500


class _Heartbeats:
    """One daemon thread per process renews the lease of every run this process is driving, so
    the reconciler only takes runs whose worker is really gone. (A thread per drive would cost a
    start and a join on every step of every run.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        #: token -> [run id, lease, last renewal (monotonic)]
        self._held: dict[str, list[Any]] = {}
        self._thread: threading.Thread | None = None
        self._pid = 0
        #: when the thread wakes next (monotonic), as it last computed it
        self._wakes_at = 0.0

    def hold(self, run_id: Any, token: str, lease: timedelta) -> None:
        now = time.monotonic()
        with self._lock:
            self._held[token] = [run_id, lease, now]
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                # After a fork (rq's work horse) the parent's thread does not exist here.
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._loop, daemon=True, name="nexo-heartbeat")
                self._thread.start()
            # Wake the thread only if it would sleep past this lease's first renewal: waking it
            # for every drive cost a thread switch each (~0.15 ms of a resume).
            wake = self._wakes_at > now + self._every(lease)
        if wake:
            self._wake.set()

    @staticmethod
    def _every(lease: timedelta) -> float:
        return max(lease.total_seconds() / 3, 0.2)

    def release(self, token: str) -> None:
        with self._lock:
            self._held.pop(token, None)

    def _due(self) -> tuple[list[tuple[str, Any, timedelta]], float]:
        now = time.monotonic()
        due: list[tuple[str, Any, timedelta]] = []
        wait = 60.0
        with self._lock:
            for token, entry in self._held.items():
                run_id, lease, last = entry
                every = self._every(lease)
                if now - last >= every:
                    due.append((token, run_id, lease))
                    entry[2] = now
                    wait = min(wait, every)
                else:
                    wait = min(wait, every - (now - last))
            wait = wait if self._held else 3600.0
            # Set with the entries it was computed from: a lease held after this is either
            # renewed by then or wakes the thread (hold).
            self._wakes_at = now + wait
        return due, wait

    def _loop(self) -> None:
        while True:
            due, wait = self._due()
            # One statement per lease length and BEAT_BATCH runs: a process carrying hundreds of
            # runs (the concurrent worker) renews them in a few round trips, not one each. A
            # token names one drive of one run, so it alone is the fence.
            by_lease: dict[timedelta, list[tuple[str, Any]]] = {}
            for token, run_id, lease in due:
                by_lease.setdefault(lease, []).append((token, run_id))
            for lease, held in by_lease.items():
                for i in range(0, len(held), BEAT_BATCH):
                    chunk = held[i : i + BEAT_BATCH]
                    try:
                        AgentRun.objects.filter(
                            pk__in=[r for _, r in chunk], lease_owner__in=[t for t, _ in chunk],
                            status=RunStatus.RUNNING,
                        ).update(lease_expires_at=timezone.now() + lease)
                    except DatabaseError as exc:  # the next beat tries again; the fence stays the guard
                        log.warning("heartbeat of %d run(s) failed: %s", len(chunk), exc)
            if due:
                connection.close()  # an idle process keeps no connection open for this thread
            self._wake.wait(wait)
            self._wake.clear()


_heartbeats = _Heartbeats()


class Heartbeat:
    """``with Heartbeat(run_id, token, lease):`` keeps the run's lease renewed meanwhile."""

    def __init__(self, run_id: Any, token: str, lease: timedelta) -> None:
        self.run_id = run_id
        self.token = token
        self.lease = lease

    def __enter__(self) -> Heartbeat:
        _heartbeats.hold(self.run_id, self.token, self.lease)
        return self

    def __exit__(self, *exc: object) -> None:
        _heartbeats.release(self.token)


class WorkerStopping(Exception):
    """Raised at a run's next commit once its worker is shutting down (:func:`stop_at_next_commit`):
    the run is handed back to the queue there, instead of being cut off wherever it was."""


class RunInterrupted(BaseException):
    """Raised into a run's thread from outside it: its job's timeout (the concurrent worker's
    ``ThreadDeathPenalty``, rq's own alarm under ``rqworker``). A ``BaseException``, as
    ``KeyboardInterrupt`` is, so that no tool's error handling (which turns an ``Exception`` into
    the call's result) swallows it: the run fails with it, and its job fails in rq."""


class JobTimeout(RunInterrupted):
    """A job ran past its rq timeout (``NEXO["JOB_TIMEOUT"]`` for a run's job)."""


class JobStopped(RunInterrupted):
    """rq's ``stop-job`` command stopped the run's job (the concurrent worker: at its next commit)."""


#: Set by a worker that is shutting down: each run it carries stops at its next commit.
_stopping = threading.Event()
#: Runs to stop at their next commit (rq's ``stop-job``, :func:`stop_run_at_next_commit`).
_stop_runs: set[str] = set()
#: Whether a run hands its database connection back before each model request (see
#: :func:`release_connection_before_model`).
_release_before_model = False


def stop_at_next_commit() -> None:
    """Make every run of this process stop at its next commit (before its next model request)."""
    _stopping.set()


def stop_run_at_next_commit(run_id: str) -> None:
    """Make run ``run_id``, if this process drives it, fail with :class:`JobStopped` at its next
    commit (before its next model request)."""
    _stop_runs.add(run_id)


def release_connection_before_model(release: bool = True) -> None:
    """Close (or, with Django's connection pool, return to the pool) the thread's database
    connection before each model request: a run waiting on its model then holds no connection,
    so connections are bounded by what runs write at once, not by the runs in flight. The
    concurrent worker turns it on; a process running one run at a time keeps its connection."""
    global _release_before_model
    _release_before_model = release


def crash_point(name: str) -> None:
    """Test hook: ``NEXO_TEST_CRASH_AT=<name>`` kills this worker with SIGKILL right here, so crash
    tests can stop a real worker at a chosen point; with ``NEXO_TEST_CRASH_ONCE=<file>`` only the
    first time (the file marks it). Unset in production: one dict lookup."""
    if os.environ.get("NEXO_TEST_CRASH_AT") != name:
        return
    once = os.environ.get("NEXO_TEST_CRASH_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)


#: ``json.dumps(value, default=str, ensure_ascii=False)`` without an encoder built per call
_measure = json.JSONEncoder(default=str, ensure_ascii=False).encode


#: the longest JSON text of an int of fewer than 18 digits, of any float, of true/false/null
_INT_MAX, _FLOAT_CHARS, _CONSTANT_CHARS = 10**17, 32, 5


def _bound(value: Any, budget: int, depth: int = 0) -> int:
    """An upper bound of the length of ``value``'s JSON text (as :data:`_measure` writes it), or
    a number past ``budget`` when it may be longer or is not plain JSON (then it is measured). A
    string's character may take up to 6 (``\\u001f``); the separators are ``", "`` and ``": "``."""
    kind = type(value)
    if kind is str:
        return 6 * len(value) + 2
    if kind is bool or value is None:
        return _CONSTANT_CHARS
    if kind is int:
        return 18 if -_INT_MAX < value < _INT_MAX else budget + 1
    if kind is float:
        return _FLOAT_CHARS
    if depth >= 3:
        return budget + 1
    total = 2
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return budget + 1
            total += 6 * len(key) + 6 + _bound(item, budget, depth + 1)
            if total > budget:
                return total
        return total
    if kind is list:
        for item in value:
            total += 2 + _bound(item, budget, depth + 1)
            if total > budget:
                return total
        return total
    return budget + 1


def capped(value: Any, limit: int) -> Any:
    if not value and type(value) in (dict, list) and limit >= 2:  # {} or []: nothing to measure
        return value
    # Most events are a few short fields: their text is known to fit without being written (it
    # is written once, by the column's encoder). Anything else is measured.
    if _bound(value, limit) <= limit:
        return value
    try:
        text = _measure(value)
    except (RecursionError, ValueError):  # nested past what json can write: the event says so
        return {"truncated": True, "preview": "(nested too deeply to show)"}
    if len(text) <= limit:
        return value
    return {"truncated": True, "preview": text[:limit]}


class DbJournal(Journal):
    def __init__(
        self, run: AgentRun, token: str, agent: Agent, *, messages: list[Message] | None = None,
        start: str = "held", started: Callable[[], None] | None = None, prefix: list[Message] | None = None,
    ) -> None:
        """``start`` says what the first commit does besides its own writes: ``"held"``: nothing,
        this worker holds the run already; ``"claim"``: claim the ``queued`` run (a compare-and-set:
        ``LeaseLost`` if another worker or a cancel came first); ``"insert"``: store the run, not
        stored yet, with ``messages`` and its ``created`` event. ``started`` is called inside that
        transaction. ``prefix``: the earlier runs' messages of a follow-up's conversation, read
        only (sent to the model first; this run's rows are numbered from 0 after them); by default
        read from the database for a run with a ``previous`` one."""
        if messages is None:
            messages = sql.values(RunMessage, "data", "seq", run_id=run.pk)
        else:
            messages = [dict(m) for m in messages]
        if prefix is None and run.previous_id is not None:
            # A follow-up: the earlier runs' rows, read (never copied) and sent to the model first.
            prefix = conversation_prefix(run)
        super().__init__(messages, prefix=prefix)
        self.run = run
        self.token = token
        self.agent = agent
        self.next_seq = len(messages)
        self.event_limit = int(nexo_settings.EVENT_MAX_CHARS)
        self.call_id_limit = int(ToolCall._meta.get_field("tool_call_id").max_length or 0)
        self.lease = timedelta(seconds=int(nexo_settings.LEASE_SECONDS))
        #: buffered rows: (seq, role, data) and (type, data)
        self._messages: list[tuple[int, str, Message]] = []
        self._events: list[tuple[str, Any]] = []
        self._start = start
        self._started = started
        #: messages that came with the run (stored with it when it is inserted)
        self._initial = len(messages) if start == "insert" else 0
        if start == "insert":
            self._messages = [(i, m.get("role", ""), m) for i, m in enumerate(messages)]
            self.emit("created", {"agent": run.agent, "later": False})
        #: the model's text not sent on yet: (turn, attempt, pieces, since when)
        self._text: tuple[int, int, list[str], float] | None = None
        self._text_sent = False
        #: the last model reply is only buffered: it must be saved before any of its calls runs
        self._reply_unsaved = False
        #: what :meth:`suspend` prepares for :meth:`close`: rows to pend again, and new pending rows
        self._reset: list[int] = []
        self.new_pending: list[ToolCall] = []
        #: an MCP server's asks, written with the suspension (durable.elicitation)
        self.new_asks: list[Any] = []
        self.asking: list[Any] = []
        open_ids = [c["id"] for c in open_calls(self.messages)]
        self.calls: dict[str, ToolCall] = {c.tool_call_id: c for c in sql.calls_with_decisions(run.pk, open_ids)}

    # --- buffering ---------------------------------------------------------------------------

    #: the model's text is sent on at most this often (seconds): one NOTIFY per piece, not per token
    TEXT_EVERY = 0.1

    def text(self, turn: int, attempt: int, piece: str) -> None:
        """Send the model's text on to the run's readers (``durable.live``), a few pieces at a
        time; never stored (the finished message is)."""
        buffered = self._text
        if buffered is None or buffered[:2] != (turn, attempt):
            self._flush_text()
            buffered = self._text = (turn, attempt, [], time.monotonic())
        buffered[2].append(piece)
        if time.monotonic() - buffered[3] >= self.TEXT_EVERY:
            self._flush_text()

    def _flush_text(self) -> None:
        buffered, self._text = self._text, None
        if buffered and buffered[2]:
            live.publish_delta(self.run.pk, buffered[0], buffered[1], "".join(buffered[2]))
            self._text = (buffered[0], buffered[1], [], time.monotonic())
            self._text_sent = True

    def append(self, message: Message) -> None:
        if message.get("role") == "assistant":
            self._flush_text()
            if self._text_sent:  # the readers get the text before the message that ends it
                live.deltas_sent()
                self._text_sent = False
            # At the edge: an id the database cannot keep fails the run before anything of it
            # is written (the model is not asked again).
            refuse_call_ids(message, self.call_id_limit)
        super().append(message)
        self._messages.append((self.next_seq, message.get("role", ""), message))
        self.next_seq += 1
        if message.get("role") == "assistant":
            self._reply_unsaved = True

    def before_model(self) -> None:
        # A reply none of whose calls ran (all refused) is saved before the next request, so the
        # model is never asked for it again. The results of idempotent calls are not: they go
        # with the next reply's commit, and a crash before it only runs them again.
        if _stopping.is_set() and self._start != "insert":
            # Its worker is shutting down: what is buffered is committed (held) or nothing is
            # claimed (queued), and the run goes back to the queue from here (runs._hand_back).
            raise WorkerStopping(f"run {self.run.pk}: its worker is shutting down")
        if _stop_runs and str(self.run.pk) in _stop_runs:
            _stop_runs.discard(str(self.run.pk))
            raise JobStopped("stopped by rq's stop-job command")
        if self._reply_unsaved:
            self.flush()
        elif self._start == "claim":
            # The model is only asked for a run this worker has claimed: a duplicate job stops
            # here, before paying for a request. This commit need not wait for the disk: all it
            # writes is the claim and what the run's rows already imply (results of denied or
            # idempotent calls, their events). Losing it takes a crash of the database server or
            # its machine, which ends this worker or its connection (every later write is
            # fenced); the run is then `queued` as before, and the reconciler sends it again. The
            # next commit that waits (this run's reply) takes it to disk first.
            self.flush(durable=False)
        if _release_before_model:
            for conn in connections.all(initialized_only=True):
                if not conn.in_atomic_block:
                    conn.close()

    def emit(self, type: str, data: dict[str, Any]) -> None:
        super().emit(type, data)
        self._events.append((type, capped(data, self.event_limit)))

    def _fenced(self, now: datetime, *, durable: bool = True, **fields: Any) -> tuple[sql.Batch, dict[str, Any]]:
        """A batch of this worker's next commit: its gate, then what is buffered. On a held run
        the gate is the lease fence; the first commit claims the queued run or stores the new one
        (see ``start``). The run's values to write come back with it."""
        values = {"lease_expires_at": now + self.lease, **fields}
        if self._start != "held":
            values = {"status": RunStatus.RUNNING, "lease_owner": self.token, "updated_at": now, **values}
        return self._batch(now, values, durable=durable), values

    def _batch(self, now: datetime, values: dict[str, Any], *, durable: bool = True) -> sql.Batch:
        batch = sql.Batch(durable=durable)
        if self._start == "insert":
            self._mirror(values)
            batch.gate_create(self.run)
        elif self._start == "claim":
            batch.gate(AgentRun, {"id": self.run.pk, "status": RunStatus.QUEUED}, values)
        else:
            batch.gate(AgentRun, self._held(), values)
        run_id = self.run.pk
        if self._messages:
            batch.insert(RunMessage, MESSAGE_COLUMNS, [(run_id, *m, now) for m in self._messages])
        # A claim is a change of status the run's pages follow (queued to running): it is an event,
        # written with the claim (the events' commit is what wakes a page's stream).
        events = [("running", {}), *self._events] if self._start == "claim" else self._events
        if events:
            batch.insert(RunEvent, EVENT_COLUMNS, [(run_id, *e, now) for e in events])
        return batch

    def _write(self, batch: sql.Batch, values: dict[str, Any]) -> bool:
        """Commit ``batch``; False if its gate did not match (nothing written: not ours).
        ``UnstorableValue`` if the database refused what it holds (nothing written either)."""
        try:
            if not batch.run():
                return False
        except (DataError, IntegrityError, UnicodeError) as exc:
            # The data, not the connection: a retry would be refused again (and ask the model
            # again first). The run fails once, with the cause (see drop_unsaved).
            raise UnstorableValue(f"the database refused this run's latest writes: {exc}"[:2000]) from exc
        if self._start != "insert":  # an inserted run was given its values before (auto_now too)
            self._mirror(values)
        self._messages, self._events, self._reply_unsaved = [], [], False
        if self._start != "held":
            self._start = "held"
            if self._started is not None:
                self._started()
        return True

    def _commit(self, batch: sql.Batch, values: dict[str, Any]) -> None:
        if not self._write(batch, values):
            raise LeaseLost(f"run {self.run.pk} is no longer held by this worker")

    def _mirror(self, fields: dict[str, Any]) -> None:
        """Keep ``self.run`` what its row holds: the values this journal just wrote to it (a caller
        of ``run()`` gets a current object without reading it back)."""
        for name, value in fields.items():
            setattr(self.run, name, value)

    def _changed_workspace(self) -> dict[str, Any]:
        """``{"workspace": ...}``: a virtual sandbox's files, to write if they differ from what the
        run's row holds (``self.run`` mirrors it), so an unchanged tree is not written again."""
        workspace = self.agent.workspace
        if workspace.kind != "virtual":
            return {}
        spec = workspace.spec()
        return {} if spec == self.run.workspace else {"workspace": spec}

    def drop_unsaved(self) -> None:
        """Forget what is buffered but was refused: every message but those that came with an
        inserted run (its prompt), and the buffered events. The run is then closed as failed."""
        self._messages = [m for m in self._messages if m[0] < self._initial]
        self._events = []
        self._reply_unsaved = False
        self._reset, self.new_pending = [], []

    def forget_all(self) -> None:
        """:meth:`drop_unsaved`, the messages of an inserted run included."""
        self._initial = 0
        self.drop_unsaved()

    @property
    def held(self) -> bool:
        """Whether this worker holds the run (its first commit claimed or stored it)."""
        return self._start == "held"

    def _held(self) -> dict[str, Any]:
        """The lease fence: the compare-and-set every write of a held run goes through."""
        return {"id": self.run.pk, "lease_owner": self.token, "status": RunStatus.RUNNING}

    def flush(self, *, durable: bool = True) -> None:
        self._commit(*self._fenced(timezone.now(), durable=durable))

    # --- calls -------------------------------------------------------------------------------

    def decision_for(self, call: dict[str, Any]) -> CallDecision | None:
        row = self.calls.get(call["id"])
        if row is None:
            return None
        if not self._same_call(row, call):
            # Ids are unique within a run (the loop renames reused ones), so only a run stored
            # before that can get here. Its decision was made on another call: never apply it.
            raise SecurityError(
                f"call {call['id']}: the recorded {row.name} call with this id is a different call "
                "(other name or arguments); its decision is not applied"
            )
        decision = getattr(row, "decision", None)
        if decision is None:
            return None
        return CallDecision(
            decision.approved, decision.note, decision.args, decision.stop,
            source=decision.source, version=decision.file_version,
        )

    def _same_call(self, row: ToolCall, call: dict[str, Any]) -> bool:
        """Whether ``row`` was stored for ``call``: same name, and a digest of its arguments as the
        model sent them or as validation normalised them (the pending row keeps the latter)."""
        if row.name != call["name"]:
            return False
        if row.digest == args_digest(call.get("args")):
            return True
        tool = self.agent.toolset().get(call["name"])
        try:
            return tool is not None and row.digest == args_digest(tool.validate(call.get("args")))
        except ToolArgumentError:
            return False

    def call_started(self, call: dict[str, Any], tool: Tool, args: dict[str, Any]) -> None:
        row = self.calls.get(call["id"])
        if tool.idempotent and row is None:
            # The model's reply is saved before the first of its calls runs (with what the
            # previous turn left buffered): a crash from here on never asks the model again.
            # A non-idempotent call saves it with its `executing` mark, below.
            if self._reply_unsaved:
                self.flush()
            crash_point("before_tool")
            return
        crash_point("before_tool")
        now = timezone.now()
        batch, values = self._fenced(now)
        if row is None:
            row = driver.new(
                ToolCall, run_id=self.run.pk, agent=self.run.agent, tool_call_id=call["id"], name=call["name"],
                capability=tool.capability, args=args, digest=args_digest(args),
                status=CallStatus.EXECUTING, idempotent=tool.idempotent,
            )
            batch.create([row])
        else:
            batch.update(ToolCall, {"id": row.pk}, {"status": CallStatus.EXECUTING, "updated_at": now})
        self._commit(batch, values)
        self.calls[call["id"]] = row
        crash_point("executing")

    def call_finished(self, call: dict[str, Any], tool: Tool | None, result: dict[str, Any]) -> None:
        crash_point("before_result")
        super().call_finished(call, tool, result)  # appends the tool message (buffered)
        row = self.calls.get(call["id"])
        if row is None and (tool is None or tool.idempotent):
            # Nothing to settle: the result is written with the next flush. Should the worker die
            # first, this idempotent call simply runs again.
            return
        # A virtual sandbox's files are saved with the result that changed them: a worker dying
        # before the run closes must not undo a write recorded as succeeded.
        saved = self._changed_workspace() if tool and not tool.idempotent else {}
        now = timezone.now()
        batch, values = self._fenced(now, **saved)
        if row is not None and row.status not in (CallStatus.DENIED, CallStatus.EXPIRED):
            status = CallStatus.FAILED if "error" in result else CallStatus.SUCCEEDED
            batch.update(ToolCall, {"id": row.pk}, {
                "status": status, "result": capped(result, self.event_limit), "updated_at": now,
            })
        elif row is not None:
            batch.update(ToolCall, {"id": row.pk}, {"result": result, "updated_at": now})
        self._commit(batch, values)
        crash_point("after_result")

    def call_failed(self, call: dict[str, Any], tool: Tool, exc: BaseException) -> None:
        row = self.calls.get(call["id"])
        if row is not None:
            # What the call left, if the error carries it (a shell command over the quota ran).
            kept = getattr(exc, "result", None)
            result = {**kept, "error": str(exc)} if isinstance(kept, dict) else {"error": str(exc)}
            sql.update(ToolCall, {"id": row.pk}, {
                "status": CallStatus.FAILED, "result": result, "updated_at": timezone.now(),
            })

    def answers_for(self, call: dict[str, Any]) -> Any:
        # Only a call whose row says it asked (durable.elicitation): no statement for any other.
        found = elicitation.answers_for(self.run.pk, call["id"]) if elicitation.asked_before(self.calls.get(call["id"])) else None
        if found is not None and found != WAITING:
            crash_point("input_answered")  # read, the tool not called again yet
        return found

    def input_required(self, call: dict[str, Any], tool: Tool, required: InputRequired) -> Any:
        return elicitation.asked(self, call, tool, required)

    def suspend(self, pending: list[PendingCall]) -> None:
        """Prepare the pending rows; :meth:`close` writes them in the same transaction that marks
        the run suspended, so no decision can land while the run still says running."""
        self._reset = []
        self.new_pending = []
        expires_at = deadline(type(self.agent), timezone.now())
        for p in pending:
            row = self.calls.get(p.id)
            if row is not None:
                if row.status != CallStatus.PENDING_APPROVAL:
                    # A row with no decision behind it (e.g. reset by hand) waits for a person again.
                    self._reset.append(row.pk)
                continue
            tool = self.agent.toolset().get(p.name)
            self.new_pending.append(
                driver.new(
                    ToolCall, run_id=self.run.pk, agent=self.run.agent, tool_call_id=p.id, name=p.name,
                    capability=p.capability,
                    args=p.args, digest=args_digest(p.args), status=CallStatus.PENDING_APPROVAL,
                    idempotent=bool(tool and tool.idempotent), expires_at=expires_at,
                    server=str(getattr(tool, "server", "") or "")[:200] if p.capability == "mcp" else "",
                    # What the notices show, and an approval is bound to (durable.binding).
                    suspension_version=binding.version_now(self.agent, p.name, p.capability, p.args),
                )
            )

    # --- the end of a drive ----------------------------------------------------------------------

    def close(self, status: str, **fields: Any) -> bool:
        """Move the run from running to ``status`` (fenced), writing what is buffered."""
        usage: dict[str, int] = {}
        for m in self.own_messages():
            if m.get("role") == "assistant":
                add_usage(usage, m.get("usage"))
        now = timezone.now()
        values: dict[str, Any] = {
            "status": status, "lease_owner": None, "lease_expires_at": None,
            "usage": usage, "updated_at": now, **self._changed_workspace(), **fields,
        }
        if status in (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED):
            values["finished_at"] = now
        batch = self._batch(now, values)
        if status == RunStatus.SUSPENDED:
            reset = self._reset
            if reset:  # rare: rows set back by hand
                batch.call(lambda: ToolCall.objects.filter(pk__in=reset).update(status=CallStatus.PENDING_APPROVAL))
            batch.create(self.new_pending)
        # The outbox's notices (a request per waiting call, or the run's end) in this same commit.
        notices = outbox.on_close(batch, self.run, status, self.new_pending, now)
        if status == RunStatus.SUSPENDED:
            notices += elicitation.write(batch, self, now)
        written = self._write(batch, values)
        if written:
            outbox.wake(notices)
        return written
