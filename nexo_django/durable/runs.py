"""The lifecycle of durable runs: start, execute (one loop), decide, cancel, retry.

Every status change is a compare-and-set ``filter(pk=..., status=expected).update(...)`` whose row
count is checked: a second click, a second approver or a duplicate job changes nothing. The hot
path (start, decide, wake, execute) runs its statements as prepared SQL (:mod:`nexo_django.sql`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone
from django.utils.module_loading import import_string

from .. import storable
from ..conf import nexo_settings
from ..core.agent import open_calls
from ..core.errors import (
    AlreadyDecided,
    ApprovalExpired,
    ApprovalRefused,
    ConfigurationError,
    Denied,
    InvalidEditedArguments,
    LeaseLost,
    MaxTurnsExceeded,
    ModelError,
    NexoError,
    SecurityError,
    StaleDecision,
    ToolArgumentError,
    TransitionError,
)
from ..core.sandboxes import from_spec
from ..core.tools import ToolContext
from ..models import (
    EVENT_COLUMNS,
    MESSAGE_COLUMNS,
    AgentRun,
    ApprovalRule,
    CallStatus,
    Decision,
    RunEvent,
    RunKind,
    RunMessage,
    RunStatus,
    ToolCall,
    Verdict,
    args_digest,
)
from ..signals import approval_decided, approval_requested, run_status_changed
from ..storable import UnstorableValue
from . import (
    agent_classes,
    binding,
    dispatch,
    driver,
    outbox,
    parents,
    refusals,
    rule_history,
    rules,
    sql,
)
from . import later as later_module
from .fixed import PENDING_APPROVAL
from .insight import tally as insight_tally
from .journal import DbJournal, Heartbeat, RunInterrupted, WorkerStopping
from .policy import check as policy_check

if TYPE_CHECKING:
    from ..core.agent import Agent

log = logging.getLogger("nexo_django.runs")

#: Which statuses a run may move to from each status. Everything else is refused.
TRANSITIONS: dict[str, frozenset[str]] = {
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.RUNNING: frozenset(
        {RunStatus.SUSPENDED, RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED,
         RunStatus.NEEDS_ATTENTION, RunStatus.QUEUED}
    ),
    RunStatus.SUSPENDED: frozenset({RunStatus.QUEUED, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.NEEDS_ATTENTION: frozenset({RunStatus.QUEUED, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.DONE: frozenset(),
    # A person takes a failed run back up where it stopped (retry_run).
    RunStatus.FAILED: frozenset({RunStatus.QUEUED}),
    RunStatus.CANCELLED: frozenset(),
}

AGENT_OPTIONS = ("cwd", "permissions", "sandbox", "model")
#: where a workflow run's pass is driven (named, as the queue names its jobs: no import circle)
WORKFLOW_FUNC = "nexo_django.durable.workflow_runs.execute_workflow"
WORKFLOW_CANCELLED = "nexo_django.durable.workflow_questions.expire_open_questions"
ACTIVE_OR_WAITING = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SUSPENDED, RunStatus.NEEDS_ATTENTION)
#: The key of ``AgentRun.options`` that pins a local workspace (see :func:`check_workspace`).
WORKSPACE_PIN = "_workspace"
#: The key of ``AgentRun.options`` naming what started the run (``{"schedule": id, "name": ...}``).
ORIGIN = "_schedule"

#: Constructor arguments that are not JSON, kept for runs started in this process only.
_LIVE_OPTIONS: dict[str, dict[str, Any]] = {}


def transition(run: AgentRun | Any, old: str, new: str, *conditions: Any, **fields: Any) -> bool:
    """Compare-and-set one run from ``old`` to ``new`` (where ``conditions`` hold too). False when
    another actor moved it first."""
    if new not in TRANSITIONS[old]:
        raise TransitionError(f"a run cannot go from {old} to {new}")
    run_id = run.pk if isinstance(run, AgentRun) else run
    fields.setdefault("updated_at", timezone.now())
    updated = AgentRun.objects.filter(*conditions, pk=run_id, status=old).update(status=new, **fields)
    if updated:
        _status_changed(run_id, old, new)
    return bool(updated)


def _status_changed(run_id: Any, old: str, new: str) -> None:
    if not driver.listened(run_status_changed, AgentRun):
        return

    def send() -> None:
        run = AgentRun.objects.filter(pk=run_id).first()
        if run is not None:
            run_status_changed.send(sender=AgentRun, run=run, old=old, new=new)

    transaction.on_commit(send)


def _event(run_id: Any, type: str, **data: Any) -> None:
    sql.create(RunEvent(run_id=run_id, type=type, data=data))


def _user(user: Any) -> Any:
    return user if user is not None and getattr(user, "is_authenticated", False) else None


# --- starting ------------------------------------------------------------------------------------


def _check_user(cls: type[Agent], method: str, user: Any) -> None:
    # Here, not at the top: django.contrib.auth is optional (its models load only when the project
    # installs it), and this module loads with the app whether or not it does.
    from django.contrib.auth.base_user import AbstractBaseUser
    from django.contrib.auth.models import AnonymousUser

    if user is not None and not isinstance(user, (AbstractBaseUser, AnonymousUser)):
        raise TypeError(
            f"{cls.__name__}.{method}(user={user!r}): user must be a user object such as "
            "request.user (or None), not a name or an id"
        )


def _refresh_at_commit(run: AgentRun) -> None:
    """An inline queue runs the job at commit: refresh the object the caller holds right after,
    so ``run.status`` is not stale (at once outside a transaction, at its commit inside one)."""
    if not dispatch.is_inline():
        return

    def refresh() -> None:
        with contextlib.suppress(AgentRun.DoesNotExist):
            run.refresh_from_db()

    transaction.on_commit(refresh)


def start_run(cls: type[Agent], prompt: str, *, user: Any = None, later: bool, at: datetime | None = None,
              origin: dict[str, Any] | None = None, **kwargs: Any) -> AgentRun:
    """``origin``: what started the run, kept in its options (a schedule: ``durable/schedules.py``)."""
    method = "run_later" if later else "run"
    wait = later_module.not_before(f"{cls.__name__}.run_later", at)
    unknown = sorted(set(kwargs) - set(AGENT_OPTIONS))
    if unknown:
        raise TypeError(
            f"{cls.__name__}.{method}() got unknown argument(s) {', '.join(unknown)}; "
            f"it takes {', '.join(AGENT_OPTIONS)} and user"
        )
    _check_user(cls, method, user)
    options: dict[str, Any] = {}
    live: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key == "cwd" and value is not None:
            value = os.fspath(value)
        if storable.is_json(value):
            options[key] = value
        elif later:
            raise ConfigurationError(
                f"{cls.__name__}.run_later({key}={value!r}): a worker in another process rebuilds the "
                f"agent from JSON, and this value is not JSON. Pass a mode name or a 'provider:model' "
                f"string, or declare it on the {cls.__name__} class."
            )
        else:
            live[key] = value
    # Build the agent now so a configuration error reaches the caller before anything is stored.
    try:
        agent = cls(**options, **live)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{cls.__name__}.{method}(...): {exc}") from exc
    if agent.workspace.kind == "local":
        # Pinned now: a resume hours later acts in this folder or not at all (a link in front of
        # it may be flipped meanwhile; see check_workspace).
        options[WORKSPACE_PIN] = agent.workspace.identity()  # type: ignore[attr-defined]
    if origin:
        options[ORIGIN] = origin
    run = driver.new(
        AgentRun, agent=cls.path(), prompt=prompt, status=RunStatus.QUEUED, created_by=_user(user),
        options={**options, "_live": sorted(live)} if live else options, generation=1,
        workspace=agent.workspace.spec() if agent.workspace.kind == "virtual" else None,
        **({"not_before": wait} if wait is not None else {}),
    )
    messages = agent.initial_messages(prompt)
    if live:
        _LIVE_OPTIONS[str(run.pk)] = live
    if not later:
        # Stored by the first commit of its journal (at the latest: suspended or done), so a
        # run that stops for a person costs one write transaction to start. Should this process
        # die before that, no run exists: the caller never got one either.
        if _drive(run, uuid.uuid4().hex, agent, messages, start="insert") == "lease lost":
            sql.refresh(run)  # someone else changed it (a cancel); otherwise the journal kept it current
        return run
    # One write transaction (one statement on PostgreSQL): the run, its messages, its event. The
    # job is sent once it commits (inside the caller's transaction: when that commits).
    now = timezone.now()
    batch = sql.Batch()
    batch.gate_create(run)
    batch.insert(RunMessage, MESSAGE_COLUMNS, [(run.pk, i, m["role"], m, now) for i, m in enumerate(messages)])
    batch.insert(RunEvent, EVENT_COLUMNS, [(run.pk, "created", {"agent": cls.path(), "later": True}, now)])
    batch.run()
    dispatch.enqueue_run(run.pk, run.generation, at=wait)
    _refresh_at_commit(run)
    return run


def build_agent(run: AgentRun) -> Agent:
    """Rebuild the run's agent from what the database holds."""
    try:
        cls = agent_classes.agent_class(run.agent)
    except ImportError as exc:
        raise ConfigurationError(f"run {run.pk}: cannot import agent {run.agent!r}: {exc}") from exc
    options = {k: v for k, v in run.options.items() if not k.startswith("_")}  # "_live", WORKSPACE_PIN
    live = _LIVE_OPTIONS.get(str(run.pk), {})
    missing = [k for k in run.options.get("_live", []) if k not in live]
    if missing:
        raise ConfigurationError(
            f"run {run.pk} was started with non-JSON {', '.join(missing)} in another process; declare "
            f"them on {run.agent} so any worker can rebuild the agent"
        )
    options.update(live)
    if run.workspace is not None and "sandbox" not in live:
        options["sandbox"] = from_spec(run.workspace)
    agent: Agent = cls(**options)
    check_workspace(run, agent)
    return agent


