"""Durable state: runs, their transcript rows, gated calls, decisions, events.

The models hold the data; what a run *does* (decide, resume, cancel, retry, the prepared reads)
is the durable layer's, which imports these models. The methods below reach it through
:func:`operations`, which ``apps.NexoDjangoConfig.ready()`` installs: the models import nothing
from above them.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import models, router
from django.db.models.functions import Cast, Substr
from django.db.models.lookups import GreaterThan
from django.db.models.query import MAX_GET_RESULTS

from .core.errors import ConfigurationError
from .display import mark_hidden
from .schedule_models import Schedule, ScheduleSlot  # noqa: F401 - registered with the app
from .storable import StoredJSONField, StoredTextField

if TYPE_CHECKING:
    from django.db.models import QuerySet


class Operations(Protocol):
    """What the durable layer does for the models' methods (``nexo_django.durable.operations``):
    ``nexo_django.durable.runs``' functions of the same names, and its prepared reads."""

    decide: Callable[..., Decision]
    decide_all: Callable[..., AgentRun]
    cancel_run: Callable[..., bool]
    retry_run: Callable[..., bool]
    resolve_unknown: Callable[..., None]
    follow_up: Callable[..., AgentRun]
    conversation: Callable[..., list[AgentRun]]

    def refresh(self, obj: models.Model, alias: str) -> None: ...
    def pending_rows(self, run: AgentRun, *, limit: int | None, alias: str) -> list[ToolCall]: ...


_operations: list[Operations] = []


def install_operations(ops: Operations) -> None:
    """Called once, by the app's ``ready()``."""
    _operations[:] = [ops]


def operations() -> Operations:
    if not _operations:
        raise ConfigurationError(
            "nexo_django's durable layer is not loaded: add \"nexo_django\" to INSTALLED_APPS "
            "and call django.setup() before using runs"
        )
    return _operations[0]


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def args_digest(args: Any) -> str:
    """sha256 of the canonical JSON of a call's arguments: what a person sees is what runs.
    The arguments are stored exactly (``storable``), so it is the same after the database's
    round trip; ``surrogatepass`` gives a lone surrogate a digest of its own."""
    return hashlib.sha256(canonical_json(args).encode("utf-8", "surrogatepass")).hexdigest()


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUSPENDED = "suspended"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    NEEDS_ATTENTION = "needs_attention"


TERMINAL_RUN_STATUSES = frozenset({RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED})
ACTIVE_RUN_STATUSES = frozenset({RunStatus.QUEUED, RunStatus.RUNNING})


class CallStatus(models.TextChoices):
    PENDING_APPROVAL = "pending_approval"
    APPROVED = "approved"
    DENIED = "denied"
    EXECUTING = "executing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    OUTCOME_UNKNOWN = "outcome_unknown"
    EXPIRED = "expired"


class Verdict(models.TextChoices):
    APPROVED = "approved"
    DENIED = "denied"


class RunKind(models.TextChoices):
    AGENT = "agent"
    WORKFLOW = "workflow"


