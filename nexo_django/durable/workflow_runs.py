"""Durable workflow runs: an ``AgentRun`` of kind ``"workflow"`` whose steps are ``WorkflowStep`` rows.

A pass claims the queued run (compare-and-set, with a lease, renewed by the heartbeat), calls
``Workflow.call(payload)`` from the top, and ends it: ``done`` with what ``call`` returned,
``suspended`` at the first step that waits (an agent run that has not ended, a question nobody
answered), or ``failed``. Every step is recorded by a write fenced by the lease, once: its name is
its identity (unique within the run), and a later pass gets the stored result back without running
it. The same rq job (``jobs.continue_run``), reconciler and admin serve workflows and agent runs.

What wakes a suspended workflow run: its agent run ending (:mod:`.parents`), an answer, an expired
question. Each waker queues the run if it is suspended; the run, once its suspension is committed,
looks again at what it waits for, so a wake-up that came while it was still running is not lost.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import jsonschema
from django.db import DatabaseError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.module_loading import import_string

from .. import schema_forms, storable
from ..conf import nexo_settings
from ..core.errors import (
    ConfigurationError,
    NoAnswer,
    StepFailed,
    WorkflowChanged,
    WorkflowError,
)
from ..core.sandboxes import Sandbox, from_spec, make_sandbox
from ..models import (
    EVENT_COLUMNS,
    TERMINAL_RUN_STATUSES,
    AgentRun,
    CallStatus,
    RunEvent,
    RunKind,
    RunStatus,
    StepKind,
    StepStatus,
    ToolCall,
    WorkflowStep,
)
from . import dispatch, outbox, parents, runs, sql
from . import later as later_module
from .deadlines import deadline
from .journal import Heartbeat, RunInterrupted, crash_point
from .workflow_questions import _event, answer

log = logging.getLogger("nexo_django.workflows")

#: what ``run``/``run_later`` take besides the payload and the user
WORKFLOW_OPTIONS = ("cwd",)
#: where a local workflow's sandbox spec is kept in ``AgentRun.options``
SANDBOX_KEY = "_sandbox"


class _Suspend(BaseException):
    """The pass reached a step that waits. A ``BaseException``: ``except Exception`` in a
    workflow's code does not swallow it."""

    def __init__(self, step: WorkflowStep) -> None:
        self.step = step


class _Lost(BaseException):
    """The run's lease was lost (cancelled, or taken over after this worker stalled): stop."""


def _as_stored(value: Any) -> Any:
    """The value as a later pass reads it back (tuples become lists)."""
    return json.loads(json.dumps(value))


# --- the run as the caller sees it ----------------------------------------------------------------


class WorkflowRun:
    """What ``Workflow.run()`` / ``run_later()`` return: the workflow's ``AgentRun`` with the
    workflow's view of it (``result`` is what ``call`` returned, ``pending_calls()`` are its agents'
    calls, ``questions()`` its open questions). Other attributes are the ``AgentRun``'s."""

    def __init__(self, run: AgentRun) -> None:
        self.agent_run = run

    @classmethod
    def get(cls, run_id: Any) -> WorkflowRun:
        return cls(AgentRun.objects.get(pk=run_id, kind=RunKind.WORKFLOW))

    def __getattr__(self, name: str) -> Any:
        if name == "agent_run":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.agent_run, name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkflowRun) and other.agent_run.pk == self.agent_run.pk

    def __hash__(self) -> int:
        return hash(self.agent_run.pk)

    def __repr__(self) -> str:
        return f"<WorkflowRun {self.agent_run}>"

    @property
    def id(self) -> Any:
        return self.agent_run.pk

    pk = id

    @property
    def status(self) -> str:
        return self.agent_run.status

    @property
    def error(self) -> str:
        return self.agent_run.error

    @property
    def result(self) -> Any:
        """What ``call`` returned (None until the run is done)."""
        return decode_result(self.agent_run)

    def refresh_from_db(self) -> None:
        self.agent_run.refresh_from_db()

    def steps(self) -> QuerySet[WorkflowStep]:
        return WorkflowStep.objects.filter(run=self.agent_run).order_by("seq")

    def pending_calls(self) -> QuerySet[ToolCall]:
        """The calls waiting for a decision in the workflow's agent runs, oldest first."""
        return pending_calls(self.agent_run)

    def questions(self) -> list[WorkflowStep]:
        """The questions waiting for an answer (each with ``key``, ``question``, ``schema``)."""
        return list(WorkflowStep.objects.filter(
            run=self.agent_run, kind=StepKind.QUESTION, status=StepStatus.WAITING).order_by("seq"))

    def answer(self, key: str, value: Any, *, by: Any, source: str = "api", channel_user: str = "") -> WorkflowStep:
        return answer(self.agent_run, key, value, by=by, source=source, channel_user=channel_user)

    def cancel(self, *, by: Any = None, reason: str = "") -> bool:
        return self.agent_run.cancel(by=by, reason=reason)


