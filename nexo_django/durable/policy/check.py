"""The one check of who may decide a call an approval policy routes, called by
:func:`nexo_django.durable.runs.decide` (every path goes through it: the admin's page and bulk
actions, the JSON endpoint, Python, Slack, the webhook, an email's link).

What a call is decided by is what held **when it suspended**: the database stamps each call with
the policies' version as its row is written (``ToolCall.policy_version``: the latest
:class:`~nexo_django.models.ApprovalPolicyChange`, 0 when no policy was ever written), and
:func:`said` works out, once, which policy routed it at that version (kept as
``ToolCall.policy_said``). A policy changed, disabled or deleted while calls wait leaves them
decidable as it said then. No process decides by a stale idea of the policies, and where no policy
was ever written a suspension and a decision cost no statement more than before.

Under a policy, only a person in its approver groups (or, once it is escalated, its escalation
groups) decides; nobody who created or changed the policy; nobody without a person (``by=None``).
Each refusal is a :class:`PolicyRefusal` (``PermissionDenied``) of one sentence, and records
nothing. An expiry is nobody's and is not checked; a standing rule does not approve a routed call
(its denial stands): the call waits for the policy's approvers.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import F

from ...core.errors import ApprovalRefused
from ...models import CallStatus, ToolCall
from . import history, matching, quorum

#: Decisions nobody makes in person: not checked against a policy's groups (a standing rule's
#: approval of a routed call is refused, its denial stands).
UNCHECKED_SOURCES = frozenset({"expiry", "rule"})
DECIDE_PERMISSION = "nexo_django.decide_toolcall"


class PolicyRefusal(PermissionDenied):
    """A person a call's approval policy does not let decide it; nothing was recorded."""


def group_key(ids: list[int]) -> str:
    """``",3,7,"``: what ``ToolCall.approver_groups`` holds, for filtering by a member's groups."""
    return "," + ",".join(str(i) for i in sorted(set(ids))) + "," if ids else ""


def said(call: ToolCall) -> dict[str, Any] | None:
    """The policy that routed ``call`` when it suspended (``matching.said()`` of it), or None.
    Worked out (one query) the first time it is asked for a call, then kept on the call."""
    version = call.policy_version
    if not version:
        return None
    if call.routed_version == version:
        return call.policy_said
    found = matching.choose(history.as_of(version), call, call.agent or call.run.agent)
    # The approvers only: the escalation groups join when the call is escalated (.escalation).
    groups = group_key(list(found["approvers"])) if found else ""
    ToolCall.objects.filter(pk=call.pk).update(policy_said=found, routed_version=version, approver_groups=groups[:255])
    call.policy_said, call.routed_version, call.approver_groups = found, version, groups[:255]
    return found


def route_waiting(limit: int = 1000) -> int:
    """Work out :func:`said` for the waiting calls not routed yet (a list filtered by who may
    decide reads ``approver_groups``); how many. One query when there are none."""
    waiting = list(ToolCall.objects.filter(status=CallStatus.PENDING_APPROVAL, policy_version__gt=0)
                   .exclude(routed_version=F("policy_version")).select_related("run")[:limit])
    for call in waiting:
        said(call)
    return len(waiting)


def escalated(call: ToolCall, policy: dict[str, Any], now: datetime) -> bool:
    """Whether the escalation groups may decide now: the call was escalated (by the reconciler),
    or the policy's delay has passed since it began to wait."""
    after = policy.get("escalate_after")
    if not after or not policy.get("escalation_groups"):
        return False
    if call.escalated_at is not None:
        return True
    return call.created_at + timedelta(seconds=float(after)) <= now


def deciders(call: ToolCall, policy: dict[str, Any], now: datetime) -> list[int]:
    """The ids of the groups whose members may decide ``call`` now."""
    groups = list(policy.get("approvers") or [])
    if escalated(call, policy, now):
        groups += list(policy.get("escalation_groups") or [])
    return groups


def names(call: ToolCall, policy: dict[str, Any], now: datetime) -> str:
    found = list(policy.get("approvers_names") or [])
    if escalated(call, policy, now):
        found += list(policy.get("escalation_groups_names") or [])
    return ", ".join(found) or "no group"


def refusal(call: ToolCall, user: Any, now: datetime) -> str:
    """Why ``user`` may not decide ``call`` under its policy ("" if they may, or no policy routes it)."""
    policy = said(call)
    if policy is None:
        return ""
    name = f"policy \u201c{policy.get('name')}\u201d"
    groups = names(call, policy, now)
    if user is None:
        return (f"{call.name} call {call.tool_call_id} is routed by approval {name}: a member of {groups} "
                "decides it, so pass by=<that person>")
    if not getattr(user, "is_active", False):
        return (f"{user}'s account is inactive, so they cannot decide the calls approval {name} routes; "
                f"ask a member of {groups}")
    if history.authored_by(user.pk, policy.get("id")):
        return (f"{user} created or changed approval {name}, so they cannot decide the calls it routes (four eyes); "
                f"another member of {groups} must")
    allowed = set(deciders(call, policy, now))
    if not allowed or not set(user.groups.filter(pk__in=allowed).values_list("pk", flat=True)):
        return f"{user} is not in {groups}, the approvers of {name} that routes this call; ask a member of {groups}"
    if not user.has_perm(DECIDE_PERMISSION):  # as the admin and the channels check it (for Python too)
        return f"{user} may not decide calls (needs {DECIDE_PERMISSION}); ask a member of {groups}"
    return ""