class AgentRun(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.CharField(max_length=255, help_text="Dotted path of the Agent class.")
    prompt = StoredTextField()
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED)
    result = StoredTextField(null=True, blank=True)  # noqa: DJ001 - None: no final answer yet
    error = StoredTextField(blank=True, default="")
    # No index of its own: (created_by, created_at) below serves every lookup by user.
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="agent_runs",
        db_index=False,
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    usage = StoredJSONField(default=dict, blank=True)
    #: JSON constructor arguments that rebuild the agent in another process (cwd, model, ...).
    options = StoredJSONField(default=dict, blank=True)
    #: The virtual sandbox's files between steps (the local sandbox lives on disk).
    workspace = StoredJSONField(null=True, blank=True)
    lease_owner = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001 - None: unclaimed
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    #: Bumped at every wake-up; part of the deterministic rq job id.
    generation = models.PositiveIntegerField(default=0)
    recoveries = models.PositiveIntegerField(default=0)
    #: The run this one follows up (``run.follow_up()``): its conversation's transcript comes
    #: first. One follow-up per run (the conversation is a line); the one after is ``next_run``.
    #: An earlier run is kept while a later one needs its rows (PROTECT).
    previous = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="next_run",
        help_text="The run this one continues (a follow-up).",
    )
    #: "agent", or "workflow": then ``agent`` is the Workflow class's path and its steps are
    #: ``WorkflowStep`` rows (``nexo_django.durable.workflow_runs``).
    kind = models.CharField(max_length=10, choices=RunKind.choices, default=RunKind.AGENT)
    #: The workflow run this agent run is a step of (``Workflow.run_agent``): its end wakes it.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children",
        help_text="The workflow run this agent run is a step of.", db_index=False,
    )
    #: ``run_later(at=...)``: the job waits in rq's scheduled registry until then; the reconciler
    #: and the queue's health count the run as waiting only from this time on.
    not_before = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["status", "lease_expires_at"], name="nexo_run_status_lease"),
            models.Index(fields=["status", "updated_at"], name="nexo_run_status_updated"),
            models.Index(fields=["agent", "created_at"], name="nexo_run_agent_created"),
            # The run lists (newest first): everyone's, and each user's own (/runs/, the admin).
            models.Index(fields=["created_at"], name="nexo_run_created"),
            models.Index(fields=["created_by", "created_at"], name="nexo_run_by_created"),
            # Most runs have no parent: only those that do are indexed (each index is a page
            # written by the commit that inserts a run). `parent_id = x` implies NOT NULL, so both
            # databases use it for a lookup, without a bound value to compare (issue 34).
            models.Index(fields=["parent"], condition=models.Q(parent__isnull=False), name="nexo_run_parent"),
        ]

    def __str__(self) -> str:
        return f"{self.agent_name} run {str(self.id)[:8]} ({self.status})"

    @property
    def agent_name(self) -> str:
        return self.agent.rsplit(".", 1)[-1]

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES

    def pending_calls(self) -> QuerySet[ToolCall]:
        """The run's calls waiting for a decision, oldest first: a queryset like
        ``self.tool_calls.filter(status=...)`` (``ToolCall``'s ordering is ``created_at, id``)."""
        return ToolCall.objects.pending_of(self)

    async def apending_calls(self) -> list[ToolCall]:
        """``pending_calls()`` for async views, read in Django's sync thread: a list."""
        return await sync_to_async(lambda: list(self.pending_calls()))()

    def refresh_from_db(self, using: str | None = None, fields: Any = None, from_queryset: Any = None) -> None:
        _refresh(self, using, fields, from_queryset)

    def transcript(self) -> list[dict[str, Any]]:
        return [m.data for m in self.messages.order_by("seq")]

    def resume(self, approved: bool = True, *, by: Any = None, note: str = "") -> AgentRun:
        """Decide every pending call of the run at once (approve all, or deny all)."""
        return operations().decide_all(self, approved=approved, by=by, note=note)

    def cancel(self, *, by: Any = None, reason: str = "") -> bool:
        return operations().cancel_run(self, by=by, reason=reason)

    def follow_up(self, prompt: str, user: Any = None, *, later: bool = True) -> AgentRun:
        """A new run of the same agent that continues this run's conversation: the model is sent
        the earlier runs' transcript, then ``prompt``. Enqueued like ``run_later``; with
        ``later=False`` it runs now, like ``run``. Refused (``FollowUpRefused``) unless this run
        is done or cancelled and has no follow-up yet."""
        return operations().follow_up(self, prompt, user=user, later=later)

    def conversation(self) -> list[AgentRun]:
        """The runs of this run's conversation, first to last (this one among them)."""
        return operations().conversation(self)

    def retry(self, *, by: Any = None) -> bool:
        """Queue a ``needs_attention`` run again once its unknown calls were resolved, or take a
        ``failed`` run back up where it stopped (nothing that ran runs again)."""
        return operations().retry_run(self, by=by)

    # For async views: each the method above, run in Django's sync thread (as ``sync_to_async``
    # does for the ORM); with an inline queue the resumed run runs there too.
    async def aresume(self, approved: bool = True, *, by: Any = None, note: str = "") -> AgentRun:
        return await sync_to_async(self.resume)(approved, by=by, note=note)

    async def acancel(self, *, by: Any = None, reason: str = "") -> bool:
        return await sync_to_async(self.cancel)(by=by, reason=reason)

    async def aretry(self, *, by: Any = None) -> bool:
        return await sync_to_async(self.retry)(by=by)


#: Stored JSON text (characters) past which a page reads a value's head instead of the value.
BIG_JSON = 4_000_000
#: Characters of a big value's stored JSON text kept as its head.
HEAD_CHARS = 64_000


