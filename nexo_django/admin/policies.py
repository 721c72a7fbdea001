"""The admin of approval policies (:mod:`nexo_django.durable.policy`).

Made, changed and removed by people with the decide permission, as standing rules are; whoever
saves one becomes one of its authors and never decides the calls it routes. Every change is
recorded with what the policy said before and after (:mod:`nexo_django.durable.policy.history`)
and listed on its page. A policy that could not work is refused with the reason, nothing saved:
no approver group, a quorum larger than the people who could approve, a target the gate's targets
can never match, half an escalation, a reviewer that does not import.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html_join

from ..conf import nexo_settings
from ..core.agent import Agent
from ..durable import agent_classes
from ..durable.policy import check as policy_check
from ..durable.policy import history, matching
from ..models import ApprovalPolicy, ApprovalPolicyChange, CallStatus, ToolCall
from .base import DecidedAheadAdmin


class ApprovalPolicyForm(forms.ModelForm):
    class Meta:
        model = ApprovalPolicy
        fields = ("name", "order", "enabled", "agent", "capability", "tool", "target", "approvers", "quorum",
                  "escalate_after", "escalation_groups", "reviewer", "reviewer_may_deny")

    #: the person saving (an author: not counted among those who could approve)
    saver: Any = None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        groups = list(data.get("approvers") or [])
        if not groups:
            raise forms.ValidationError({"approvers": "Choose at least one approver group: the policy routes the "
                                                      "calls it matches to the people in it."})
        quorum = data.get("quorum")
        if quorum is not None:
            if quorum < 1:
                raise forms.ValidationError({"quorum": "A quorum is at least 1 approval."})
            # Who could approve: active members holding the decide permission (the others are refused).
            may = Permission.objects.filter(codename="decide_toolcall", content_type__app_label="nexo_django")
            people = get_user_model()._default_manager.filter(groups__in=groups, is_active=True).filter(
                Q(is_superuser=True) | Q(user_permissions__in=may) | Q(groups__permissions__in=may)).distinct()
            if self.saver is not None:
                people = people.exclude(pk=self.saver.pk)
            if self.instance.pk is not None:
                people = people.exclude(pk__in=history.authors(self.instance.pk))
            count = people.count()
            if quorum > count:
                names = ", ".join(g.name for g in groups)
                raise forms.ValidationError({"quorum": (
                    f"The quorum is {quorum} but {names} has {count} active member{'s' if count != 1 else ''} who "
                    "could approve (the policy's authors never do): lower the quorum or add people to the group.")})
        matching.validate(data.get("capability") or "", data.get("tool") or "", data.get("target") or "")
        if bool(data.get("escalate_after")) != bool(list(data.get("escalation_groups") or [])):
            raise forms.ValidationError({"escalate_after": "An escalation needs both a delay and at least one "
                                                           "escalation group; give both, or neither."})
        reviewer = data.get("reviewer") or ""
        if reviewer:
            try:
                found = agent_classes.agent_class(reviewer)
            except ImportError as exc:
                raise forms.ValidationError({"reviewer": f"The reviewer {reviewer} does not import ({exc}); "
                                                         "give the dotted path of an Agent class."}) from exc
            if not (isinstance(found, type) and issubclass(found, Agent)):
                # It would be built and run as one: a function or another class is refused here.
                raise forms.ValidationError({"reviewer": f"The reviewer {reviewer} is not an Agent class; give the "
                                                         "dotted path of an Agent class."})
        elif data.get("reviewer_may_deny"):
            raise forms.ValidationError({"reviewer_may_deny": "Only a reviewer may deny: name the reviewer agent, "
                                                              "or leave this off."})
        return data


class MineFilter(admin.SimpleListFilter):
    """The inbox's "mine to decide": the calls this person may decide now (those no policy
    routes, and those routed to one of their groups), not the ones they are refused."""

    title = "who decides"
    parameter_name = "decide"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("mine", "mine to decide")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() != "mine":
            return queryset
        policy_check.route_waiting()
        user: Any = request.user
        mine = Q(approver_groups="")
        for pk in user.groups.values_list("pk", flat=True):
            mine |= Q(approver_groups__contains=f",{pk},")
        queryset = queryset.filter(mine)
        if not nexo_settings.SELF_APPROVAL:
            queryset = queryset.exclude(run__created_by_id=user.pk)
        authored = sorted(set(ApprovalPolicyChange.objects.filter(changed_by_id=user.pk)
                              .values_list("policy_pk", flat=True)))
        if authored:  # nobody decides under a policy they changed
            theirs = ToolCall.objects.filter(status=CallStatus.PENDING_APPROVAL, policy_said__id__in=authored)
            queryset = queryset.exclude(pk__in=theirs.values("pk"))
        return queryset


def reviewers_configured() -> bool:
    """Whether some approval policy names a reviewer agent (the inbox then shows its column)."""
    return ApprovalPolicy.objects.exclude(reviewer="").exists()


class RiskFilter(admin.SimpleListFilter):
    """The reviewer agent's advice: its risk levels, its denials, no advice."""

    title = "reviewer's risk"
    parameter_name = "risk"
    CHOICES = (("high", "high"), ("medium", "medium"), ("low", "low"), ("denied", "denied by the reviewer"),
               ("unknown", "no advice (it failed)"))

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(self.CHOICES)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == "denied":
            return queryset.filter(reviewer_denied_at__isnull=False)
        if value in ("high", "medium", "low", "unknown"):
            return queryset.filter(risk=value)
        return queryset


@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(DecidedAheadAdmin):
    form = ApprovalPolicyForm
    list_display = ("name", "order", "enabled", "agent", "capability", "tool", "target", "quorum", "escalate_after",
                    "reviewer", "changed_by")
    list_filter = ("enabled", "capability")
    search_fields = ("name", "agent", "tool", "target")
    filter_horizontal = ("approvers", "escalation_groups")
    readonly_fields = ("created_by", "created_at", "changed_by", "changed_at", "history")

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"saver": request.user})

    def save_model(self, request: HttpRequest, obj: ApprovalPolicy, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user  # type: ignore[assignment]
        obj.changed_by = request.user  # type: ignore[assignment]  # an author from now on
        super().save_model(request, obj, form, change)

    def delete_model(self, request: HttpRequest, obj: ApprovalPolicy) -> None:
        obj.deleted_by = request.user  # type: ignore[attr-defined]  # read by history.after_delete
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ApprovalPolicy]) -> None:
        with transaction.atomic():  # one by one: each deletion is recorded with who made it
            for found in queryset:
                self.delete_model(request, found)

    @admin.display(description="changes")
    def history(self, obj: ApprovalPolicy) -> Any:
        changes = list(ApprovalPolicyChange.objects.filter(policy_pk=obj.pk).select_related("changed_by")[:50])
        if not changes:
            return "—"
        return format_html_join("", "<div>{} {} by {}: {} → {}</div>", (
            (c.changed_at.isoformat(" ", "seconds"), c.action, c.changed_by or "nobody known",
             history.describe(c.before) or "—", history.describe(c.after) or "—") for c in changes))
