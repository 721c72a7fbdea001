"""Who changed an approval policy, and what it said: an :class:`~nexo_django.models.ApprovalPolicyChange`
per change (created, changed, its groups changed, deleted), as :mod:`..rule_history` records
standing rules. ``AppConfig.ready`` wires the receivers. ``QuerySet.update()`` sends no signal and
is not recorded, so nothing here uses it on policies.

The id of the latest change is the policies' version: the database stamps it on each call as it
suspends (``ToolCall.policy_version``), and :func:`as_of` gives the policies as they stood then.
Nobody decides under a policy they changed (:func:`authored_by`).
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from ...models import ApprovalPolicy, ApprovalPolicyChange
from . import matching


def latest(policy_pk: Any) -> ApprovalPolicyChange | None:
    """The policy's latest change (its deletion, if it was deleted)."""
    return ApprovalPolicyChange.objects.filter(policy_pk=policy_pk).order_by("-id").first()


def _last(policy_pk: Any) -> dict[str, Any] | None:
    change = latest(policy_pk)
    return change.after if change is not None else None


def record(policy: ApprovalPolicy, action: str) -> None:
    """Record what ``policy`` says now, if it says something new (by ``policy.changed_by``)."""
    before = _last(policy.pk)
    after = matching.said(policy)
    if before == after:
        return
    ApprovalPolicyChange.objects.create(
        policy=policy, policy_pk=policy.pk, action=action,
        changed_by_id=policy.changed_by_id, before=before, after=after,
    )


def before_save(sender: Any, instance: ApprovalPolicy, raw: bool = False, **kwargs: Any) -> None:
    """``pre_save``: stamp the change (its first saver is its creator)."""
    if raw:
        return
    if instance.pk is not None:
        instance.changed_at = timezone.now()
    elif instance.changed_by_id is None:
        instance.changed_by_id = instance.created_by_id


def after_save(sender: Any, instance: ApprovalPolicy, created: bool, raw: bool = False, **kwargs: Any) -> None:
    if not raw:
        record(instance, "created" if created else "changed")


def groups_changed(sender: Any, instance: Any, action: str, reverse: bool = False, **kwargs: Any) -> None:
    """``m2m_changed`` of a policy's groups (the admin sets them after saving the policy)."""
    if action in ("post_add", "post_remove", "post_clear") and not reverse and isinstance(instance, ApprovalPolicy):
        record(instance, "changed")


def after_delete(sender: Any, instance: ApprovalPolicy, **kwargs: Any) -> None:
    """``post_delete`` (by ``instance.deleted_by`` when the deleter set it)."""
    by = getattr(instance, "deleted_by", None)
    ApprovalPolicyChange.objects.create(
        policy=None, policy_pk=instance.pk, action="deleted", changed_by_id=getattr(by, "pk", None),
        before=_last(instance.pk), after=None,
    )


def as_of(version: int) -> list[dict[str, Any]]:
    """The enabled policies as they stood at ``version`` (one query)."""
    latest: dict[int, Any] = {}
    for pk, after in ApprovalPolicyChange.objects.filter(id__lte=version).order_by("id").values_list("policy_pk", "after"):
        latest[pk] = after
    return [p for p in latest.values() if p and p.get("enabled")]


def authored_by(user_id: Any, policy_pk: Any) -> bool:
    """Whether ``user_id`` created or ever changed the policy ``policy_pk``."""
    return user_id is not None and ApprovalPolicyChange.objects.filter(policy_pk=policy_pk, changed_by_id=user_id).exists()


def authors(policy_pk: Any) -> Any:
    """The ids of everyone who created or changed the policy ``policy_pk`` (a subquery)."""
    return ApprovalPolicyChange.objects.filter(policy_pk=policy_pk, changed_by__isnull=False).values("changed_by_id")


def describe(data: dict[str, Any] | None) -> str:
    """A policy's ``said()`` in words: "Deploys (#3): ops-leads, 2 approvals"."""
    if not data:
        return ""
    groups = ", ".join(data.get("approvers_names") or []) or "no group"
    quorum = int(data.get("quorum") or 1)
    text = f"{data.get('name')} (#{data.get('id')}): {groups}, {quorum} approval{'s' if quorum != 1 else ''}"
    if data.get("escalate_after"):
        text += f", escalated to {', '.join(data.get('escalation_groups_names') or [])} after {int(data['escalate_after'])} s"
    return text
