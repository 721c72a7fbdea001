"""The harness core: an agent declaration and the one loop that serves first runs and resumes.

The transcript is the state. :meth:`Agent.step` looks at it: open tool calls are gated and run
(or left pending), otherwise the model is asked for the next turn. A :class:`Journal` records
what happens; in process it is a list, in the durable layer it is the database.

Plain Python: no Django, no durable runs. Settings reach the agent through
:meth:`Agent.configuration` (the Django-facing ``nexo_django.Agent`` reads ``NEXO`` there and adds
``run``/``run_later``).
"""

from __future__ import annotations

import dataclasses
import os
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

from .errors import (
    ApprovalRequired,
    ConfigurationError,
    Denied,
    InputRequired,
    MaxTurnsExceeded,
    PendingCall,
    SecurityError,
    TokenBudgetExceeded,
    ToolArgumentError,
)
from .llm import resolve_model
from .llm.base import Message, add_usage
from .mcp import MCPManager
from .permissions import MODES, Permissions, Verdict
from .sandboxes import Sandbox, make_sandbox
from .sandboxes.confine import ShellPolicy
from .tools import FETCH, GLOB, READ, SEARCH, SHELL, WRITE, Limits, Tool, ToolContext, error
from .tools.egress import EgressProxy
from .tools.shell_settings import shell_policy
from .transcript import open_calls, tokens_spent, unique_call_ids

EventCallback = Callable[[str, dict[str, Any]], None]
#: what ``Journal.answers_for`` gives while a call's input is not all given
WAITING = "waiting"


@dataclass(frozen=True)
class CallDecision:
    """A person's decision on one pending call, as a journal hands it to the loop."""

    approved: bool
    note: str = ""
    args: dict[str, Any] | None = None  # edited arguments, if any
    stop: bool = False  # deny and stop the run
    #: who decided: "expiry" (nobody, in time), "rule" (a standing rule), or a person's channel
    source: str = ""
    #: the version of the call's file the approver was shown ("": no file), None if none was
    version: str | None = None

    def verdict(self) -> Verdict:
        return Verdict(self.approved, self.note)


@dataclass
class Outcome:
    kind: str  # "continue" | "suspended" | "done" | "stopped"
    content: str | None = None
    pending: list[PendingCall] = field(default_factory=list)


