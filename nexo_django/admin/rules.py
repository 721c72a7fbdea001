"""The admin of standing rules, and the decision page's "approve, and always allow".

A rule is created by a person with the decide permission (here, or from a call's decision page);
Django's admin log records who and when, and the rule keeps ``created_by``/``created_at``. The
list shows how many calls each rule decided. A rule that decided something cannot be deleted (its
decisions point at it and are immutable): disable it instead.

Whoever saves a rule here becomes ``changed_by``, one of its authors (four eyes: a rule does not
approve its authors' runs); every change is recorded with what the rule said before and after,
and listed on the rule's page (:mod:`nexo_django.durable.rule_history`).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import ADDITION, LogEntry
from django.db import transaction
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.html import format_html, format_html_join

from ..display import is_hidden, reveal
from ..durable import rule_history, rules, runs
from ..models import ApprovalRule, ApprovalRuleChange, RunEvent, ToolCall, Verdict
from . import loading
from .base import DecidedAheadAdmin


class ApprovalRuleForm(forms.ModelForm):
    class Meta:
        model = ApprovalRule
        fields = ("agent", "tool", "path", "verdict", "enabled", "expires_at", "note")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        tool = data.get("tool") or ""
        rules.validate(tool, rules.capability_of(tool), data.get("path") or "")
        return data


@admin.register(ApprovalRule)
class ApprovalRuleAdmin(DecidedAheadAdmin):
    form = ApprovalRuleForm
    list_display = ("rule", "agent_column", "tool_column", "path_column", "verdict", "enabled", "expires_at",
                    "created_by", "changed_by", "decided")
    list_display_links = ("rule",)
    list_filter = ("verdict", "enabled", "tool")
    search_fields = ("agent", "tool", "path", "note")
    readonly_fields = ("created_by", "created_at", "changed_by", "changed_at", "history")
    list_select_related = ("created_by", "changed_by")

    # Making, changing and removing rules is deciding calls ahead of time: the decide permission
    # (DecidedAheadAdmin).

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApprovalRule]:
        return super().get_queryset(request).annotate(decided_count=Count("decisions"))

    def save_model(self, request: HttpRequest, obj: ApprovalRule, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user  # type: ignore[assignment]
        # Whoever changes a rule is one of its authors (durable.rule_history records the change).
        obj.changed_by = request.user  # type: ignore[assignment]
        super().save_model(request, obj, form, change)

    def delete_model(self, request: HttpRequest, obj: ApprovalRule) -> None:
        obj.deleted_by = request.user  # type: ignore[attr-defined]  # read by rule_history.after_delete
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ApprovalRule]) -> None:
        # One by one, so each deletion is recorded with who made it (a queryset's delete() is not).
        with transaction.atomic():
            for rule in queryset:
                self.delete_model(request, rule)

    @admin.display(description="changes")
    def history(self, obj: ApprovalRule) -> Any:
        changes = list(ApprovalRuleChange.objects.filter(rule_pk=obj.pk).select_related("changed_by")[:50])
        if not changes:
            return "—"
        return format_html_join("", "<div>{} {} by {}: {} → {}</div>", (
            (c.changed_at.isoformat(" ", "seconds"), c.action, c.changed_by or "nobody known",
             rule_history.describe(c.before) or "—", rule_history.describe(c.after) or "—") for c in changes))

    @admin.display(description="rule", ordering="id")
    def rule(self, obj: ApprovalRule) -> str:
        return f"#{obj.pk}"

    @admin.display(description="agent", ordering="agent")
    def agent_column(self, obj: ApprovalRule) -> Any:
        return reveal(obj.agent) if obj.agent else "any agent"

    @admin.display(description="tool", ordering="tool")
    def tool_column(self, obj: ApprovalRule) -> Any:
        return reveal(obj.tool)

    @admin.display(description="path or command", ordering="path")
    def path_column(self, obj: ApprovalRule) -> Any:
        return format_html("<code>{}</code>", reveal(obj.path)) if obj.path else "any"

    @admin.display(description="calls decided", ordering="decided_count")
    def decided(self, obj: ApprovalRule) -> int:
        return int(getattr(obj, "decided_count", 0))


def always_allow_context(
    model_admin: Any, request: HttpRequest, call: ToolCall, *, head: str | None = None
) -> dict[str, Any]:
    """What the decision page needs for "approve, and always allow", and to tell the run's
    starter (self-approval off) why there are no buttons. ``head``: the start of arguments too
    big to load (admin.loading), where the suggestion's ``path`` or ``command`` is looked for."""
    args = None if head is None else loading.head_keys(head, ("path", "command"))
    suggested = rules.suggested_path(call, args)
    kind = "command" if call.capability == "shell" else "path" if call.capability in rules.PATH_CAPABILITIES else ""
    return {
        "is_requester": not model_admin.has_decide_permission(request, call) and model_admin.has_decide_permission(request),
        "rule_path_kind": kind,
        "rule_path": suggested,
        "rule_path_html": reveal(suggested),
        # An input's value cannot show invisible characters: such a path gets no "always allow".
        "rule_path_hidden": any(is_hidden(c) for c in suggested),
    }


def approve_always(
    model_admin: Any, request: HttpRequest, call: ToolCall, data: dict[str, Any]
) -> HttpResponse | None:
    """Approve ``call`` and create the rule "always allow this tool for this agent [for paths like
    …]" in one transaction; the rule is logged (admin log and a run event). None when it was done;
    a redirect back to the page when the rule as given could never match."""
    if call.capability == "shell":
        path = rules.suggested_path(call)  # the exact command shown: never a pattern or a prefix
    elif call.capability in rules.PATH_CAPABILITIES:
        path = (data.get("rule_path") or "").strip()
    else:
        path = ""
    try:
        rules.validate(call.name, call.capability, path)
    except forms.ValidationError as exc:
        messages.error(request, f"Nothing changed: {' '.join(exc.messages)}")
        return HttpResponseRedirect(model_admin.call_url(call.pk))
    user: Any = request.user  # a logged-in user: the admin site let only staff this far
    with transaction.atomic():
        rule = ApprovalRule.objects.create(
            agent=call.agent or call.run.agent, tool=call.name, path=path, verdict=Verdict.APPROVED,
            created_by=user, changed_by=user, note=(data.get("note") or f"from {call.name} call {call.tool_call_id}")[:2000],
        )
        LogEntry.objects.log_actions(
            user_id=user.pk, queryset=[rule], action_flag=ADDITION,
            change_message=f"Created from the decision page of {call.name} call {call.tool_call_id} (run {call.run_id}).",
        )
        RunEvent.objects.create(run_id=call.run_id, type="rule_created", data={
            "rule": rule.pk, "tool": call.name, "path": path, "by": str(request.user), "call": call.tool_call_id,
        })
        runs.decide(call, approved=True, by=request.user, note=data.get("note", ""), digest=data["digest"], source="admin")
    return None
