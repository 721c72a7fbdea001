"""One exception tree for nexo_django, rooted in :class:`NexoError`.

Plain Python: the core imports no Django. :class:`ConfigurationError` becomes a subclass of
Django's ``ImproperlyConfigured`` when the Django side is loaded (``nexo_django.errors``), so the
one class the core raises is the one a project catches either way.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AlreadyDecided", "ApprovalExpired", "ApprovalRefused", "ApprovalRequired", "ConfigurationError", "Denied", "FollowUpRefused", "InvalidAnswer", "InvalidEditedArguments", "LeaseLost", "MaxTurnsExceeded", "ModelError", "NexoError", "NoAnswer", "PendingCall", "SecurityError", "StaleDecision", "StepFailed", "TokenBudgetExceeded", "ToolArgumentError", "TransitionError", "WorkflowChanged", "WorkflowError", "WorkspaceOverQuota"]


class NexoError(Exception):
    """Base of every error nexo_django raises on purpose."""


class ConfigurationError(NexoError):
    """The project or an agent is configured in a way that cannot work; the message names the fix."""


class SecurityError(NexoError):
    """A tool call tried to leave its sandbox (path escape, protected name, special file).

    It fails the call loudly instead of being returned to the model as an ordinary error.
    """


class WorkspaceOverQuota(SecurityError):
    """A confined shell command left the workspace over ``NEXO["LIMITS"]``'s quota: the call ran
    (``result`` keeps its output) and the run fails with the reason, before any other call."""

    def __init__(self, message: str, *, result: dict[str, Any]) -> None:
        super().__init__(message)
        self.result = result


class Denied(NexoError):
    """The permission gate refused a call. Tools turn it into ``{"error": message}``."""

    def __init__(self, message: str, *, capability: str | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.capability = capability
        self.detail = detail


class PendingCall:
    """One tool call that waits for a person's decision."""

    __slots__ = ("args", "capability", "id", "name")

    def __init__(self, id: str, name: str, capability: str, args: dict[str, Any]) -> None:
        self.id = id
        self.name = name
        self.capability = capability
        self.args = args

    def __repr__(self) -> str:
        return f"PendingCall(id={self.id!r}, name={self.name!r}, capability={self.capability!r})"


class ApprovalRequired(NexoError):
    """A signal, not a denial: the call needs a decision before it may run.

    Raised by the gate under the ``approve`` mode with no decision. Tools must not catch it.
    ``tool_args`` holds the arguments of an MCP call (the gate sees them; built-in tools pass a
    ``detail`` instead).
    Out of ``Agent.prompt()`` it carries every pending call of the turn in ``pending``.
    """

    def __init__(
        self,
        capability: str,
        detail: Any = None,
        *,
        args: dict[str, Any] | None = None,
        pending: list[PendingCall] | None = None,
        run: Any = None,
    ) -> None:
        self.capability = capability
        self.detail = detail
        # Not ``self.args``: that is BaseException's own tuple.
        self.tool_args = args
        self.pending = list(pending or [])
        self.run = run
        what = f"{capability} {detail!r}" if detail is not None else capability
        super().__init__(f"{what} needs approval before it can run")


class ToolArgumentError(NexoError):
    """Arguments from the model do not fit the tool's schema; returned to the model as an error."""


class ModelError(NexoError):
    """A model provider failed (HTTP error, bad response) after any retries."""


class MaxTurnsExceeded(NexoError):
    """The loop used up ``max_turns`` model turns without a final answer."""


class TokenBudgetExceeded(MaxTurnsExceeded):
    """The run spent its ``max_tokens`` (input and output tokens over all its model turns) without
    a final answer. A kind of :class:`MaxTurnsExceeded`: both are the run's own limits."""


class TransitionError(NexoError):
    """A durable object is not in a state that allows the requested change."""


class FollowUpRefused(TransitionError):
    """A follow-up on a run that cannot take one (it waits, runs, is queued, failed, or was
    followed up already): the message names the state and what to do."""


class AlreadyDecided(TransitionError):
    """The call was decided already (a second approver, a double click, a replayed post)."""


class ApprovalExpired(AlreadyDecided):
    """The call's approval request expired without a decision; it can no longer be decided."""


class ApprovalRefused(TransitionError):
    """An approval that could not act as approved (the call's path is one the sandbox refuses,
    its file cannot be looked at): refused when it is made, so nothing is recorded. The message
    says what happened in one sentence; deny the call instead."""


class StaleDecision(TransitionError):
    """The decision was made on arguments that are not the ones stored (a stale page)."""


class InvalidEditedArguments(NexoError):
    """Arguments edited by an approver do not fit the tool's schema or the gate."""


class LeaseLost(NexoError):
    """This worker no longer owns the run (its lease expired and another took it, or it was
    cancelled); it stops without writing."""


class WorkflowError(NexoError):
    """A workflow's steps were used wrongly: a step name twice in one pass, a result that is not
    JSON, an unknown question key."""


class WorkflowChanged(WorkflowError):
    """A workflow's code no longer reaches the steps its run recorded, in the same order: the run
    cannot resume (it would feed a stored result to a different step)."""


class StepFailed(WorkflowError):
    """An agent run inside a workflow ended without a final answer (failed or cancelled)."""


class InvalidAnswer(NexoError, ValueError):
    """An answer to a workflow's question that does not match the question's JSON Schema (or is
    not JSON). Nothing was recorded. ``path``: where in the answer (a form shows it there)."""

    def __init__(self, message: str, path: tuple[Any, ...] = ()) -> None:
        super().__init__(message)
        self.path = path


class NoAnswer(WorkflowError):
    """A workflow's question expired without an answer (raised from ``ask`` in ``call``)."""


class InputRequired(NexoError):
    """A tool needs a person's input before it can finish (an MCP server's ``input_required``
    result, protocol 2026-07-28): ``asks`` (``core.mcp_input.Ask`` by the server's keys) and the
    server's opaque ``state``. The loop hands it to its journal: a durable run suspends with a
    question per ask and calls the tool again with the answers."""

    def __init__(self, tool: str, asks: dict[str, Any], state: str | None) -> None:
        super().__init__(f"{tool} needs a person's input: " + "; ".join(f"{k}: {getattr(a, 'message', '')}"[:200]
                                                                       for k, a in asks.items()))
        self.tool, self.asks, self.state = tool, asks, state
