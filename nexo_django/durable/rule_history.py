"""Who wrote a standing rule, and what it said.

Every save or delete of an :class:`~nexo_django.models.ApprovalRule` (the admin, "approve, and
always allow", the ORM) is recorded as an :class:`~nexo_django.models.ApprovalRuleChange`: who
(``rule.changed_by``, else its creator on creation), when, what it said before and after.
``AppConfig.ready`` wires the receivers; ``QuerySet.update()`` sends no signal and is not
recorded, so the admin never uses it on rules.

With self-approval off, a rule does not approve the runs of any of its authors: its creator and
everyone who ever changed it (:func:`authored_by`). Widening another approver's narrow rule
(``/harmless/*`` to ``/*``) does not let its editor approve their own calls with it.

A decision made by a rule keeps :func:`said`, what the rule said at that moment
(``Decision.rule_said``), so the audit shows it after the rule is edited, disabled or deleted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.utils import timezone

from ..models import ApprovalRule, ApprovalRuleChange

#: The fields of a rule its history and its decisions keep.
FIELDS = ("agent", "tool", "path", "verdict", "enabled", "expires_at", "note")


def said(rule: ApprovalRule) -> dict[str, Any]:
    """What ``rule`` says, as JSON: its id and :data:`FIELDS`."""
    data: dict[str, Any] = {"id": rule.pk}
    for name in FIELDS:
        value = getattr(rule, name)
        data[name] = value.isoformat() if hasattr(value, "isoformat") else value
    return data


def describe(data: dict[str, Any] | None) -> str:
    """``said()`` in words: "approved write /notes/* for any agent (rule #3)"."""
    if not data:
        return ""
    where = f" {data['path']}" if data.get("path") else ""
    agent = str(data.get("agent") or "").rsplit(".", 1)[-1] or "any agent"
    return f"{data.get('verdict')} {data.get('tool')}{where} for {agent} (rule #{data.get('id')})"


def authored_by(user_id: Any, rule_ids: Iterable[int]) -> set[int]:
    """Which of ``rule_ids`` ``user_id`` created or ever changed (one query)."""
    ids = list(rule_ids)
    if not ids or user_id is None:
        return set()
    return set(
        ApprovalRuleChange.objects.filter(rule_pk__in=ids, changed_by_id=user_id).values_list("rule_pk", flat=True)
    )


def before_save(sender: Any, instance: ApprovalRule, raw: bool = False, **kwargs: Any) -> None:
    """A receiver of ``pre_save``: remember what the rule said before, and stamp the change."""
    if raw:
        return
    old = ApprovalRule.objects.filter(pk=instance.pk).first() if instance.pk is not None else None
    instance._nexo_before = said(old) if old is not None else None  # type: ignore[attr-defined]
    if old is not None:
        instance.changed_at = timezone.now()
    if instance.changed_by_id is None and old is None:
        instance.changed_by_id = instance.created_by_id


def after_save(sender: Any, instance: ApprovalRule, created: bool, raw: bool = False, **kwargs: Any) -> None:
    """A receiver of ``post_save``: record the change."""
    if raw:
        return
    before = getattr(instance, "_nexo_before", None)
    after = said(instance)
    if not created and before == after:
        return  # saved unchanged: nothing to record
    ApprovalRuleChange.objects.create(
        rule=instance, rule_pk=instance.pk, action="created" if created else "changed",
        changed_by_id=instance.changed_by_id, before=before, after=after,
    )


def after_delete(sender: Any, instance: ApprovalRule, **kwargs: Any) -> None:
    """A receiver of ``post_delete``: record the deletion (by ``instance.deleted_by`` when the
    deleter set it)."""
    by = getattr(instance, "deleted_by", None)
    ApprovalRuleChange.objects.create(
        rule=None, rule_pk=instance.pk, action="deleted", changed_by_id=getattr(by, "pk", None),
        before=said(instance), after=None,
    )