def check_workspace(run: AgentRun, agent: Agent) -> None:
    """Refuse (``SecurityError``) to act for ``run`` in a workspace other than the one it started
    in: its real path and its identity (``st_dev``/``st_ino``) as pinned by :func:`start_run`. A
    link in front of the folder flipped while a call waited, or the folder replaced by another of
    the same name, would make an approved call act where the person never looked."""
    pin = run.options.get(WORKSPACE_PIN)
    if pin is None:
        return  # a virtual sandbox, or a run started before workspaces were pinned
    workspace = agent.workspace
    now = workspace.identity() if workspace.kind == "local" else None  # type: ignore[attr-defined]
    if now != pin:
        where = "a sandbox that is not a folder" if now is None else f"{now['root']} (device {now['dev']}, inode {now['ino']})"
        agent.close()
        raise SecurityError(
            f"run {run.pk} started in the workspace {pin['root']} (device {pin['dev']}, inode {pin['ino']}); "
            f"its cwd now leads to {where}. Refusing to act in a different workspace: cancel the run "
            "and start a new one where you mean it to act."
        )


# --- executing -----------------------------------------------------------------------------------


def execute_run(run_id: str) -> str:
    """Drive a ``queued`` run until it finishes or suspends. Safe to call twice: the run is claimed
    (compare-and-set) by the journal's first commit, together with what that commit writes (the
    ``executing`` mark of an approved call, or before the first model request at the latest)."""
    run, messages = sql.run_and_messages(run_id, RunStatus.QUEUED)
    if run is None:
        return "skipped"
    if run.kind == RunKind.WORKFLOW:
        return str(import_string(WORKFLOW_FUNC)(run))
    return _drive(run, uuid.uuid4().hex, None, messages, start="claim")


