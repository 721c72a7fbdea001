"""What happened after a decision: the outcome shown beside it wherever it is shown (the run's
page, the decision log, the audit export, the run's public page).

An approval never reads as if it acted when it did not: the outcome comes from the call's row
(its status and result) and its run's status, never from the verdict alone.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.utils import timezone

from ..models import CallStatus, RunStatus, Verdict

#: Characters of a reason kept in an outcome.
REASON_CHARS = 300


class Outcome(NamedTuple):
    #: ``ran_ok``, ``error`` (refused when it ran, or failed: the reason says), ``denied``,
    #: ``expired``, ``cancelled``, ``waiting``, ``running``, ``unknown``, ``pending``
    kind: str
    #: one plain sentence, with the reason when there is one
    text: str
    reason: str = ""


def _reason(result: Any) -> str:
    error = result.get("error") if isinstance(result, dict) else None
    text = error if isinstance(error, str) else "" if error is None else str(error)
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


def of(*, status: str, result: Any, verdict: str | None, source: str = "", stop: bool = False,
       run_status: str | None = None) -> Outcome:
    """The outcome of a call in ``status`` with ``result`` whose decision was ``verdict`` (None:
    undecided) by ``source``; ``run_status`` tells a call cancelled with its run from one that
    still waits to run."""
    if verdict is None:
        if status == CallStatus.EXPIRED:
            return Outcome("cancelled", "not decided: its run ended first")
        return Outcome("pending", "waiting for a decision")
    if verdict != Verdict.APPROVED:
        if source == "expiry":
            return Outcome("expired", "expired: nobody decided in time; it did not run")
        if stop:
            return Outcome("denied", "denied, and the run stopped; it did not run")
        return Outcome("denied", "denied; it did not run")
    if status == CallStatus.SUCCEEDED:
        return Outcome("ran_ok", "ran as approved")
    if status == CallStatus.FAILED:
        # The tool's own refusal (a write whose file changed: "nothing was written"), the
        # sandbox's, or an error while it ran: the reason says which.
        reason = _reason(result)
        return Outcome("error", f"did not succeed: {reason}" if reason else "did not succeed", reason)
    if status == CallStatus.EXPIRED:
        return Outcome("cancelled", "cancelled with the run before it ran")
    if status == CallStatus.OUTCOME_UNKNOWN:
        return Outcome("unknown", "outcome unknown: its worker stopped while it ran; a person decides whether it runs again")
    if status == CallStatus.EXECUTING:
        return Outcome("running", "running")
    # Approved, not run yet: its run is queued, or ended before it got to the call.
    if run_status in (RunStatus.CANCELLED, RunStatus.FAILED, RunStatus.DONE):
        return Outcome("cancelled", f"not run: its run {'was cancelled' if run_status == RunStatus.CANCELLED else run_status} first")
    return Outcome("waiting", "approved; waiting to run")


def of_call(call: Any, decision: Any = None, run_status: str | None = None) -> Outcome:
    """:func:`of` for a ``ToolCall`` (its ``decision`` read from it unless given)."""
    if decision is None:
        decision = getattr(call, "decision", None) if _has_decision(call) else None
    return of(
        status=call.status, result=call.result, run_status=run_status,
        verdict=decision.verdict if decision is not None else None,
        source=decision.source if decision is not None else "", stop=bool(decision and decision.stop),
    )


def _has_decision(call: Any) -> bool:
    try:
        return getattr(call, "decision", None) is not None
    except Exception:  # RelatedObjectDoesNotExist: not decided
        return False


def is_expired(call: Any, now: Any = None) -> bool:
    """Whether ``call``'s approval request has ended without a decision: expired by the
    reconciler, or past its deadline and not yet reconciled. From the deadline on nothing offers
    Approve or Deny (``decide`` refuses it), whether or not the reconciler has run."""
    if call.status == CallStatus.EXPIRED:
        return True
    if call.status != CallStatus.PENDING_APPROVAL or call.expires_at is None:
        return False
    return bool(call.expires_at <= (now or timezone.now()))


def expired_sentence(call: Any) -> str:
    """One plain sentence for a call whose request expired."""
    when = f" at {call.expires_at.isoformat(' ', 'seconds')}" if call.expires_at is not None else ""
    return f"{call.name} call {call.tool_call_id} expired{when} without a decision: it can no longer be approved or denied."