class Journal:
    """Where the loop writes. This one keeps the transcript in memory (``Agent.prompt``).

    ``prefix`` is a conversation's earlier messages (the runs before a follow-up): the model is
    sent them first, but they are not this run's. The run's turns (``max_turns``), its tokens
    (``max_tokens``) and its usage count its own messages only; call ids are unique over the
    whole conversation, since the model sees every one of them."""

    def __init__(
        self, messages: list[Message] | None = None, on_event: EventCallback | None = None,
        *, prefix: list[Message] | None = None,
    ) -> None:
        #: how many of ``messages`` are the read-only prefix (earlier runs' messages)
        self.prefix = len(prefix or ())
        self.messages: list[Message] = [*(prefix or ()), *(messages or ())]
        self.on_event = on_event
        #: this run's assistant turns so far, kept as messages are appended (the loop's cost stays flat)
        self.turns = 0
        #: every tool call id of the conversation so far: an id names one call, never two
        self.call_ids: set[str] = set()
        for index, message in enumerate(self.messages):
            self._count(message, own=index >= self.prefix)

    def own_messages(self) -> list[Message]:
        """This run's messages: the transcript without the prefix."""
        return self.messages[self.prefix :]

    def _count(self, message: Message, *, own: bool = True) -> None:
        if message.get("role") == "assistant":
            self.turns += own
            self.call_ids.update(str(c.get("id") or "") for c in message.get("tool_calls") or ())

    def append(self, message: Message) -> None:
        self.messages.append(message)
        self._count(message)

    def before_model(self) -> None:
        """Called before each model request: a durable journal saves the last reply if none of its
        calls did, so a reply is never asked for twice."""

    def decision_for(self, call: dict[str, Any]) -> CallDecision | None:
        """The person's decision on this call (its id, name and arguments), if there is one."""
        return None

    def call_started(self, call: dict[str, Any], tool: Tool, args: dict[str, Any]) -> None:
        """Called after the gate passed and just before the tool runs."""

    def call_finished(self, call: dict[str, Any], tool: Tool | None, result: dict[str, Any]) -> None:
        self.append({"role": "tool", "tool_call_id": call["id"], "name": call["name"], "content": result})

    def call_failed(self, call: dict[str, Any], tool: Tool, exc: BaseException) -> None:
        """Called when a call fails loudly (``SecurityError``) and the run stops."""

    def suspend(self, pending: list[PendingCall]) -> None:
        """Called when calls wait for a person; the loop returns right after."""

    def answers_for(self, call: dict[str, Any]) -> Any:
        """The answers to the input ``call`` asked for, ``WAITING``, or None (in process: none)."""
        return None

    def input_required(self, call: dict[str, Any], tool: Tool, asked: InputRequired) -> dict[str, Any] | None:
        """None when the journal keeps a call's asks (the run suspends), else the model's result."""
        return error(f"{asked}. Answering it needs a durable run (the agent's run or run_later), which keeps "
                     "the questions for a person")

    def emit(self, type: str, data: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(type, data)

    def text(self, turn: int, attempt: int, piece: str) -> None:
        """A piece of the model's reply as a streaming provider writes it (``attempt`` counts the
        provider's retries: a retried request writes its text again). Never recorded: the reply is
        appended whole once it is complete. Here it goes to ``on_event("delta", ...)``."""
        if self.on_event is not None:
            self.on_event("delta", {"turn": turn, "attempt": attempt, "text": piece})


@dataclass
class ToolCallRecord:
    id: str
    name: str
    args: dict[str, Any]
    result: dict[str, Any] | None


@dataclass
class Reply:
    """What ``Agent.prompt()`` returns."""

    content: str | None
    transcript: list[Message]
    usage: dict[str, int]
    tool_calls: list[ToolCallRecord]

    @classmethod
    def from_transcript(cls, messages: list[Message], content: str | None) -> Reply:
        results = {m["tool_call_id"]: m["content"] for m in messages if m.get("role") == "tool"}
        calls = [
            ToolCallRecord(c["id"], c["name"], c.get("args") or {}, results.get(c["id"]))
            for m in messages
            if m.get("role") == "assistant"
            for c in m.get("tool_calls") or ()
        ]
        usage: dict[str, int] = {"input_tokens": 0, "output_tokens": 0}
        for m in messages:
            if m.get("role") == "assistant":
                add_usage(usage, m.get("usage"))
        return cls(content, messages, usage, calls)




def _seen_versions(messages: list[Message]) -> dict[str, str]:
    """Rebuild read-before-write state from the transcript, so a resumed run keeps it."""
    seen: dict[str, str] = {}
    for m in messages:
        if m.get("role") == "tool" and m.get("name") in ("read", "write"):
            content = m.get("content") or {}
            if "path" in content and "version" in content:
                seen[content["path"]] = content["version"]
    return seen


def _check_declared_permissions(cls: type) -> None:
    """A typo in ``permissions = "aprove"`` fails where the class is defined, not at the first run."""
    declared = cls.__dict__.get("permissions")
    if declared is None or isinstance(declared, Permissions):
        return
    if not isinstance(declared, str):
        raise ConfigurationError(
            f"{cls.__name__}.permissions must be a mode name ({', '.join(MODES)}) or a "
            f"Permissions(...) instance, not {declared!r}"
        )
    if declared not in MODES:
        raise ConfigurationError(
            f"{cls.__name__}.permissions = {declared!r} is not a permission mode; use one of "
            f"{', '.join(repr(m) for m in MODES)}, or a Permissions(...) instance"
        )


class _FromSettings:
    """``Agent.approval_timeout``'s default: ``NEXO["APPROVAL_TIMEOUT"]`` (read where the call
    starts waiting, by the durable layer)."""

    def __repr__(self) -> str:
        return 'FROM_SETTINGS  # NEXO["APPROVAL_TIMEOUT"]'


FROM_SETTINGS: Any = _FromSettings()
ON_TIMEOUT = ("deny", "stop")


def _check_approval_lifecycle(cls: type) -> None:
    timeout = cls.__dict__.get("approval_timeout", FROM_SETTINGS)
    if timeout is not FROM_SETTINGS and timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (timedelta, int, float)) or
        (timeout.total_seconds() if isinstance(timeout, timedelta) else timeout) <= 0
    ):
        raise ConfigurationError(
            f"{cls.__name__}.approval_timeout = {timeout!r}: give a positive timedelta or number of "
            "seconds, or None for calls that wait forever"
        )
    on_timeout = cls.__dict__.get("on_timeout", "deny")
    if on_timeout not in ON_TIMEOUT:
        raise ConfigurationError(
            f"{cls.__name__}.on_timeout = {on_timeout!r}: use 'deny' (the model is told and the run goes "
            "on) or 'stop' (the run is cancelled)"
        )