class StoredSize(models.Func):
    """The length of a JSON column's stored text. SQLite reads a BLOB's length without decoding
    UTF-8 (``length()`` of TEXT counts characters, a scan of the value); elsewhere its text length."""

    function = "LENGTH"
    output_field = models.IntegerField()

    def __init__(self, field: str) -> None:
        super().__init__(Cast(models.F(field), output_field=models.TextField()))

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))", **extra)


def stored_size(field: str) -> models.GeneratedField:
    """A column the database fills when the row is written: the size of ``field``'s stored
    JSON text, so a page knows a value's size without reading the value."""
    return models.GeneratedField(expression=StoredSize(field), output_field=models.IntegerField(null=True),
                                 db_persist=True)


class _Head(Substr):
    # Arguments joined without a space: Django's SQLite introspection splits a table's SQL at
    # ", " to find its columns, and a generated column's "SUBSTR(x, 1, n)" broke it.
    arg_joiner = ","


def stored_head(field: str) -> models.GeneratedField:
    """A column the database fills when the row is written: the first ``HEAD_CHARS`` characters
    of ``field``'s stored JSON text when it is bigger than ``BIG_JSON`` (else NULL), so a page shows
    the start of a 50 MB value without reading 50 MB."""
    text = Cast(models.F(field), output_field=models.TextField())
    head = models.Case(models.When(GreaterThan(StoredSize(field), BIG_JSON), then=_Head(text, 1, HEAD_CHARS)),
                       default=models.Value(None), output_field=models.TextField())
    return models.GeneratedField(expression=head, output_field=models.TextField(null=True), db_persist=True)


#: the columns written for a transcript message and for an event (``sql.insert``, no keys read back)
MESSAGE_COLUMNS = ("run_id", "seq", "role", "data", "created_at")
EVENT_COLUMNS = ("run_id", "type", "data", "created_at")


class RunMessage(models.Model):
    """One transcript message; appended, never rewritten."""

    # No index of its own: the unique (run, seq) index serves every lookup by run (each index is
    # pages written at every commit that appends a message).
    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="messages", db_index=False)
    seq = models.PositiveIntegerField()
    role = models.CharField(max_length=16)
    data = StoredJSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    #: Filled by the database on insert (pages read these, not a big ``data``).
    data_size = stored_size("data")
    data_head = stored_head("data")

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="nexo_message_run_seq")]

    def __str__(self) -> str:
        return f"{self.role} #{self.seq}"


def _refresh(obj: models.Model, using: str | None, fields: Any, from_queryset: Any) -> None:
    """``refresh_from_db()``: with no arguments and nothing deferred, one prepared SELECT of every
    field (:func:`nexo_django.sql.refresh`: what the ORM does, without building the query);
    anything else is the ORM's own."""
    if using is None and fields is None and from_queryset is None and not obj.get_deferred_fields():
        operations().refresh(obj, router.db_for_read(type(obj), instance=obj))
    else:
        models.Model.refresh_from_db(obj, using, fields, from_queryset)


#: the condition of ToolCall's partial indexes: a call waiting for a person
PENDING = models.Q(status=CallStatus.PENDING_APPROVAL)


class ToolCallQuerySet(models.QuerySet["ToolCall"]):
    """``ToolCall.objects``. :meth:`pending_of` gives a run's pending calls; while that queryset is
    unchanged (any ``filter``, ``order_by``, ``values`` ... makes a new queryset without this fast
    path), ``get()`` and iterating it read the rows with one prepared statement instead of
    building the query: the ``pending_calls().get()`` of every approval."""

    #: the run whose pending calls this (unchanged) queryset holds
    _pending_of: AgentRun | None = None

    def _pending_rows(self, limit: int | None) -> list[ToolCall]:
        run = self._pending_of
        assert run is not None
        return operations().pending_rows(run, limit=limit, alias=self.db)

    def _fetch_all(self) -> None:
        if self._result_cache is None and self._pending_of is not None:
            self._result_cache = self._pending_rows(None)  # type: ignore[assignment]
        super()._fetch_all()

    def get(self, *args: Any, **kwargs: Any) -> ToolCall:  # type: ignore[override]
        if self._pending_of is None or args or kwargs:
            return super().get(*args, **kwargs)
        rows = self._pending_rows(MAX_GET_RESULTS)
        if not rows:
            raise ToolCall.DoesNotExist("ToolCall matching query does not exist.")
        if len(rows) > 1:
            raise ToolCall.MultipleObjectsReturned(
                "get() returned more than one ToolCall -- it returned "
                f"{'more than %s' % (MAX_GET_RESULTS - 1) if len(rows) == MAX_GET_RESULTS else len(rows)}!"
            )
        return rows[0]