def counts(call: ToolCall, now: datetime) -> Any:
    """``user -> bool``: whether an approval by ``user`` still counts towards the call's quorum:
    only while they may decide it (a member since removed, deactivated, or become an author of
    the policy no longer speaks for its group)."""
    return lambda user: user is not None and not refusal(call, user, now)


def note(call: ToolCall, now: datetime) -> str:
    """What a notice and the page say of a routed call: "Decided by ops (approval policy “Deploys”);
    1 of 2 approved, by ann" ("" when no policy routes it)."""
    policy = said(call)
    if policy is None:
        return ""
    text = f"Decided by {names(call, policy, now)} (approval policy \u201c{policy.get('name')}\u201d)"
    if escalated(call, policy, now):
        text += ", escalated"
    progress = quorum.progress(call, policy, counts(call, now))
    if progress:
        text += f"; {progress}"
    if call.reviewer_denied_at is not None:
        text += f"; the reviewer agent denied it ({call.risk} risk: {call.risk_reason}): deny to confirm, approve to reverse"
    elif call.risk in ("low", "medium", "high"):
        text += f"; the reviewer agent rates it {call.risk} risk: {call.risk_reason}"
    elif call.risk == "unknown":
        text += f"; no advice from the reviewer agent: {call.risk_reason}"
    return text


def drift(call: ToolCall) -> str:
    """What a page says when the call's policy changed or went since the call suspended ("": it
    did not, or no policy routes the call). One query, for a routed call only."""
    policy = said(call)
    if policy is None:
        return ""
    latest = history.latest(policy.get("id"))
    name = f"Approval policy \u201c{policy.get('name')}\u201d"
    if latest is None or latest.after is None:
        return f"{name} was deleted after this call suspended; it is decided by what the policy said then."
    if latest.pk > call.policy_version:
        return f"{name} was changed after this call suspended; it is decided by what the policy said then."
    return ""


def payload(call: ToolCall, now: datetime) -> dict[str, Any] | None:
    """The webhook's ``"policy"`` of a routed call (None when no policy routes it)."""
    policy = said(call)
    if policy is None:
        return None
    return {"id": policy.get("id"), "name": policy.get("name"), "approvers": policy.get("approvers_names") or [],
            "quorum": int(policy.get("quorum") or 1), "escalated": escalated(call, policy, now),
            "escalation_groups": policy.get("escalation_groups_names") or [],
            "approvals": [{"by": str(a.approved_by or ""), "at": a.approved_at.isoformat()} for a in quorum.approvals(call)]}


def narrow(users: Any, calls: Any, now: datetime, *, escalation: bool = False) -> Any:
    """``users`` (a queryset) narrowed to those who may decide each of ``calls`` its policy routes:
    the notices and reminders of a routed call go to its groups only (``escalation``: to its
    escalation groups only)."""
    for call in calls:
        policy = said(call)
        if policy is None:
            continue
        groups = list(policy.get("escalation_groups") or []) if escalation else deciders(call, policy, now)
        users = users.filter(groups__in=groups or [0]).exclude(
            pk__in=history.authors(policy.get("id"))).distinct()
    return users


def _routed_now(call: ToolCall) -> bool:
    """Whether a policy routes ``call``, read from the database (a standing rule's approval comes
    right after the suspension, from the row in memory: the version the database stamped on it is
    read here, one query for a rule's approval only)."""
    stored = ToolCall.objects.filter(pk=call.pk).values_list("policy_version", "routed_version", "policy_said").first()
    if stored is None:
        return False
    call.policy_version, call.routed_version, call.policy_said = stored
    return said(call) is not None


def gate(call: ToolCall, *, by: Any, approved: bool, args: Any, note: str, digest: str | None, source: str,
         now: datetime, rule: Any = None) -> Any:
    """Before ``decide()`` records anything: refuse (:class:`PolicyRefusal`) a person the call's
    policy does not let decide it; record an approval that is not yet the last one its quorum
    needs and return it (``decide()`` returns it then, and decides nothing). None: decide now.
    :data:`UNCHECKED_SOURCES` are exempt only as what they are: a standing rule's decision (with
    its ``rule``, nobody's) and an expiry (a denial, nobody's); a person, or an approval, that
    names one of them is checked as any other."""
    if source == "rule" and by is None and rule is not None:
        if approved and _routed_now(call):
            raise ApprovalRefused(f"{call.name} call {call.tool_call_id} is routed by approval policy "
                                  f"\u201c{(call.policy_said or {}).get('name')}\u201d: its approvers decide it, "
                                  "not a standing rule")
        return None
    if (source == "expiry" and by is None and not approved) or not call.policy_version:
        return None
    why = refusal(call, by, now)
    if why:
        raise PolicyRefusal(why)
    policy = call.policy_said or {}
    if not approved or int(policy.get("quorum") or 1) <= 1:
        return None
    return quorum.approve(call, policy, by, args=args, note=note, digest=digest, source=source,
                          counts=counts(call, now))