def _drive(
    run: AgentRun, token: str, agent: Agent | None, messages: list[dict[str, Any]] | None, *, start: str,
) -> str:
    """Drive the run; ``start`` is the journal's (``"claim"`` a queued run, ``"insert"`` a new one)."""
    run_id = str(run.pk)
    lease = timedelta(seconds=int(nexo_settings.LEASE_SECONDS))
    if start == "insert":
        run.status, run.lease_owner, run.lease_expires_at = RunStatus.RUNNING, token, timezone.now() + lease
    journal: DbJournal | None = None
    try:
        agent = agent or build_agent(run)
        journal = DbJournal(
            run, token, agent, messages=messages, start=start,
            started=lambda: _status_changed(run_id, RunStatus.QUEUED, RunStatus.RUNNING),
        )
        with Heartbeat(run_id, token, lease):
            outcome = agent.drive(journal)
    except LeaseLost:
        log.warning("run %s: lease lost; another worker or a cancel took over", run_id)
        return "lease lost"
    except WorkerStopping:
        assert journal is not None  # raised by the journal only
        return _hand_back(run, journal)
    except DatabaseError:
        # The database went away (a restart, a failover): nothing is wrong with the run, so it is
        # not marked failed. Its lease expires and the reconciler takes it back.
        log.warning("run %s: database error; the reconciler takes the run back", run_id, exc_info=True)
        raise
    except (Exception, RunInterrupted) as exc:  # the run records why it failed; the worker stays healthy
        failed = _fail(run, journal, exc, start)
        if isinstance(exc, RunInterrupted):
            raise  # its job fails too (rq's failed registry says why)
        return failed
    if outcome.kind == "done":
        # A run that recovered (a retry, a settled unknown outcome) keeps no old error beside Done.
        new, fields = RunStatus.DONE, {"result": outcome.content, "error": ""}
    elif outcome.kind == "stopped":
        new, fields = RunStatus.CANCELLED, {"error": outcome.content or "stopped by the approver"}
    else:
        new, fields = RunStatus.SUSPENDED, {}
    try:
        closed = journal.close(new, **fields)
    except UnstorableValue as exc:  # the turn's last writes were refused: the run fails with why
        journal.drop_unsaved()
        if not _close_failed(journal, f"{type(exc).__name__}: {exc}"):
            return "lease lost"
        _status_changed(run_id, RunStatus.RUNNING, RunStatus.FAILED)
        parents.child_ended(run)
        return "failed"
    if not closed:
        return "lease lost"
    _status_changed(run_id, RunStatus.RUNNING, new)
    if new != RunStatus.SUSPENDED:
        parents.child_ended(run)  # an agent run inside a workflow wakes it
    if new == RunStatus.SUSPENDED:
        # Standing rules decide what they match at once (a decision each, through decide());
        # only what is left waits for a person, and only that is announced.
        new_pending = _apply_rules(run, journal.new_pending)
        if new_pending:
            transaction.on_commit(lambda: _send_requested(new_pending, run))
        if len(new_pending) < len(journal.new_pending):
            # The rules' decisions may have woken the run (an inline queue ran it already).
            sql.refresh(run)
            if run.is_terminal:
                _LIVE_OPTIONS.pop(str(run_id), None)
            return str(run.status)
    else:
        _LIVE_OPTIONS.pop(str(run_id), None)
    return str(new)