class ToolCallManager(models.Manager.from_queryset(ToolCallQuerySet)):  # type: ignore[misc]
    def pending_of(self, run: AgentRun) -> ToolCallQuerySet:
        """``self.filter(run=run, status="pending_approval")``, with the fast path of
        :class:`ToolCallQuerySet`."""
        if run.pk is None:
            raise ValueError(f"{run!r} needs to have a value for field 'id' before its pending calls can be read.")
        qs: ToolCallQuerySet = self.get_queryset()
        qs._add_hints(instance=run)  # type: ignore[attr-defined] # the router's database for the run, as run.tool_calls has it
        qs._defer_next_filter = True  # type: ignore[attr-defined] # the ORM's query is built only if something needs it
        qs = qs.filter(run=run, status=CallStatus.PENDING_APPROVAL)
        qs._known_related_objects = {ToolCall._meta.get_field("run"): {run.pk: run}}  # type: ignore[attr-defined]
        qs._pending_of = run
        return qs


class ToolCall(models.Model):
    """A call that needed a decision or has a side effect, with its status and result."""

    # No index of its own: the unique (run, tool_call_id) index serves every lookup by run.
    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="tool_calls", db_index=False)
    tool_call_id = models.CharField(max_length=128)
    #: The run's agent, copied so the inbox filters by agent from an index, without a join.
    agent = models.CharField(max_length=255, default="", blank=True)
    name = models.CharField(max_length=200)
    capability = models.CharField(max_length=20)
    args = StoredJSONField(default=dict)
    digest = models.CharField(max_length=64)
    status = models.CharField(max_length=20, choices=CallStatus.choices)
    idempotent = models.BooleanField(default=False)
    result = StoredJSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    #: When a call waiting for a person is expired by the reconciler (None: it waits forever).
    expires_at = models.DateTimeField(null=True, blank=True)
    #: When the approvers were emailed about it, and reminded (claimed by a compare-and-set).
    notified_at = models.DateTimeField(null=True, blank=True)
    reminded_at = models.DateTimeField(null=True, blank=True)
    #: The MCP server of an MCP tool's call (what the inbox names first, with the tool).
    server = models.CharField(max_length=200, blank=True, default="")
    #: A ``write``'s file version when the call suspended (``""``: no such file; None: another
    #: call, or the file could not be looked at): what every notice showed, so what an approval
    #: that passes no later version is bound to (durable.binding).
    suspension_version = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001 - None: none taken
    #: The policies' version when the call suspended (set by the database as the row is written:
    #: see durable.policy), the version ``policy_said`` was worked out at, and what it said (the
    #: policy, its groups, quorum, escalation), kept when the policy changes or goes.
    policy_version = models.BigIntegerField(default=0)
    routed_version = models.BigIntegerField(default=0)
    policy_said = models.JSONField(null=True, blank=True)
    #: ",3,7,": the approver (and, once escalated, escalation) groups' ids, for "mine to decide".
    approver_groups = models.CharField(max_length=255, blank=True, default="")
    escalated_at = models.DateTimeField(null=True, blank=True)
    #: The reviewer agent's advice: "low", "medium", "high" ("" : none) and why.
    risk = models.CharField(max_length=10, blank=True, default="")
    risk_reason = models.TextField(blank=True, default="")
    #: When the reviewer denied it, where its policy lets it: the call still waits for a person.
    reviewer_denied_at = models.DateTimeField(null=True, blank=True)
    #: Filled by the database when the row is written (pages read these, not a big value).
    args_size = stored_size("args")
    args_head = stored_head("args")
    result_size = stored_size("result")
    result_head = stored_head("result")

    objects = ToolCallManager()

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "tool_call_id"], name="nexo_toolcall_run_callid")
        ]
        # The partial indexes (condition=PENDING) serve the calls waiting for a person only (the
        # inbox, its filters, the outbox's reminders, the reconciler's overdue calls) and hold
        # those alone, so a call's later changes (approved, executing, succeeded) write none of
        # their pages (issue 34). Queries must compare the status as a literal to use them on
        # SQLite (`durable.fixed`; the ORM's bound value makes SQLite plan anew each time).
        indexes = [
            models.Index(fields=["created_at"], name="nexo_call_pending_created", condition=PENDING),
            models.Index(fields=["run", "status", "created_at"], name="nexo_call_run_status_created"),
            models.Index(fields=["agent"], name="nexo_call_pending_agent", condition=PENDING),
            # With the capability: the inbox's capability filter reads its choices from this
            # index, not from the table (66 -> 20 ms at 100k pending calls on SQLite).
            models.Index(fields=["name", "capability"], name="nexo_call_pending_name_cap", condition=PENDING),
            # The reconciler's look at calls that changed lately (not at every suspended run).
            models.Index(fields=["updated_at"], name="nexo_call_updated"),
            # The reconciler's look at overdue calls.
            models.Index(fields=["expires_at"], name="nexo_call_pending_expires", condition=PENDING),
        ]
        permissions = [("decide_toolcall", "Can approve or deny pending tool calls")]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"

    def refresh_from_db(self, using: str | None = None, fields: Any = None, from_queryset: Any = None) -> None:
        _refresh(self, using, fields, from_queryset)

    def approve(
        self, *, by: Any = None, note: str = "", args: dict[str, Any] | None = None,
        digest: str | None = None, source: str = "api", file_version: str | None = None,
    ) -> Decision:
        """``file_version``: a later version of the call's file that the approver was shown
        (``""``: no file); without it a ``write`` is bound to its version when the call suspended
        (``suspension_version``, what the notices showed). The write then runs without a read
        first, and only while the file is still that version."""
        return operations().decide(
            self, approved=True, by=by, note=note, args=args, digest=digest, source=source,
            file_version=file_version,
        )

    def deny(
        self, *, by: Any = None, note: str = "", stop: bool = False, digest: str | None = None,
        source: str = "api",
    ) -> Decision:
        return operations().decide(self, approved=False, by=by, note=note, stop=stop, digest=digest, source=source)

    async def aapprove(self, **kwargs: Any) -> Decision:
        """``approve()`` for async views (the same keywords)."""
        return await sync_to_async(self.approve)(**kwargs)

    async def adeny(self, **kwargs: Any) -> Decision:
        """``deny()`` for async views (the same keywords)."""
        return await sync_to_async(self.deny)(**kwargs)

    def resolve_unknown(self, *, by: Any = None, rerun: bool, note: str = "") -> None:
        """A person settles an ``outcome_unknown`` call: run it again, or tell the model it may
        or may not have happened."""
        operations().resolve_unknown(self, by=by, rerun=rerun, note=note)