def decode_result(run: AgentRun) -> Any:
    if run.result is None:
        return None
    try:
        return json.loads(run.result)
    except ValueError:
        return run.result


def pending_calls(run: AgentRun) -> QuerySet[ToolCall]:
    return ToolCall.objects.filter(run__parent=run, status=CallStatus.PENDING_APPROVAL).order_by("created_at", "id")


# --- starting -------------------------------------------------------------------------------------


def start_workflow(cls: type[Any], payload: Any, *, user: Any, later: bool, at: datetime | None = None,
                   origin: dict[str, Any] | None = None, **options: Any) -> WorkflowRun:
    method = "run_later" if later else "run"
    wait = later_module.not_before(f"{cls.__name__}.run_later", at)
    unknown = sorted(set(options) - set(WORKFLOW_OPTIONS))
    if unknown:
        raise TypeError(f"{cls.__name__}.{method}() got unknown argument(s) {', '.join(unknown)}; "
                        f"it takes payload, user and {', '.join(WORKFLOW_OPTIONS)}")
    runs._check_user(cls, method, user)
    if not storable.is_json(payload):
        raise ConfigurationError(f"{cls.__name__}.{method}(payload): the payload is stored as JSON, and "
                                 f"{type(payload).__name__} is not JSON")
    try:
        sandbox = make_sandbox(cls.sandbox, options.get("cwd"))
    except ConfigurationError as exc:
        raise ConfigurationError(f"{cls.__name__}.{method}(...): {exc}") from exc
    stored: dict[str, Any] = {"payload": _as_stored(payload)}
    if sandbox.kind != "virtual":
        stored[SANDBOX_KEY] = sandbox.spec()
    if origin:
        stored[runs.ORIGIN] = origin
    run = AgentRun(
        agent=cls.path(), kind=RunKind.WORKFLOW, prompt=json.dumps(payload, ensure_ascii=False)[:2000],
        status=RunStatus.QUEUED, created_by=runs._user(user), options=stored, generation=1,
        workspace=sandbox.spec() if sandbox.kind == "virtual" else None, not_before=wait,
    )
    with transaction.atomic():
        run.save(force_insert=True)
        _event(run.pk, "created", agent=cls.path(), later=later, workflow=True)
    if not later:
        # Runs here, now; should this process die first, the run is queued without a job and the
        # reconciler sends one.
        execute_workflow(run)
        sql.refresh(run)
        return WorkflowRun(run)
    dispatch.enqueue_run(run.pk, run.generation, at=wait)
    if dispatch.is_inline():
        def refresh() -> None:
            if AgentRun.objects.filter(pk=run.pk).exists():
                run.refresh_from_db()

        transaction.on_commit(refresh)
    return WorkflowRun(run)


# --- a pass ---------------------------------------------------------------------------------------