def _fail(run: AgentRun, journal: DbJournal | None, exc: BaseException, start: str) -> str:
    """Record why the run failed (closed ``failed`` by its journal, or never claimed); what the
    drive returns."""
    run_id = str(run.pk)
    message = f"{type(exc).__name__}: {exc}"
    quiet = (SecurityError, ConfigurationError, MaxTurnsExceeded, ModelError, UnstorableValue, RunInterrupted)
    if not isinstance(exc, quiet):
        log.exception("run %s failed: %s", run_id, message)
    else:  # an expected failure (a provider's 401, a timeout): its reason, without a traceback
        log.error("run %s failed: %s", run_id, message)
    if journal is not None:
        if isinstance(exc, UnstorableValue):
            journal.drop_unsaved()  # what the database refused is not written again
        if not _close_failed(journal, message):
            return "lease lost"
    elif start == "insert":
        # No journal (the agent could not be built): the run's row and its run.failed notices
        # commit together, as a journal's closing commit writes them.
        with transaction.atomic():
            run.status, run.error, run.lease_owner, run.finished_at = RunStatus.FAILED, message, None, timezone.now()
            run.save(force_insert=True)
            outbox.on_ended(run_id, "failed", run.finished_at)
    elif _fail_queued(run_id, message):  # the agent could not be rebuilt: nothing was claimed yet
        if isinstance(exc, SecurityError):  # audited, as a security error of a call is
            _event(run_id, "security", error=message)
        _status_changed(run_id, RunStatus.QUEUED, RunStatus.FAILED)
        parents.child_ended(run)
        return "failed"
    else:
        return "skipped"
    _status_changed(run_id, RunStatus.RUNNING, RunStatus.FAILED)
    parents.child_ended(run)
    return "failed"


def _fail_queued(run_id: str, message: str) -> bool:
    """Fail a queued run no journal claimed, with its run.failed notices in the same commit."""
    with transaction.atomic():
        now = timezone.now()
        if not AgentRun.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
                status=RunStatus.FAILED, error=message, lease_owner=None, finished_at=now):
            return False
        outbox.on_ended(run_id, "failed", now)
    return True


def _hand_back(run: AgentRun, journal: DbJournal) -> str:
    """Give a run back to the queue at its commit, its worker shutting down: held, it is closed as
    ``queued`` (fenced, with what was buffered); not claimed yet, it was never taken. Then a new
    generation and its job, so another worker picks it up at once rather than after its lease."""
    run_id = str(run.pk)
    if journal.held:
        if not journal.close(RunStatus.QUEUED):
            return "lease lost"
        _status_changed(run_id, RunStatus.RUNNING, RunStatus.QUEUED)
    if AgentRun.objects.filter(pk=run_id, status=RunStatus.QUEUED, generation=run.generation).update(
        generation=F("generation") + 1, updated_at=timezone.now()
    ):
        run.generation += 1
        dispatch.enqueue_run(run_id, run.generation)
    log.info("run %s: handed back to the queue (its worker is shutting down)", run_id)
    return "handed back"


def _close_failed(journal: DbJournal, message: str) -> bool:
    """Close the run as failed with ``message``. Should even that be refused (what came with an
    inserted run), it is closed with nothing but its status and error: the run never stays
    ``running`` on data the database refuses, and the model is not asked again."""
    journal.emit("failed", {"error": message})
    try:
        return journal.close(RunStatus.FAILED, error=message)
    except UnstorableValue as exc:
        journal.forget_all()
        message = f"{message}; and then: {exc}"
        journal.emit("failed", {"error": message})
        return journal.close(RunStatus.FAILED, error=message)