class ApprovalRule(models.Model):
    """A standing decision: calls that would wait for a person and match it are decided at once
    (``Decision(source="rule", rule=...)``). It never widens the gate: calls the gate allows or
    denies on its own never reach it. Matching: :mod:`nexo_django.rules`."""

    agent = models.CharField(max_length=255, blank=True, default="",
                             help_text='Dotted path of the Agent class; empty: any agent.')
    tool = models.CharField(max_length=200, help_text="Exact tool name (MCP tools by their qualified name).")
    path = models.CharField(
        max_length=1000, blank=True, default="",
        help_text="read/write: an fnmatch pattern on the /-rooted path (e.g. /notes/*); empty: any path. "
        "shell: the whole command, matched exactly (never a prefix). Other tools: leave empty.",
    )
    verdict = models.CharField(max_length=10, choices=Verdict.choices, default=Verdict.APPROVED)
    enabled = models.BooleanField(default=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="After this the rule decides nothing.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    note = models.TextField(blank=True, default="", help_text="Why; kept with each decision it makes.")
    #: Who changed it last, and when. An author as much as its creator: with self-approval off,
    #: a rule does not approve the runs of anyone who created or ever changed it.
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    changed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tool", "agent", "path", "id"]
        indexes = [models.Index(fields=["enabled", "tool"], name="nexo_rule_enabled_tool")]

    def __str__(self) -> str:
        where = f" {self.path}" if self.path else ""
        return mark_hidden(f"{self.verdict} {self.tool}{where} for {self.agent.rsplit('.', 1)[-1] or 'any agent'}")


class Decision(models.Model):
    """Immutable: who decided what, when, on which digest."""

    tool_call = models.OneToOneField(ToolCall, on_delete=models.CASCADE, related_name="decision")
    verdict = models.CharField(max_length=10, choices=Verdict.choices)
    note = StoredTextField(blank=True, default="")
    args = StoredJSONField(null=True, blank=True, help_text="Edited arguments, if the approver changed them.")
    digest = models.CharField(max_length=64, help_text="Digest of the arguments that were decided on.")
    stop = models.BooleanField(default=False)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(auto_now_add=True)
    source = models.CharField(max_length=20, default="api")
    #: The standing rule that made it (source "rule"); a rule that decided something is kept.
    rule = models.ForeignKey(ApprovalRule, null=True, blank=True, on_delete=models.PROTECT, related_name="decisions",
                             db_index=False)
    #: The version of the call's file the approver was shown ("": there was no file), bound to
    #: the approval: the write runs only while the file is still that version.
    file_version = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001 - None: none shown
    #: What the rule said when it decided (id, agent, tool, path, verdict, note): the audit shows
    #: it after the rule is edited, disabled or deleted.
    rule_said = StoredJSONField(null=True, blank=True)
    #: Who decided in the channel's own terms (e.g. a Slack team and user id), beside
    #: ``decided_by``; "" for a decision made in the admin, the JSON endpoint or Python.
    channel_user = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        ordering = ["decided_at", "id"]
        # Only the decisions a rule made are indexed by it (most have none): see AgentRun.parent.
        indexes = [models.Index(fields=["rule"], condition=models.Q(rule__isnull=False), name="nexo_decision_rule")]

    def __str__(self) -> str:
        return f"{self.verdict} by {self.decided_by or 'system'}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None and not kwargs.get("force_insert"):
            raise ValueError("decisions are immutable once recorded")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("decisions are immutable and cannot be deleted")

    @property
    def approved(self) -> bool:
        return self.verdict == Verdict.APPROVED


class RunEvent(models.Model):
    """One step of a run, in the order of ``id`` (appended, never rewritten)."""

    # No index of its own: (run, id) below serves every lookup by run.
    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="events", db_index=False)
    type = models.CharField(max_length=40)
    data = StoredJSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "id"]
        indexes = [models.Index(fields=["run", "id"], name="nexo_event_run_id")]

    def __str__(self) -> str:
        return f"{self.type} #{self.pk}"


