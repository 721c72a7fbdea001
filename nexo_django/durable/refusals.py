"""An approval whose call the sandbox refuses at decision time ends its run, once.

:func:`nexo_django.durable.binding.bind` raises :class:`~.binding.SandboxRefusal` when an
approved ``read`` or ``write`` names a target the sandbox refuses now (a link planted out of the
workspace while the call waited, the workspace's ``cwd`` link retargeted...). Such a call could
never run, so leaving it pending would leave its run suspended for ever. Instead
:func:`fail_refused` records, in one compare-and-set batch (the same gate as any decision: the
call still pending, with the digest the person saw):

- the person's approval (a ``Decision``: verdict ``approved``, its source and approver, no file
  version), so the audit says who approved what;
- the call ``failed`` with ``{"error": "SecurityError: ..."}`` (the decision log's and the audit
  export's outcome reads "did not succeed: SecurityError: ..."; ``run.retry()`` hands the model
  that error as the call's result, so it is never run);
- the run ``failed`` with ``run.error = "SecurityError: ..."``, its other pending calls expired,
  the ``decision``, ``security`` and ``failed`` events, and the ``approval.decided`` and
  ``run.failed`` notices (the outbox), all in the same commit.

Of two approvers at once one batch matches: the other is told the call was already decided.
Nothing is read or written at the refused target.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction

from ..core.errors import TransitionError
from ..models import (
    AgentRun,
    CallStatus,
    Decision,
    RunEvent,
    RunStatus,
    ToolCall,
    Verdict,
)
from ..signals import approval_decided
from . import driver, outbox, parents, rule_history, sql
from .binding import SandboxRefusal
from .fixed import PENDING_APPROVAL

EVENT_COLUMNS = ("run_id", "type", "data", "created_at")


def error_of(refusal: SandboxRefusal, call: ToolCall) -> str:
    """What ``run.error`` and the call's result say."""
    return (f"SecurityError: {call.name} call {call.tool_call_id} was approved, but the sandbox refuses it "
            f"now ({refusal.security}); nothing was read or written, and the run ended")


def fail_refused(
    call: ToolCall, refusal: SandboxRefusal, *, now: datetime, decided: dict[str, Any], digest: str | None,
    lost: Callable[[], None], changed: Callable[[Any, str, str], None],
) -> Decision:
    """Record the approval of ``call`` with its refusal and end the run (see the module).
    ``decided``: the Decision's fields (verdict, approver, source...); ``lost()`` raises why the
    compare-and-set did not match (already decided, expired, stale digest); ``changed`` is the
    run-status signal's sender."""
    message = error_of(refusal, call)
    run_id = call.run_id
    match: dict[str, Any] = {"id": call.pk, "status": PENDING_APPROVAL}
    if digest is not None:
        match["digest"] = digest
    batch = sql.Batch()
    batch.lock_first(AgentRun, run_id)  # the run before its call, as every writer of both
    batch.gate(ToolCall, match, {"status": CallStatus.FAILED, "result": {"error": message}, "updated_at": now})
    rule = decided.get("rule")
    decision = driver.new(
        Decision, tool_call=call, verdict=Verdict.APPROVED, stop=False, file_version=None,
        rule_said=rule_history.said(rule) if rule is not None else None, **decided,
    )
    batch.create([decision])
    event = {"call": call.tool_call_id, "verdict": str(Verdict.APPROVED), "edited": decided.get("args") is not None,
             "by": str(decided.get("decided_by") or ""), "source": decided["source"], "refused": message}
    if rule is not None:
        event["rule"] = rule.pk
    batch.insert(RunEvent, EVENT_COLUMNS, [
        (run_id, "decision", event, now),
        (run_id, "security", {"id": call.tool_call_id, "name": call.name, "error": message}, now),
        (run_id, "failed", {"error": message}, now),
    ])
    notices = outbox.on_decided(batch, call, decided["source"], now)

    def end_run() -> None:
        ended = AgentRun.objects.filter(pk=run_id, status=RunStatus.SUSPENDED).update(
            status=RunStatus.FAILED, error=message, lease_owner=None, lease_expires_at=None,
            finished_at=now, updated_at=now,
        )
        if not ended:  # a pending call's run is suspended; anything else rolls the batch back
            raise TransitionError(f"run {run_id} is not suspended; {call.name} call {call.tool_call_id} was not decided")
        ToolCall.objects.filter(run_id=run_id, status=CallStatus.PENDING_APPROVAL).update(
            status=CallStatus.EXPIRED, updated_at=now
        )
        notices.extend(outbox.write("run.failed", run_id, now, subject=outbox.end_subject("failed")))

    batch.call(end_run)
    if not batch.run():
        lost()
    call.status = CallStatus.FAILED
    call.result = {"error": message}
    outbox.wake(notices)
    changed(run_id, RunStatus.SUSPENDED, RunStatus.FAILED)
    run = AgentRun.objects.filter(pk=run_id).only("pk", "parent_id").first()
    if run is not None:
        parents.child_ended(run)
    transaction.on_commit(lambda: approval_decided.send(sender=ToolCall, tool_call=call, decision=decision))
    return decision


def refused(call: ToolCall) -> str:
    """The reason an approved ``call`` was refused by the sandbox at decision time, or ``""``."""
    result = call.result if call.status == CallStatus.FAILED else None
    error = result.get("error") if isinstance(result, dict) else None
    return error if isinstance(error, str) and error.startswith("SecurityError: ") else ""