def _apply_rules(run: AgentRun, calls: list[ToolCall]) -> list[ToolCall]:
    """Decide the calls a standing rule matches; the calls left waiting for a person."""
    if not calls:
        return calls
    chosen = rules.choose(calls, run.agent, timezone.now(), starter_id=run.created_by_id)
    if not chosen:
        return calls
    left: list[ToolCall] = []
    for call in calls:
        rule = chosen.get(call.pk)
        if rule is None:
            left.append(call)
            continue
        try:
            decide(call, approved=rule.verdict == Verdict.APPROVED, note=rule.note, source="rule", rule=rule)
            if call.status == CallStatus.FAILED:
                return []  # the sandbox refused it: the run ended (durable.refusals), nothing waits
        except AlreadyDecided:
            pass  # a person was faster: theirs stands
        except ApprovalRefused:
            left.append(call)  # it could not run as the rule approves it: a person decides
    return left


def _send_requested(calls: list[ToolCall], run: AgentRun) -> None:
    for call in calls:
        approval_requested.send(sender=ToolCall, tool_call=call, run=run)


# --- deciding ------------------------------------------------------------------------------------


def check_edited_args(run: AgentRun, call: ToolCall, args: Any) -> None:
    """Refuse (``InvalidEditedArguments``) arguments an approver edited that do not fit the tool's
    schema, the sandbox or the gate. ``decide`` calls it; the admin calls it to review first."""
    if call.capability == "mcp":
        # The server's schema validates them when the call runs; starting servers here would
        # run programs inside a web request.
        if not isinstance(args, dict):
            raise InvalidEditedArguments("edited arguments must be a JSON object")
        return
    try:
        agent = build_agent(run)
    except SecurityError as exc:
        raise InvalidEditedArguments(f"edited arguments refused: {exc}") from exc
    tool = agent.local_tools().get(call.name)
    if tool is None:
        raise InvalidEditedArguments(f"the agent has no tool {call.name!r} any more")
    try:
        tool.validate(args)
        if isinstance(args.get("path"), str):
            if tool.capability == "write":
                agent.workspace.check_writable(args["path"])
            else:
                agent.workspace.normalize(args["path"])
        tool.gate(args, ToolContext(sandbox=agent.workspace, permissions=agent.gate.with_decision(True)))
    except (ToolArgumentError, Denied, SecurityError) as exc:
        raise InvalidEditedArguments(f"edited arguments refused: {exc}") from exc
    finally:
        agent.close()


def file_versions_now(run: AgentRun, calls: list[ToolCall]) -> dict[int, str | None]:
    """For each pending ``write`` of ``calls``: the version of the file it would write over as it
    is now (``""``: no such file), which an approval may be bound to (``decide(...,
    file_version=)``); None for another call or a file that cannot be looked at. A front end shows
    the file, then sends this. The agent is rebuilt once, and only when there is a write."""
    versions: dict[int, str | None] = {c.pk: None for c in calls}
    paths = {c.pk: c.args["path"] for c in calls if c.capability == "write" and c.name == "write"
             and isinstance(c.args, dict) and isinstance(c.args.get("path"), str)}
    if not paths:
        return versions
    try:
        agent = build_agent(run)
    except Exception:  # an agent that no longer imports: nothing to bind to
        return versions
    try:
        for pk, path in paths.items():
            with contextlib.suppress(SecurityError, OSError, NexoError):
                versions[pk] = agent.workspace.version(path) or ""
    finally:
        agent.close()
    return versions


def check_file_version(call: ToolCall, *, approved: bool, args: Any, file_version: str | None) -> None:
    if file_version is None:
        return
    if not approved or args is not None:
        raise InvalidEditedArguments(
            "a file version goes with a plain approval (the arguments the page showed), not with a "
            "denial or edited arguments"
        )
    if call.capability != "write":
        raise InvalidEditedArguments(f"a file version goes with a write, and {call.name} is not one")
    if not isinstance(file_version, str) or len(file_version) > 128:
        raise InvalidEditedArguments("a file version is the version string the page showed (at most 128 characters)")