class PendingApproval(ToolCall):
    """The approval inbox in the admin: tool calls seen as requests for a decision."""

    class Meta:
        proxy = True
        verbose_name = "pending approval"
        verbose_name_plural = "pending approvals"

    def __str__(self) -> str:
        # The admin puts this in attributes and messages; names come from models and MCP servers.
        return mark_hidden(f"{self.name} {self.tool_call_id} ({self.status})")


class ApprovalRuleChange(models.Model):
    """One change of a standing rule (created, changed, deleted): who, when, what it said before
    and after. Appended, never rewritten; kept when the rule is deleted."""

    rule = models.ForeignKey(ApprovalRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="changes")
    #: The rule's id, kept after it is deleted.
    rule_pk = models.BigIntegerField()
    action = models.CharField(max_length=10)  # "created", "changed", "deleted"
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    changed_at = models.DateTimeField(auto_now_add=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["rule_pk", "id"]
        indexes = [models.Index(fields=["rule_pk", "changed_by"], name="nexo_rulechange_rule_by")]

    def __str__(self) -> str:
        return f"rule #{self.rule_pk} {self.action} by {self.changed_by or 'nobody known'}"


#: Where a decision came from (``Decision.source``), as the decision log and its export show it.
#: docs/admin.md lists the same names (tests/admin/test_decision_sources.py checks it).
DECISION_SOURCES: dict[str, str] = {
    "admin": "the decision page in the admin (also reached from a notice's link)",
    "admin-bulk": "the inbox's bulk actions",
    "json": "the JSON endpoint runs/<id>/calls/<call>/decide/",
    "api": "Python: call.approve(), call.deny(), aapprove(), adeny()",
    "resume": "Python: run.resume(), every pending call of the run at once",
    "rule": "a standing rule",
    "expiry": "nobody decided in time (the reconciler)",
}


class StepKind(models.TextChoices):
    CHECKPOINT = "checkpoint"
    AGENT = "agent"
    QUESTION = "question"


class StepStatus(models.TextChoices):
    #: an agent step whose run has not ended, a question nobody answered yet
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    ANSWERED = "answered"
    #: a question past its deadline: recorded as "no answer"
    EXPIRED = "expired"


class WorkflowStep(models.Model):
    """One named step of a workflow run, recorded once: a checkpoint's JSON result, an agent run
    (``child_run``), or a question and its answer. Unique by name within a run; ``seq`` is the
    order in which ``call`` reaches them (a resumed run must reach them in the same order)."""

    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="steps", db_index=False)
    seq = models.PositiveIntegerField()
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=12, choices=StepKind.choices)
    status = models.CharField(max_length=12, choices=StepStatus.choices)
    #: a checkpoint's return value, an agent's final text, a question's answer
    result = StoredJSONField(null=True, blank=True)
    child_run = models.ForeignKey(AgentRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    #: a question's text and the JSON Schema its answer must match
    question = StoredTextField(blank=True, default="")
    schema = StoredJSONField(null=True, blank=True)
    #: the schema's properties in the order asked (PostgreSQL's jsonb keeps an object's keys in an
    #: order of its own): the order of the answer's form
    field_order = models.JSONField(null=True, blank=True)
    #: what an MCP server asked, for a question of an agent run's tool call (durable.elicitation):
    #: its mode, URL, key, call, round and requestState, stored as sent; None for a workflow's
    request = StoredJSONField(null=True, blank=True)
    #: copied from the run, so the inbox filters and four eyes read no join
    workflow = models.CharField(max_length=255, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    answered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    answered_at = models.DateTimeField(null=True, blank=True)
    #: where a question was answered ("admin", "json", a channel's name, "mcp") and who answered in
    #: that channel's own terms ("slack:T01/U02"): with ``answered_by``, the answer's record
    answer_source = models.CharField(max_length=64, blank=True, default="")
    channel_user = models.CharField(max_length=255, blank=True, default="")
    #: When the approvers were emailed about a question (claimed by a compare-and-set).
    notified_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    result_size = stored_size("result")

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="nexo_step_run_seq"),
            models.UniqueConstraint(fields=["run", "name"], name="nexo_step_run_name"),
        ]
        indexes = [
            # The inbox's open questions and the reconciler's overdue ones.
            models.Index(fields=["kind", "status", "created_at"], name="nexo_step_kind_status"),
            models.Index(fields=["status", "expires_at"], name="nexo_step_status_expires"),
            models.Index(fields=["updated_at"], name="nexo_step_updated"),
        ]

    def __str__(self) -> str:
        return mark_hidden(f"{self.kind} {self.name} ({self.status})")

    @property
    def key(self) -> str:
        """A question's key (its step name)."""
        return self.name

    @property
    def is_open(self) -> bool:
        return self.kind == StepKind.QUESTION and self.status == StepStatus.WAITING


