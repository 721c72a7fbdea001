"""Escalation: a call its policy routes that nobody decided within the policy's
``escalate_after`` is escalated. From that moment its escalation groups may decide it too
(:func:`.check.escalated`, whether or not the reconciler has run yet, as a deadline is); the
reconciler (:func:`nexo_django.durable.recovery.reconcile`, with the clock it is given) records
it on the call (``ToolCall.escalated_at``, a ``escalated`` run event) and tells the escalation
groups: an ``approval.escalated`` notice to every channel that listens to it (email: the members
of the escalation groups only). Once per call: the record is a compare-and-set, the notice's key
unique. Expiry still ends the call at its deadline.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Q, QuerySet

from ...models import CallStatus, Notice, RunEvent, ToolCall
from .. import outbox
from . import check

#: calls looked at per round of the reconciler
ROUND = 500


def to_look_at() -> QuerySet[ToolCall]:
    """The waiting calls a policy routes that may need a review or an escalation: the
    reconciler's probe (no row where no policy was ever written)."""
    return ToolCall.objects.filter(Q(escalated_at=None) | Q(risk__in=("", "reviewing")), status=CallStatus.PENDING_APPROVAL,
                                   policy_version__gt=0)


def escalate_due(now: datetime) -> list[str]:
    """Escalate every routed call still waiting at ``now`` past its policy's delay; the keys of
    the notices written (to deliver)."""
    # One query a round (none of it where no policy was ever written: no call has a version).
    waiting = list(ToolCall.objects.filter(status=CallStatus.PENDING_APPROVAL, policy_version__gt=0, escalated_at=None)
                   .select_related("run").order_by("created_at", "id")[:ROUND])
    keys: list[str] = []
    for call in waiting:
        policy = check.said(call)
        if policy is None or not check.escalated(call, policy, now):
            continue
        groups = check.group_key(list(policy.get("approvers") or []) + list(policy.get("escalation_groups") or []))
        with transaction.atomic():
            if not ToolCall.objects.filter(pk=call.pk, status=CallStatus.PENDING_APPROVAL, escalated_at=None).update(
                    escalated_at=now, approver_groups=groups[:255], updated_at=now):
                continue  # decided, or escalated by another reconciler, meanwhile
            RunEvent.objects.create(run_id=call.run_id, type="escalated", data={
                "call": call.tool_call_id, "policy": policy.get("id"), "to": policy.get("escalation_groups_names")})
            found = outbox.rows("approval.escalated", call.run_id, [call.tool_call_id], now,
                                {"to": policy.get("escalation_groups_names")})
            Notice.objects.bulk_create([Notice(**dict(zip(outbox.COLUMNS, r, strict=True))) for r in found],
                                       ignore_conflicts=True)
            keys += [r[2] for r in found]
    return keys