def decide(
    call: ToolCall, *, approved: bool, by: Any = None, note: str = "", args: dict[str, Any] | None = None,
    stop: bool = False, digest: str | None = None, source: str = "api", rule: ApprovalRule | None = None,
    file_version: str | None = None,
) -> Decision:
    """Record one decision, exactly once, and wake the run when it was the last pending call.
    ``source="expiry"`` is the reconciler's (nobody decided in time); ``rule`` the standing rule
    that made it. With ``NEXO["SELF_APPROVAL"]`` off the run's starter is refused
    (``PermissionDenied``, nothing recorded). ``file_version`` binds an approval of a ``write`` to
    a later file version the approver was shown; an approval without one is bound to the version
    at suspension, the one every notice showed. One whose target the sandbox refuses now is
    recorded with the call and its run failed (``SecurityError``: :mod:`.refusals`); one that
    cannot be looked at now is refused (``ApprovalRefused``, nothing recorded): :mod:`.binding`."""
    if args is not None and not approved:
        raise InvalidEditedArguments("edited arguments go with an approval, not a denial")
    check_file_version(call, approved=approved, args=args, file_version=file_version)
    gone = f"run {call.run_id} of {call.name} call {call.tool_call_id} no longer exists"
    now = timezone.now()
    if source != "expiry":
        # A request past its deadline is the reconciler's to expire, never a person's to approve.
        if call.expires_at is not None and call.expires_at <= now:
            raise ApprovalExpired(
                f"{call.name} call {call.tool_call_id} expired at {call.expires_at.isoformat(' ', 'seconds')} "
                "without a decision; it can no longer be decided"
            )
        if _user(by) is not None and not nexo_settings.SELF_APPROVAL:
            check_not_requester(call, _user(by))
    # An approval policy's groups, quorum and four eyes (durable.policy.check): refused, or an
    # approval recorded that is not yet the last one needed (returned, nothing decided).
    if (held := policy_check.gate(call, by=_user(by), approved=approved, args=args, note=note, digest=digest,
                                  source=source, now=now, rule=rule)) is not None:
        return held
    run: AgentRun | None = call.run if ToolCall.run.is_cached(call) else None
    if args is not None or (approved and binding.needs_binding(call)):
        run = run or sql.get(AgentRun, id=call.run_id)
        if run is None:
            raise AgentRun.DoesNotExist(gone)
        if args is not None:
            check_edited_args(run, call, args)
    if approved and run is not None:
        # Runs as approved, or refused now (ApprovalRefused, nothing recorded): see durable.binding.
        bound = run
        try:
            file_version = binding.bind(call, call.args if args is None else args, build=lambda: build_agent(bound),
                                        shown=file_version)
        except binding.SandboxRefusal as refusal:
            # It could never run: the approval is recorded, and the call and its run fail.
            return refusals.fail_refused(
                call, refusal, now=now, digest=digest, lost=lambda: _not_decided(call, source, gone),
                changed=_status_changed,
                decided={"note": note, "args": args, "digest": args_digest(args) if args is not None else call.digest,
                         "decided_by": _user(by), "source": source, "rule": rule},
            )
    verdict = Verdict.APPROVED if approved else Verdict.DENIED
    # An expired call is told apart from a denied one in every list and count.
    status = CallStatus.APPROVED if approved else CallStatus.EXPIRED if source == "expiry" else CallStatus.DENIED
    # One batch, one statement on PostgreSQL: the compare-and-set is its gate (still pending, and
    # if given the digest the person saw); then the decision, its event, and the wake-up if no
    # other call of the run is still pending.
    # The status as a literal (durable.fixed): the statement then uses ToolCall's partial indexes.
    match = {"id": call.pk, "status": PENDING_APPROVAL}
    if digest is not None:
        match["digest"] = digest
    batch = sql.Batch()
    # The run's lock before the call's: a cancel, a worker and the reconciler lock the run first;
    # a decision taking the call first deadlocked against a cancel on PostgreSQL.
    batch.lock_first(AgentRun, call.run_id)
    batch.gate(ToolCall, match, {"status": status, "updated_at": now})
    decision = driver.new(
        Decision, tool_call=call, verdict=verdict, note=note, args=args, stop=stop and not approved,
        digest=args_digest(args) if args is not None else call.digest,
        decided_by=_user(by), source=source, rule=rule, file_version=file_version,
        rule_said=rule_history.said(rule) if rule is not None else None,
    )
    batch.create([decision])
    # The approvals dashboard's tallies, in the same commit (durable.insight.tally).
    reviewer, rule_id = getattr(_user(by), "pk", None), getattr(rule, "pk", None)
    insight_tally.record(batch, call, verdict=verdict, source=source, reviewer=reviewer, rule=rule_id, at=now)
    event = {"call": call.tool_call_id, "verdict": str(verdict), "edited": args is not None,
             "by": str(_user(by) or ""), "source": source}  # fmt: skip
    if rule is not None:
        event["rule"] = rule.pk
    kind = "expired" if source == "expiry" else "decision"
    run_id = call.run_id
    if stop and not approved:
        # Deny and stop ends the run now: no other call of it runs, decided or not.
        def expire() -> None:
            expired = ToolCall.objects.filter(
                run_id=run_id, status__in=(CallStatus.PENDING_APPROVAL, CallStatus.APPROVED)
            ).update(status=CallStatus.EXPIRED, updated_at=now)
            _event(run_id, kind, **event, **({"expired": expired} if expired else {}))

        batch.call(expire)
    else:
        batch.insert(RunEvent, EVENT_COLUMNS, [(run_id, kind, event, now)])
    pending = PENDING_APPROVAL
    woken = batch.requeue(run_id, RunStatus.SUSPENDED, RunStatus.QUEUED, now, unless_pending=pending, besides=call.pk)
    notices = outbox.on_decided(batch, call, source, now)  # the channels hear of it: same commit
    if not batch.run():
        _not_decided(call, source, gone)
    call.status = status
    outbox.wake(notices)
    generation = batch.generations.get(woken)
    if generation is None:
        # Another call was still pending when the batch ran. No lock serialises two decisions on
        # one run: each batch may have seen the other's call still pending (one snapshot each).
        # So each looks again once its own is committed, and the later look sees both decided.
        # The wake-up is a compare-and-set on the status: of two that look, one wakes the run.
        generation = sql.requeue_fetch(run_id, RunStatus.SUSPENDED, RunStatus.QUEUED, timezone.now(), unless_pending=pending)
    if generation is not None:
        _status_changed(run_id, RunStatus.SUSPENDED, RunStatus.QUEUED)
        dispatch.enqueue_run(run_id, generation)
    transaction.on_commit(lambda: approval_decided.send(sender=ToolCall, tool_call=call, decision=decision))
    return decision