class OpenQuestion(WorkflowStep):
    """The questions of the approval inbox: workflow steps that wait for a person's answer."""

    class Meta:
        proxy = True
        verbose_name = "open question"
        verbose_name_plural = "open questions"


class NoticeStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    #: nothing left to say (e.g. a request for a call decided before it was announced)
    SKIPPED = "skipped"


class Notice(models.Model):
    """The transactional outbox: one notice to one channel, written in the transaction of the
    change that causes it, delivered by the worker or the reconciler (``durable/outbox.py``)."""

    channel = models.CharField(max_length=100)
    kind = models.CharField(max_length=40)
    #: The idempotency key sent to the receiver: one notice per channel, kind and subject.
    key = models.CharField(max_length=255, unique=True)
    run = models.ForeignKey(AgentRun, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
                            db_index=False)
    #: The call it is about ("" for a run's notice), by the model's id: the row may not exist yet.
    tool_call_id = models.CharField(max_length=128, blank=True, default="")
    payload = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=20, choices=NoticeStatus.choices, default=NoticeStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    #: The token of the delivery that took it last (a compare-and-set: one sender at a time).
    claim = models.CharField(max_length=32, blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    #: What the receiver answered that later notices need (a Slack message's channel and ts).
    receipt = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["status", "next_attempt_at"], name="nexo_notice_due"),
            models.Index(fields=["run", "channel"], name="nexo_notice_run_channel"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} to {self.channel} ({self.status})"


class ChannelRequest(models.Model):
    """A signed request a channel accepted, kept for its timestamp window: the same one again is
    a replay and is refused."""

    channel = models.CharField(max_length=100)
    signature = models.CharField(max_length=64, unique=True, help_text="sha256 of the request's signature.")
    received_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.channel} {self.signature[:12]}"