def _denial(name: str, decision: CallDecision) -> str:
    """What the model is told of a denied call: who (or what) denied it matters to what it does
    next, so an expiry is never worded as a person's refusal."""
    note = f": {decision.note}" if decision.note else ""
    if decision.source == "expiry":
        return f"{name} not run: its approval request expired without a decision (nobody approved or denied it){note}"
    if decision.source == "rule":
        return f"{name} denied by a standing rule{note}"
    return f"{name} denied by the approver{note}"

def _give_egress(workspace: Sandbox) -> None:
    """A local sandbox built elsewhere (an instance on the class, one rebuilt from a durable
    run's spec) gets the egress proxy its NETWORK hosts need: the sandboxes import no tool."""
    policy = getattr(workspace, "shell_policy", None)
    if isinstance(policy, ShellPolicy) and policy.egress is None:
        workspace.shell_policy = dataclasses.replace(policy, egress=EgressProxy)  # type: ignore[attr-defined]


class Agent:
    """Declare an agent by subclassing; see docs/agents.md."""

    model: ClassVar[Any] = None
    sandbox: ClassVar[Any] = "virtual"
    permissions: ClassVar[Any] = "read_only"
    instructions: ClassVar[str] = ""
    tools: ClassVar[list[Any]] = []
    mcp_servers: ClassVar[list[Any]] = []
    fetch_allow: ClassVar[list[str]] = []
    search_backend: ClassVar[Any] = None
    max_turns: ClassVar[int] = 25
    #: How long a call waits for a person (timedelta or seconds; None: forever); by default
    #: NEXO["APPROVAL_TIMEOUT"]. Then the reconciler expires it, as ``on_timeout`` says:
    #: "deny" (the model is told it expired and the run goes on) or "stop" (the run is cancelled).
    approval_timeout: ClassVar[Any] = FROM_SETTINGS
    on_timeout: ClassVar[str] = "deny"
    #: tokens (input + output, as the provider reports them) the whole run may spend; None: no cap
    max_tokens: ClassVar[int | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _check_declared_permissions(cls)
        _check_approval_lifecycle(cls)

    def __init__(
        self,
        *,
        cwd: str | os.PathLike[str] | None = None,
        permissions: Permissions | str | None = None,
        sandbox: Sandbox | str | None = None,
        model: Any = None,
        on_event: EventCallback | None = None,
    ) -> None:
        cls = type(self)
        config = self.configuration()
        self.cwd = os.fspath(cwd) if cwd is not None else None
        self.gate: Permissions = Permissions.resolve(permissions if permissions is not None else cls.permissions)
        protected = config.get("PROTECTED_NAMES")
        self.limits = Limits.from_mapping(config.get("LIMITS") or {})
        self.workspace: Sandbox = make_sandbox(
            sandbox if sandbox is not None else cls.sandbox,
            self.cwd,
            protected=tuple(protected) if protected is not None else None,
            shell=shell_policy(config.get("SHELL") or {}, self.limits),
        )
        _give_egress(self.workspace)
        self.llm = resolve_model(self._pick_model(model, config.get("MODEL")), config.get("PROVIDERS") or {})
        self.on_event = on_event
        self.search = self._pick_search(config.get("SEARCH_BACKEND"))
        self.fetch_hosts = self._fetch_allow()
        self._mcp: Any = None
        self._mcp_tools: list[Tool] | None = None
        self._toolset: dict[str, Tool] | None = None
        self._context: ToolContext | None = None

    # --- configuration -------------------------------------------------------------------

    @classmethod
    def path(cls) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"

    def configuration(self) -> Mapping[str, Any]:
        """The settings the agent is built from, by ``NEXO`` key (``MODEL``, ``PROVIDERS``,
        ``LIMITS``, ``PROTECTED_NAMES``, ``SEARCH_BACKEND``). Plain Python has none; the
        Django-facing agent returns ``NEXO``'s."""
        return {}

    def setting(self, name: str) -> Any:
        """A project setting by name, for ``${settings:NAME}`` in MCP server options (None here)."""
        return None

    def _pick_model(self, given: Any, setting: Any) -> Any:
        for candidate in (given, type(self).model, setting):
            if candidate is not None:
                return candidate
        # Read last, and only when nothing else names a model (each read of os.environ encodes the key).
        from_env = os.environ.get("NEXO_MODEL") or None
        if from_env is not None:
            return from_env
        raise ConfigurationError(
            f"{type(self).__name__} has no model: set `model = \"openai:gpt-4.1-mini\"` on the class, "
            'NEXO["MODEL"] in settings, or the NEXO_MODEL environment variable'
        )

    def _pick_search(self, setting: Any) -> Any:
        backend = type(self).search_backend or setting
        if isinstance(backend, str):
            try:
                backend = pkgutil.resolve_name(backend)
            except (ImportError, AttributeError, ValueError) as exc:
                raise ConfigurationError(
                    f"search backend {backend!r} cannot be imported ({exc}); give the dotted path "
                    "of a callable(query, limit)"
                ) from exc
        return backend

    def builtin_tools(self) -> list[Tool]:
        """The built-in tools attached to this agent: read and glob always; the others when the
        sandbox can do them and the gate does not rule them out."""
        attached = [READ, GLOB]
        if self.workspace.can_write and not self.gate.never_allows("write"):
            attached.append(WRITE)
        if self.workspace.can_shell and not self.gate.never_allows("shell"):
            attached.append(SHELL)
        if self.fetch_hosts and not self.gate.never_allows("fetch"):
            attached.append(FETCH)
        if self.search is not None and not self.gate.never_allows("search"):
            attached.append(SEARCH)
        return attached

    def local_tools(self) -> dict[str, Tool]:
        """The attached built-in tools and the agent's own: everything but MCP (no server started)."""
        tools: dict[str, Tool] = {t.name: t for t in self.builtin_tools()}
        for extra in type(self).tools:
            if not isinstance(extra, Tool):
                raise ConfigurationError(
                    f"{type(self).__name__}.tools: {extra!r} is not a tool; decorate it with @nexo_django.tool"
                )
            if extra.name in tools:
                raise ConfigurationError(f"{type(self).__name__}.tools: a tool named {extra.name!r} exists already")
            if extra.capability == "mcp" or not self.gate.never_allows(extra.capability):
                tools[extra.name] = extra
        return tools

    def toolset(self) -> dict[str, Tool]:
        """What the model sees: :meth:`local_tools` plus the MCP servers' tools (starts them)."""
        if self._toolset is None:
            tools = self.local_tools()
            for mcp_tool in self._list_mcp_tools():
                tools[mcp_tool.name] = mcp_tool
            self._toolset = tools
        return self._toolset

    def _list_mcp_tools(self) -> list[Tool]:
        if not type(self).mcp_servers:
            return []
        if self.gate.mode == "read_only" and not self.gate.mcp_allow:
            return []  # no MCP tool could run: do not even start the servers
        if self._mcp_tools is None:
            own = {t.name for t in self.builtin_tools()} | {getattr(t, "name", "") for t in type(self).tools}
            self._mcp = MCPManager(type(self).mcp_servers, reserved=own, setting=self.setting)
            self._mcp_tools = [t for t in self._mcp.tools() if self._mcp_attachable(t)]
        return self._mcp_tools

    def _mcp_attachable(self, mcp_tool: Tool) -> bool:
        # Under read_only only names in mcp_allow can ever run: attach only those.
        return self.gate.mode != "read_only" or mcp_tool.name in self.gate.mcp_allow

    def close(self) -> None:
        """Close MCP sessions; the next step opens them again."""
        if self._mcp is not None:
            self._mcp.close()
        self._mcp = None
        self._mcp_tools = None
        self._toolset = None

    def initial_messages(self, prompt: str) -> list[Message]:
        messages: list[Message] = []
        if type(self).instructions:
            messages.append({"role": "system", "content": type(self).instructions})
        messages.append({"role": "user", "content": prompt})
        return messages

    def _fetch_allow(self) -> tuple[str, ...]:
        hosts = type(self).fetch_allow
        if isinstance(hosts, str):
            raise ConfigurationError(
                f"{type(self).__name__}.fetch_allow must be a list of hosts, e.g. [{hosts!r}], not a string"
            )
        return tuple(hosts)

    def context(self, messages: list[Message]) -> ToolContext:
        return ToolContext(
            sandbox=self.workspace,
            permissions=self.gate,
            limits=self.limits,
            versions=_seen_versions(messages),
            fetch_allow=self.fetch_hosts,
            search_backend=self.search,
        )

    # --- the loop ------------------------------------------------------------------------

    def drive(self, journal: Journal) -> Outcome:
        """Step until the run is done, suspended or stopped. Serves first runs and resumes."""
        self._context = self.context(journal.messages)
        try:
            while True:
                outcome = self.step(journal)
                if outcome.kind != "continue":
                    return outcome
        finally:
            self.close()

    def step(self, journal: Journal) -> Outcome:
        last = journal.messages[-1] if journal.messages else {}
        if last.get("role") == "assistant" and not last.get("tool_calls"):
            # A final answer is already in the transcript (e.g. a worker died before closing
            # the run): the run is done, the model is not asked again.
            return Outcome("done", content=last.get("content"))
        calls = open_calls(journal.messages)
        if calls:
            return self._run_calls(calls, journal)
        return self._model_turn(journal)

    def _model_turn(self, journal: Journal) -> Outcome:
        turn = journal.turns + 1
        if turn > type(self).max_turns:
            raise MaxTurnsExceeded(
                f"{type(self).__name__} used its {type(self).max_turns} turns (max_turns) without a final answer"
            )
        budget = type(self).max_tokens
        if budget is not None:
            spent = tokens_spent(journal.own_messages())
            if spent >= budget:
                raise TokenBudgetExceeded(
                    f"{type(self).__name__} spent {spent} of its {budget} tokens (max_tokens) without a "
                    "final answer; raise max_tokens or narrow the prompt"
                )
        specs = [t.spec() for t in self.toolset().values()]
        journal.before_model()
        journal.emit("model_request", {"turn": turn, "messages": len(journal.messages), "tools": len(specs)})
        if getattr(self.llm, "streams", False):  # a provider streaming its reply: the text as it comes
            completion = self.llm.complete(  # type: ignore[call-arg] # a streaming model takes on_text
                journal.messages, specs, on_text=lambda attempt, piece: journal.text(turn, attempt, piece)
            )
        else:
            completion = self.llm.complete(journal.messages, specs)
        message = unique_call_ids(dict(completion.message), journal.call_ids)
        message["usage"] = dict(completion.usage)
        journal.append(message)
        names = [c.get("name") for c in message.get("tool_calls") or ()]
        journal.emit("model_reply", {"turn": turn, "tool_calls": names, "usage": message["usage"]})
        if not names:
            journal.emit("done", {"turn": turn})
            return Outcome("done", content=message.get("content"))
        return Outcome("continue")

    def _run_calls(self, calls: list[dict[str, Any]], journal: Journal) -> Outcome:
        base = self._context or self.context(journal.messages)
        toolset = self.toolset()
        pending: list[PendingCall] = []
        asking = False  # a call waits for a person's input (durable runs: an MCP server's questions)
        decisions = [journal.decision_for(call) for call in calls]
        # Deny and stop on any call of the turn: no other call of it runs, even an approved one.
        stopper = next((d for d in decisions if d is not None and d.stop and not d.approved), None)
        stop = stopper is not None
        for call, decision in zip(calls, decisions, strict=True):
            tool = toolset.get(call["name"])
            journal.emit("tool_call", {"id": call["id"], "name": call["name"]})
            if call.get("error"):
                result = error(f"{call['name']}: {call['error']}")
            elif tool is None:
                result = error(f"unknown tool {call['name']!r}; available: {', '.join(sorted(toolset))}")
            elif decision is not None and not decision.approved:
                result = error(_denial(call["name"], decision))
            elif stop:
                result = error(f"{call['name']} not run: the approver stopped the run")
            else:
                proposed = decision.args if decision is not None and decision.args is not None else call.get("args")
                gate = self.gate.with_decision(decision.verdict()) if decision is not None else self.gate
                # The version an approval is bound to: the one the approver was shown, or the
                # file as it was when the decision was made (for edited arguments: the file
                # they name, looked at then by the durable layer, never sent by a page).
                shown = decision.version if decision is not None and decision.approved else None
                ctx = dataclasses.replace(base, permissions=gate, call_id=call["id"], approved_version=shown)
                try:
                    args = tool.validate(proposed)
                    tool.gate(args, ctx)
                except (ToolArgumentError, Denied) as exc:
                    result = error(str(exc))
                except ApprovalRequired:
                    pending.append(PendingCall(call["id"], call["name"], tool.capability, args))
                    continue
                else:
                    answers = journal.answers_for(call)
                    if answers is WAITING:  # a person's input, asked before, is not all given yet
                        asking = True
                        continue
                    ctx = dataclasses.replace(ctx, answers=answers)
                    journal.call_started(call, tool, args)
                    try:
                        result = tool.run_gated(args, ctx)
                    except InputRequired as exc:
                        found = journal.input_required(call, tool, exc)
                        if found is None:
                            asking = True
                            continue
                        result = found
                    except SecurityError as exc:
                        journal.emit("security", {"id": call["id"], "name": call["name"], "error": str(exc)})
                        journal.call_failed(call, tool, exc)
                        raise
            journal.call_finished(call, tool, result)
            journal.emit("tool_result", {"id": call["id"], "name": call["name"], "error": "error" in result})
        if stopper is not None:
            journal.emit("stopped", {"source": stopper.source} if stopper.source else {})
            reason = "stopped: a call's approval request expired without a decision" if stopper.source == "expiry" else None
            return Outcome("stopped", content=reason)
        if pending or asking:
            journal.suspend(pending)
            journal.emit("suspended", {"pending": [p.id for p in pending]})
            return Outcome("suspended", pending=pending)
        return Outcome("continue")

    # --- entry points --------------------------------------------------------------------

    def prompt(self, text: str) -> Reply:
        """Run in process, with no database. Raises ``ApprovalRequired`` (with every pending call
        of the turn in ``.pending``) when a call needs a person's decision."""
        journal = Journal(self.initial_messages(text), on_event=self.on_event)
        outcome = self.drive(journal)
        if outcome.kind == "suspended":
            first = outcome.pending[0]
            raise ApprovalRequired(first.capability, first.args, args=first.args, pending=outcome.pending)
        return Reply.from_transcript(journal.messages, outcome.content)