def _not_decided(call: ToolCall, source: str, gone: str) -> None:
    """Raise why a decision's compare-and-set did not match."""
    current = ToolCall.objects.filter(pk=call.pk).first()
    if current is None:
        raise AgentRun.DoesNotExist(gone)
    if current.status == CallStatus.EXPIRED and source != "expiry":
        raise ApprovalExpired(f"{current.name} call {current.tool_call_id} expired (nobody decided in time, "
                              "or its run ended); it can no longer be decided")
    if current.status != CallStatus.PENDING_APPROVAL:
        raise AlreadyDecided(f"{current.name} call {current.tool_call_id} was already decided ({current.status})")
    raise StaleDecision(
        f"the arguments of {current.name} are not the ones you saw; reload the page and decide again"
    )


def check_not_requester(call: ToolCall, user: Any) -> None:
    """``PermissionDenied`` if ``user`` started the call's run (with self-approval off, a second
    person decides)."""
    run = call.run  # cached on calls read through run.pending_calls()
    if run.created_by_id is not None and run.created_by_id == user.pk:
        raise PermissionDenied(
            f"{user} started this run and cannot decide its calls: NEXO['SELF_APPROVAL'] is off, "
            "so another person with the decide permission must"
        )


def wake(run: AgentRun, old: str, *conditions: Any, unless_pending: bool = False) -> bool:
    """Queue the run again (if ``conditions`` hold; with ``unless_pending`` only when no call of it
    waits for a decision) and send its job at commit."""
    generation = run.generation + 1
    if conditions:
        if unless_pending:
            conditions += (~Exists(
                ToolCall.objects.filter(run_id=OuterRef("pk"), status=CallStatus.PENDING_APPROVAL)
            ),)
        if not transition(run, old, RunStatus.QUEUED, *conditions, generation=F("generation") + 1, lease_owner=None):
            return False
    else:
        # The common wake-ups (a decision, a retry, a recovery) as one prepared statement.
        if RunStatus.QUEUED not in TRANSITIONS[old]:
            raise TransitionError(f"a run cannot go from {old} to {RunStatus.QUEUED}")
        pending = PENDING_APPROVAL if unless_pending else None
        if not sql.requeue(run.pk, old, RunStatus.QUEUED, timezone.now(), unless_pending=pending):
            return False
        _status_changed(run.pk, old, RunStatus.QUEUED)
    run.generation = generation
    dispatch.enqueue_run(run.pk, generation)
    return True


def decide_all(run: AgentRun, *, approved: bool, by: Any = None, note: str = "") -> AgentRun:
    """The seed's form: approve (or deny) every pending call of the run at once."""
    with transaction.atomic():
        pending = list(run.pending_calls())
        if not pending:
            raise TransitionError(f"run {run.pk} has no pending calls (status {run.status})")
        for call in pending:
            decide(call, approved=approved, by=by, note=note, source="resume")
            if call.status == CallStatus.FAILED:
                break  # the sandbox refused it: the run ended and its other calls with it (durable.refusals)
    run.refresh_from_db()
    return run