class InsightTally(models.Model):
    """Decisions counted by day (``grain`` "d") and by month ("m", ``day`` its first day), agent,
    tool, outcome, source, reviewer and rule, written in the deciding commit
    (``durable.insight.tally``): the dashboard sums these rows, never the history. ``reviewer``
    and ``rule`` are ids (0: none), kept after the user or rule is gone, as decisions keep them."""

    grain = models.CharField(max_length=1)
    day = models.DateField()
    agent = models.CharField(max_length=255)
    tool = models.CharField(max_length=200)
    #: "approved", "denied", "expired"
    outcome = models.CharField(max_length=10)
    source = models.CharField(max_length=20)
    reviewer = models.BigIntegerField()
    rule = models.BigIntegerField()
    count = models.BigIntegerField()
    #: seconds from the call's request to its decision, summed
    wait_sum = models.FloatField()

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["grain", "day", "agent", "tool", "outcome", "source", "reviewer", "rule"], name="nexo_tally_key")]

    def __str__(self) -> str:
        return f"{self.day} {self.tool} {self.outcome}: {self.count}"


class InsightTarget(models.Model):
    """Decisions counted by day and month, agent, tool, target (what a rule would match: a path
    tool's folder, a shell call's whole command, "") and outcome, with the least and greatest
    exact target (their common prefix is the narrowest pattern covering all of them)."""

    grain = models.CharField(max_length=1)
    day = models.DateField()
    agent = models.CharField(max_length=255)
    tool = models.CharField(max_length=200)
    #: "path", "shell", "none" (a tool without a target), "other" (a target no rule can match)
    kind = models.CharField(max_length=8)
    target = models.CharField(max_length=1000)
    outcome = models.CharField(max_length=10)
    source = models.CharField(max_length=20)
    count = models.BigIntegerField()
    wait_sum = models.FloatField()
    first_target = models.CharField(max_length=1000)
    last_target = models.CharField(max_length=1000)

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["grain", "day", "agent", "tool", "kind", "target", "outcome", "source"], name="nexo_target_key")]

    def __str__(self) -> str:
        return f"{self.day} {self.tool} {self.target} {self.outcome}: {self.count}"


class InsightReviewer(models.Model):
    """Approvals by people, counted by agent, tool, target and reviewer, all time: how many
    people a suggested rule's evidence comes from."""

    agent = models.CharField(max_length=255)
    tool = models.CharField(max_length=200)
    kind = models.CharField(max_length=8)
    target = models.CharField(max_length=1000)
    reviewer = models.BigIntegerField()
    count = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent", "tool", "kind", "target", "reviewer"],
                                               name="nexo_reviewer_key")]

    def __str__(self) -> str:
        return f"{self.tool} {self.target} by #{self.reviewer}: {self.count}"


#: the wait histogram's buckets (``durable.insight.tally.bucket_of``): columns ``b0`` .. ``b79``
WAIT_BUCKETS = 80


class InsightWait(models.Model):
    """A person's decisions counted by day and month, agent, tool and reviewer, with their waits
    as a histogram in one row: ``b<i>`` counts the waits of bucket ``i`` (a bounded histogram,
    ``durable.insight.tally.RATIO`` apart; the last bucket holds every longer wait). One row per
    key rather than one per bucket: a month's dashboard reads a tenth of the rows."""

    grain = models.CharField(max_length=1)
    day = models.DateField()
    agent = models.CharField(max_length=255)
    tool = models.CharField(max_length=200)
    reviewer = models.BigIntegerField()
    count = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["grain", "day", "agent", "tool", "reviewer"],
                                               name="nexo_wait_row_key")]

    def __str__(self) -> str:
        return f"{self.day} {self.tool} waits: {self.count}"

    def histogram(self) -> dict[int, int]:
        """bucket -> count, the empty buckets left out."""
        return {i: n for i in range(WAIT_BUCKETS) if (n := getattr(self, f"b{i}"))}


for _bucket in range(WAIT_BUCKETS):
    InsightWait.add_to_class(f"b{_bucket}", models.BigIntegerField(default=0, db_default=0))


class DismissedSuggestion(models.Model):
    """A suggested rule a person set aside: who, when, why. Not suggested again."""

    agent = models.CharField(max_length=255)
    tool = models.CharField(max_length=200)
    path = models.CharField(max_length=1000, blank=True, default="")
    dismissed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    dismissed_at = models.DateTimeField(auto_now_add=True)
    note = models.TextField(blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent", "tool", "path"], name="nexo_dismissed_key")]

    def __str__(self) -> str:
        return mark_hidden(f"dismissed {self.tool} {self.path} for {self.agent.rsplit('.', 1)[-1]}")


# The approval policies' models (nexo_django.durable.policy), defined beside these.
from .policy_models import Approval as Approval  # noqa: E402
from .policy_models import ApprovalPolicy as ApprovalPolicy  # noqa: E402
from .policy_models import ApprovalPolicyChange as ApprovalPolicyChange  # noqa: E402