class Pass:
    """One pass of ``call`` over a run's recorded steps (``Workflow``'s ``_pass``: ``workflow.Pass``)."""

    def __init__(self, run: AgentRun, token: str, lease: timedelta, cls: type[Any],
                 recorded: list[WorkflowStep]) -> None:
        self.run, self.token, self.lease, self.cls = run, token, lease, cls
        self.recorded = recorded
        self.cursor = 0
        self.names: set[str] = set()
        self.agents: Counter[str] = Counter()
        self.workspace: Sandbox = self._sandbox()
        self.saved = self.workspace.spec() if self.workspace.kind == "virtual" else None

    def _sandbox(self) -> Sandbox:
        if self.run.workspace is not None:
            return from_spec(self.run.workspace)
        spec = self.run.options.get(SANDBOX_KEY)
        return from_spec(spec) if isinstance(spec, dict) else make_sandbox("virtual")

    # Order and names ------------------------------------------------------------------------------

    def _next(self, name: str, kind: str) -> WorkflowStep | None:
        """The recorded step this one is (it must be the same, in the same place), or None: new."""
        if not isinstance(name, str) or not name or len(name) > 200:
            raise WorkflowError(f"a step's name is a non-empty string of at most 200 characters, not {name!r}")
        if name in self.names:
            raise WorkflowError(
                f"{self.cls.__name__}: the step name {name!r} was reached twice in one pass; step names are "
                "unique within a run (a step's name is its identity: give each step its own)"
            )
        self.names.add(name)
        seq, self.cursor = self.cursor, self.cursor + 1
        if seq >= len(self.recorded):
            return None
        row = self.recorded[seq]
        if row.name != name or row.kind != kind:
            raise WorkflowChanged(
                f"{self.cls.path()} changed while run {self.run.pk} waited: its step {seq + 1} is now the "
                f"{kind} {name!r}, but the {row.kind} {row.name!r} was recorded there. The run cannot resume "
                "on this code (a stored result would go to a different step): cancel it, or deploy the code "
                "it started with."
            )
        return row

    def finish(self) -> None:
        if self.cursor < len(self.recorded):
            row = self.recorded[self.cursor]
            raise WorkflowChanged(
                f"{self.cls.path()} changed while run {self.run.pk} waited: call returned before reaching "
                f"its recorded step {self.cursor + 1}, the {row.kind} {row.name!r}. The run cannot finish on "
                "this code: cancel it, or deploy the code it started with."
            )

    # Writes, fenced by the lease -----------------------------------------------------------------

    @contextmanager
    def _fenced(self, **fields: Any) -> Iterator[datetime]:
        """One transaction that holds the run (the row lock first, as every writer of a run takes
        it) and renews the lease; raises ``_Lost`` if the run is no longer this pass's."""
        with transaction.atomic():
            now = timezone.now()
            spec = self.workspace.spec() if self.workspace.kind == "virtual" else None
            if spec is not None and spec != self.saved:
                fields.setdefault("workspace", spec)
            if not AgentRun.objects.filter(pk=self.run.pk, status=RunStatus.RUNNING, lease_owner=self.token).update(
                lease_expires_at=now + self.lease, updated_at=now, **fields
            ):
                raise _Lost()
            yield now
        if "workspace" in fields:
            self.saved = fields["workspace"]

    def _record(self, step: WorkflowStep) -> WorkflowStep:
        """One write transaction (one statement on PostgreSQL): the lease's fence and renewal,
        the step, its event. Nothing is written if the run is no longer this pass's."""
        now = timezone.now()
        fields: dict[str, Any] = {"lease_expires_at": now + self.lease, "updated_at": now}
        spec = self.workspace.spec() if self.workspace.kind == "virtual" else None
        if spec is not None and spec != self.saved:
            fields["workspace"] = spec
        step.run, step.seq, step.workflow = self.run, self.cursor - 1, self.run.agent
        step.created_at = step.updated_at = now
        batch = sql.Batch()
        batch.gate(AgentRun, {"id": self.run.pk, "status": RunStatus.RUNNING, "lease_owner": self.token}, fields)
        batch.create([step])
        batch.insert(RunEvent, EVENT_COLUMNS,
                     [(self.run.pk, "step", {"name": step.name, "kind": step.kind, "status": step.status}, now)])
        if not batch.run():
            raise _Lost()
        if "workspace" in fields:
            self.saved = fields["workspace"]
        return step

    # The steps ------------------------------------------------------------------------------------

    def checkpoint(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        row = self._next(name, StepKind.CHECKPOINT)
        if row is not None:
            return row.result
        value = fn(*args, **kwargs)
        if not storable.is_json(value):
            raise WorkflowError(
                f"checkpoint {name!r} returned a {type(value).__name__}: a step's result is stored as JSON "
                "(dict, list, str, int, float, bool or None)"
            )
        value = _as_stored(value)
        self._record(WorkflowStep(name=name, kind=StepKind.CHECKPOINT, status=StepStatus.DONE, result=value))
        crash_point("workflow_step_recorded")
        return value

    def run_agent(self, agent_class: type, prompt: str, name: str | None, options: dict[str, Any]) -> str:
        if name is None:
            base = getattr(agent_class, "__name__", "agent")
            self.agents[base] += 1
            name = base if self.agents[base] == 1 else f"{base} {self.agents[base]}"
        row = self._next(name, StepKind.AGENT)
        if row is None:
            row = self._start_agent(name, agent_class, prompt, options)
        return self._agent_answer(row)

    def _start_agent(self, name: str, agent_class: type, prompt: str, options: dict[str, Any]) -> WorkflowStep:
        if self.workspace.kind == "local" and "cwd" not in options:
            options = {**options, "cwd": self.workspace.root}  # type: ignore[attr-defined]
        step = WorkflowStep(name=name, kind=StepKind.AGENT, status=StepStatus.WAITING)
        with self._fenced() as now:
            # The agent run and the step that names it are one transaction: a crash never leaves
            # an agent run the workflow does not know (it would run the agent twice).
            child = runs.start_run(agent_class, prompt, user=self.run.created_by, later=True, **options)
            fields: dict[str, Any] = {"parent_id": self.run.pk}
            if child.workspace is not None and self.workspace.kind == "virtual":
                fields["workspace"] = self.workspace.spec()  # the agent acts on the workflow's files
            AgentRun.objects.filter(pk=child.pk).update(**fields)
            step.run, step.seq, step.workflow, step.child_run = self.run, self.cursor - 1, self.run.agent, child
            step.created_at = step.updated_at = now
            step.save(force_insert=True)
            _event(self.run.pk, "step", name=name, kind=StepKind.AGENT, status=StepStatus.WAITING, run=str(child.pk))
        # With an inline queue the agent ran at that commit; with workers it is queued.
        return step

    def _agent_answer(self, row: WorkflowStep) -> str:
        if row.status == StepStatus.DONE:
            return str(row.result)
        if row.status == StepStatus.FAILED:
            raise StepFailed(str((row.result or {}).get("error", f"agent step {row.name!r} failed")))
        child = AgentRun.objects.filter(pk=row.child_run_id).first() if row.child_run_id else None
        if child is None:
            message = f"agent step {row.name!r}: its agent run was deleted"
        elif child.status == RunStatus.DONE:
            fields: dict[str, Any] = {}
            if child.workspace is not None and self.workspace.kind == "virtual":
                # The workflow takes over the files its agent left.
                self.workspace = from_spec(child.workspace)
                fields["workspace"] = child.workspace
            with self._fenced(**fields) as now:
                WorkflowStep.objects.filter(pk=row.pk).update(status=StepStatus.DONE, result=child.result, updated_at=now)
                _event(self.run.pk, "step", name=row.name, kind=row.kind, status=StepStatus.DONE)
            return str(child.result)
        elif child.status in TERMINAL_RUN_STATUSES:
            message = f"agent step {row.name!r}: {child.agent_name} run {child.pk} {child.status}: {child.error}"
        else:
            raise _Suspend(row)
        with self._fenced() as now:
            WorkflowStep.objects.filter(pk=row.pk).update(status=StepStatus.FAILED, result={"error": message}, updated_at=now)
            _event(self.run.pk, "step", name=row.name, kind=row.kind, status=StepStatus.FAILED)
        raise StepFailed(message)

    def ask(self, key: str, question: str, schema: dict[str, Any] | None) -> Any:
        row = self._next(key, StepKind.QUESTION)
        if row is None:
            if not isinstance(question, str):
                raise WorkflowError(f"ask({key!r}, ...): the question is a string, not {type(question).__name__}")
            if schema is not None:
                if not isinstance(schema, dict):
                    raise WorkflowError(f"ask({key!r}, ...): schema is a JSON Schema (a dict), not {type(schema).__name__}")
                try:  # bounded first: what follows walks it recursively
                    schema_forms.check_schema(schema, where=f"ask({key!r}, ...)")
                    jsonschema.validators.validator_for(schema).check_schema(schema)
                except schema_forms.SchemaRefused as exc:
                    raise WorkflowError(str(exc)) from None
                except jsonschema.SchemaError as exc:
                    raise WorkflowError(f"ask({key!r}, ...): the schema is not a valid JSON Schema: {exc.message}") from exc
            row = self._record(WorkflowStep(
                name=key, kind=StepKind.QUESTION, status=StepStatus.WAITING, question=question, schema=schema,
                field_order=schema_forms.order_of(schema),
                expires_at=deadline(self.cls, timezone.now()),
            ))
            raise _Suspend(row)
        if row.status == StepStatus.ANSWERED:
            return row.result
        if row.status == StepStatus.EXPIRED:
            when = f" at {row.answered_at.isoformat(' ', 'seconds')}" if row.answered_at else ""
            raise NoAnswer(f"question {key!r} ended{when} without an answer")
        raise _Suspend(row)


# --- executing ------------------------------------------------------------------------------------


def execute_workflow(run: AgentRun) -> str:
    """One pass of a ``queued`` workflow run (``runs.execute_run`` sends workflow runs here).
    Safe to call twice: the claim is a compare-and-set."""
    token = uuid.uuid4().hex
    lease = timedelta(seconds=int(nexo_settings.LEASE_SECONDS))
    if not runs.transition(run, RunStatus.QUEUED, RunStatus.RUNNING, lease_owner=token,
                           lease_expires_at=timezone.now() + lease):
        return "skipped"
    run.status, run.lease_owner = RunStatus.RUNNING, token
    try:
        with Heartbeat(run.pk, token, lease):
            cls = _workflow_class(run)
            recorded = list(WorkflowStep.objects.filter(run_id=run.pk).order_by("seq"))
            pass_ = Pass(run, token, lease, cls, recorded)
            value = cls(pass_).call(run.options.get("payload"))
            pass_.finish()
            if not storable.is_json(value):
                raise WorkflowError(f"{cls.__name__}.call returned a {type(value).__name__}: a run's result is stored as JSON")
    except _Suspend as suspend:
        return _suspend(run, token, suspend.step)
    except _Lost:
        log.warning("workflow run %s: lease lost; another worker or a cancel took over", run.pk)
        return "lease lost"
    except DatabaseError:
        log.warning("workflow run %s: database error; the reconciler takes the run back", run.pk, exc_info=True)
        raise
    except (Exception, RunInterrupted) as exc:
        if not isinstance(exc, (WorkflowError, ConfigurationError, RunInterrupted)):
            log.exception("workflow run %s failed", run.pk)
        message = f"{type(exc).__name__}: {exc}"
        closed = _close(run, token, RunStatus.FAILED, "failed", {"error": message}, _ended(run, RunStatus.FAILED),
                        error=message, finished_at=timezone.now())
        if isinstance(exc, RunInterrupted):
            raise
        return "failed" if closed else "lease lost"
    result = json.dumps(value, ensure_ascii=False)
    if not _close(run, token, RunStatus.DONE, "done", {}, _ended(run, RunStatus.DONE), result=result, error="",
                  finished_at=timezone.now()):
        return "lease lost"
    return "done"


def _workflow_class(run: AgentRun) -> type[Any]:
    try:
        cls = import_string(run.agent)
    except ImportError as exc:
        raise ConfigurationError(f"run {run.pk}: cannot import workflow {run.agent!r}: {exc}") from exc
    # Not an issubclass check: workflow.py imports this module (a circle otherwise).
    if not (isinstance(cls, type) and callable(getattr(cls, "call", None)) and hasattr(cls, "checkpoint")):
        raise ConfigurationError(f"run {run.pk}: {run.agent} is not a Workflow")
    return cls


def _ended(run: AgentRun, status: str) -> Callable[[], Any]:
    """The channels' notice of the run's end, in its closing commit (as an agent run's)."""
    return lambda: outbox.on_ended(run.pk, status, timezone.now())


def _close(run: AgentRun, token: str, new: str, event: str, data: dict[str, Any],
           also: Callable[[], Any] | None = None, **fields: Any) -> bool:
    """End this pass (``also``: more of that commit, written only if the run was still ours)."""
    with transaction.atomic():
        closed = runs.transition(run, RunStatus.RUNNING, new, Q(lease_owner=token),
                                 lease_owner=None, lease_expires_at=None, **fields)
        if closed:
            _event(run.pk, event, **data)
            if also is not None:
                also()
    if closed:
        run.status = new
    return closed


def _suspend(run: AgentRun, token: str, step: WorkflowStep) -> str:
    asked = None
    if step.kind == StepKind.QUESTION:  # its notices, in this commit (a later pass on it: the same keys, kept)
        asked = lambda: outbox.on_question("question.asked", step, timezone.now())  # noqa: E731
    if not _close(run, token, RunStatus.SUSPENDED, "suspended", {"waiting": step.name, "kind": step.kind}, asked):
        return "lease lost"
    # What it waits for may have ended while this pass ran (its waker found the run running):
    # looked at again now that the suspension is committed, so the wake-up is never lost.
    if not still_waiting(step.pk):
        parents.wake(run.pk)
    return "suspended"


def still_waiting(step_id: Any) -> bool:
    step = WorkflowStep.objects.filter(pk=step_id).values("status", "kind", "child_run__status").first()
    if step is None or step["status"] != StepStatus.WAITING:
        return False
    return step["kind"] == StepKind.QUESTION or step["child_run__status"] not in TERMINAL_RUN_STATUSES


# --- the reconciler's part ------------------------------------------------------------------------


def changed_since(since: datetime) -> tuple[QuerySet[WorkflowStep], QuerySet[AgentRun]]:
    """What :func:`wake_forgotten` looks at: the workflow steps changed since ``since``, and the
    agent runs of workflows that ended since then."""
    return (
        WorkflowStep.objects.filter(updated_at__gte=since),
        AgentRun.objects.filter(status__in=TERMINAL_RUN_STATUSES, updated_at__gte=since, parent__isnull=False),
    )


def wake_forgotten(since: datetime | None) -> list[str]:
    """Suspended workflow runs that wait for nothing any more (their agent run ended, their
    question was answered, and the wake-up was lost with a process): queued again. Only the runs
    with a step or an agent run that changed since ``since`` are looked at (all with None)."""
    suspended = AgentRun.objects.filter(status=RunStatus.SUSPENDED, kind=RunKind.WORKFLOW).order_by()
    if since is not None:
        steps, children = changed_since(since)
        ids = set(steps.values_list("run_id", flat=True)) | set(children.values_list("parent_id", flat=True))
        suspended = suspended.filter(pk__in=sorted(ids))
    woken: list[str] = []
    for run in suspended:
        waiting = WorkflowStep.objects.filter(run_id=run.pk, status=StepStatus.WAITING).values_list("pk", flat=True)
        if not any(still_waiting(pk) for pk in waiting) and parents.wake(run.pk):
            woken.append(str(run.pk))
    return woken


def steps_of(run: AgentRun) -> list[WorkflowStep]:
    return list(WorkflowStep.objects.filter(run_id=run.pk).select_related("child_run", "answered_by").order_by("seq"))


#: stored JSON of a step's result served by the status endpoint (a bigger one: None, with its size)
STATUS_RESULT_MAX = 256_000


def status_of(run: AgentRun) -> dict[str, Any]:
    """What the JSON status endpoint adds for a workflow run: its steps in order (each result up to
    ``STATUS_RESULT_MAX`` of stored JSON), its open questions, and the calls its agents wait on."""
    steps = list(WorkflowStep.objects.filter(run_id=run.pk).defer("result").select_related("answered_by").order_by("seq"))
    small = {s.pk for s in steps if (s.result_size or 0) <= STATUS_RESULT_MAX}
    results = dict(WorkflowStep.objects.filter(pk__in=small).values_list("pk", "result"))
    return {
        "kind": RunKind.WORKFLOW,
        "result_json": decode_result(run) if run.status == RunStatus.DONE else None,
        "steps": [
            {"seq": s.seq, "name": s.name, "kind": s.kind, "status": s.status, "result": results.get(s.pk),
             "result_size": s.result_size, "agent_run": str(s.child_run_id) if s.child_run_id else None,
             "question": s.question if s.kind == StepKind.QUESTION else None,
             "schema": s.schema if s.kind == StepKind.QUESTION else None,
             "expires_at": s.expires_at.isoformat() if s.expires_at else None,
             "answered_by": str(s.answered_by) if s.answered_by_id else None}
            for s in steps
        ],
        "questions": [s.name for s in steps if s.kind == StepKind.QUESTION and s.status == StepStatus.WAITING],
        "agent_calls": [{"id": c.pk, "run": str(c.run_id), "name": c.name, "tool_call_id": c.tool_call_id}
                        for c in pending_calls(run)[:50]],
    }