def cancel_run(run: AgentRun, *, by: Any = None, reason: str = "") -> bool:
    with transaction.atomic():
        # The run first (its compare-and-set below), then its calls: the order of every writer
        # of a run and its calls (a decision locks the run before its call: Batch.lock_first).
        for old in (RunStatus.SUSPENDED, RunStatus.QUEUED, RunStatus.NEEDS_ATTENTION, RunStatus.RUNNING):
            if transition(run, old, RunStatus.CANCELLED, lease_owner=None, finished_at=timezone.now(),
                          error=reason or "cancelled"):
                ToolCall.objects.filter(run_id=run.pk, status=CallStatus.PENDING_APPROVAL).update(
                    status=CallStatus.EXPIRED, updated_at=timezone.now()
                )
                _event(run.pk, "cancelled", by=str(_user(by) or ""), reason=reason)
                outbox.wake(outbox.write("run.cancelled", run.pk, timezone.now()))
                run.refresh_from_db()
                # Its open questions end with it: a workflow's, and an MCP server's of an agent run
                # that waited (durable.elicitation).
                if run.kind == RunKind.WORKFLOW or old == RunStatus.SUSPENDED:
                    import_string(WORKFLOW_CANCELLED)(run)
                if run.kind == RunKind.WORKFLOW:  # its agents stop with it
                    for child in AgentRun.objects.filter(parent_id=run.pk, status__in=ACTIVE_OR_WAITING):
                        cancel_run(child, by=by, reason="its workflow was cancelled")
                parents.child_ended(run)
                return True
    return False


def retry_run(run: AgentRun, *, by: Any = None) -> bool:
    with transaction.atomic():
        unknown = ToolCall.objects.filter(run_id=run.pk, status=CallStatus.OUTCOME_UNKNOWN)
        if unknown.exists():
            raise TransitionError(
                f"run {run.pk} still has a call whose outcome is unknown; resolve it first "
                "(tool_call.resolve_unknown(rerun=...))"
            )
        current = AgentRun.objects.get(pk=run.pk)
        if current.status == RunStatus.FAILED:
            woke = retry_failed(current)
        else:
            woke = wake(current, RunStatus.NEEDS_ATTENTION)
        if woke:
            _event(run.pk, "retried", by=str(_user(by) or ""))
    run.refresh_from_db()
    return woke


def retry_failed(run: AgentRun) -> bool:
    """Queue a ``failed`` run again, from its last committed turn: its transcript holds every
    result that was recorded, so nothing that ran runs again and the model is asked only for the
    turn that failed. A call that failed the run (refused loudly) gets its recorded error as its
    result, so it is not run a second time either."""
    if not transition(run, RunStatus.FAILED, RunStatus.QUEUED, generation=F("generation") + 1, lease_owner=None,
                      lease_expires_at=None, finished_at=None, error="", recoveries=0):
        return False
    messages = [m.data for m in RunMessage.objects.filter(run_id=run.pk).order_by("seq")]
    open_ids = [c["id"] for c in open_calls(messages)]
    failed = ToolCall.objects.filter(run_id=run.pk, tool_call_id__in=open_ids, status=CallStatus.FAILED)
    seq = len(messages)
    for call in failed.order_by("created_at", "id"):
        result = call.result if isinstance(call.result, dict) and "error" in call.result else {"error": f"{call.name} failed"}
        RunMessage.objects.create(
            run_id=run.pk, seq=seq, role="tool",
            data={"role": "tool", "tool_call_id": call.tool_call_id, "name": call.name, "content": result},
        )
        seq += 1
    run.generation += 1
    dispatch.enqueue_run(run.pk, run.generation)
    return True


def resolve_unknown(call: ToolCall, *, by: Any = None, rerun: bool, note: str = "") -> None:
    with transaction.atomic():
        # The run's row first, as every writer of a run's events and calls takes it (the order
        # that keeps PostgreSQL from deadlocking, and the event ids in commit order for the
        # stream: durable.live).
        sql.lock(AgentRun, call.run_id)
        if rerun:
            updated = ToolCall.objects.filter(pk=call.pk, status=CallStatus.OUTCOME_UNKNOWN).update(
                status=CallStatus.APPROVED, updated_at=timezone.now()
            )
        else:
            result = {"error": "outcome unknown: the worker stopped while this call ran, and a person "
                      "chose not to run it again" + (f": {note}" if note else "")}
            updated = ToolCall.objects.filter(pk=call.pk, status=CallStatus.OUTCOME_UNKNOWN).update(
                status=CallStatus.FAILED, result=result, updated_at=timezone.now()
            )
            if updated:
                seq = RunMessage.objects.filter(run_id=call.run_id).count()
                RunMessage.objects.create(
                    run_id=call.run_id, seq=seq, role="tool",
                    data={"role": "tool", "tool_call_id": call.tool_call_id, "name": call.name, "content": result},
                )
        if not updated:
            raise AlreadyDecided(f"{call.name} call {call.tool_call_id} is not waiting for a person")
        _event(call.run_id, "outcome_resolved", call=call.tool_call_id, rerun=rerun, note=note,
               by=str(_user(by) or ""))
    call.refresh_from_db()
