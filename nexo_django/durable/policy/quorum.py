"""Several approvals of one call (a policy's ``quorum``): each person's approval is an
:class:`~nexo_django.models.Approval` (who, when, from where); the call is decided, and runs,
exactly once, when the last one needed lands; any denial ends it.

Each approval is recorded under the run's lock (PostgreSQL) or the database's write lock
(SQLite), then counted: of two people approving at once, the second counts both, and only it goes
on to decide. Should its process die between its approval and the decision, its approval is kept,
and the next approval (theirs again, or anyone's) finds the count reached and decides. The
decision's own compare-and-set keeps the call decided once whatever else races.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from ...core.errors import AlreadyDecided, InvalidEditedArguments, StaleDecision
from ...models import AgentRun, Approval, CallStatus, Notice, RunEvent, ToolCall
from .. import outbox, sql


def approvals(call: ToolCall) -> list[Approval]:
    return list(Approval.objects.filter(tool_call_id=call.pk).select_related("approved_by").order_by("approved_at", "id"))


def progress(call: ToolCall, policy: dict[str, Any] | None = None,
             counts: Callable[[Any], bool] | None = None) -> str:
    """"1 of 2 approved, by ann" ("" when the call needs one approval); with ``counts`` (whether
    an approver's approval still counts: :func:`.check.counts`), those that no longer do are
    named apart: "1 of 2 approved, by ann (no longer counted: olga)"."""
    policy = policy if policy is not None else call.policy_said
    needed = int((policy or {}).get("quorum") or 1)
    if needed <= 1:
        return ""
    found = approvals(call)
    lapsed = [a for a in found if counts is not None and not counts(a.approved_by)]
    found = [a for a in found if a not in lapsed]
    who = ", ".join(str(a.approved_by or "someone since removed") for a in found)
    text = f"{len(found)} of {needed} approved" + (f", by {who}" if who else "")
    if lapsed:
        text += f" (no longer counted: {', '.join(str(a.approved_by or 'someone since removed') for a in lapsed)})"
    return text


def approve(call: ToolCall, policy: dict[str, Any], user: Any, *, args: Any, note: str, digest: str | None,
            source: str, counts: Callable[[Any], bool]) -> Approval | None:
    """Record ``user``'s approval of ``call``; it, when more are needed; None when the quorum is
    reached (the caller decides the call now). Only the approvals of people who may still decide
    the call count (``counts``): one by a member since removed from the group, deactivated, or
    become an author of the policy is kept in the record but no longer counts."""
    needed = int(policy.get("quorum") or 1)
    if args is not None:
        raise InvalidEditedArguments(
            f"{call.name} needs {needed} approvals of the same arguments, so it cannot be approved with edited ones; "
            "approve it as it is, or deny it with a note")
    with transaction.atomic():
        sql.lock(AgentRun, call.run_id)
        current = ToolCall.objects.filter(pk=call.pk).values_list("status", "digest").first()
        if current is None or current[0] != CallStatus.PENDING_APPROVAL:
            raise AlreadyDecided(f"{call.name} call {call.tool_call_id} was already decided"
                                 + (f" ({current[0]})" if current else ""))
        if digest is not None and digest != current[1]:
            raise StaleDecision(f"the arguments of {call.name} are not the ones you saw; reload the page and decide again")
        try:
            with transaction.atomic():
                approval = Approval.objects.create(tool_call_id=call.pk, approved_by=user, source=source,
                                                   note=note[:2000], digest=current[1])
        except IntegrityError:
            approval = None  # theirs is already recorded
        count = sum(1 for a in approvals(call) if counts(a.approved_by))
        keys: list[str] = []
        if approval is not None and count < needed:
            RunEvent.objects.create(run_id=call.run_id, type="approval", data={
                "call": call.tool_call_id, "by": str(user), "source": source, "approvals": count, "needed": needed})
            # The channels hear of it (Slack updates its message: "1 of 2 approved, by ..."), once each.
            found = outbox.rows("approval.progress", call.run_id, [call.tool_call_id], timezone.now(),
                                {"approvals": count, "needed": needed}, subject=f"{call.tool_call_id}:{count}")
            Notice.objects.bulk_create([Notice(**dict(zip(outbox.COLUMNS, r, strict=True))) for r in found],
                                       ignore_conflicts=True)
            keys = [r[2] for r in found]
        outbox.wake(keys)
    if count >= needed:
        return None
    if approval is None:
        raise AlreadyDecided(f"{user} already approved {call.name} call {call.tool_call_id}; "
                             f"it needs {needed - count} more approval{'s' if needed - count != 1 else ''} by others")
    return approval
