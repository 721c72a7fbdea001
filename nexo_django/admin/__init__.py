"""The Django admin for agents: the approval inbox, runs, and the decision log.

Decisions go through :func:`nexo_django.runs.decide` only; nothing here runs a tool. A project
narrows what a person sees by overriding the ``get_<thing>()`` hooks on a subclass and registering
it instead (``admin.site.unregister(PendingApproval); admin.site.register(PendingApproval, Mine)``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timesince import timesince
from django.views.decorators.clickjacking import xframe_options_deny

from ..bounded import preview
from ..conf import nexo_settings
from ..display import mark_hidden, reveal
from ..durable import outcomes, rule_history, runs
from ..durable import schedules as durable_schedules
from ..durable.queue_health import queue_warning
from ..models import (
    AgentRun,
    CallStatus,
    Decision,
    PendingApproval,
    RunStatus,
    ToolCall,
)
from . import audit, downloads, outbox, policies, rules, schedules, targets, views, workflows
from .base import NexoModelAdmin
from .filters import AgeFilter, AgentFilter, CapabilityFilter, RunAgentFilter, ToolFilter
from .forms import DecisionForm
from .insight import views as insight_views
from .previews import CallPreview, call_preview

#: registered on import, beside the inbox (rules are decisions made ahead of time)
ApprovalRuleAdmin = rules.ApprovalRuleAdmin
ApprovalPolicyAdmin = policies.ApprovalPolicyAdmin
#: registered on import: the questions of workflows, beside the pending calls
OpenQuestionAdmin = workflows.OpenQuestionAdmin
#: registered on import: the channels' outbox (what was sent where, what failed and why)
NoticeAdmin = outbox.NoticeAdmin
#: registered on import: schedules, the runs they started and the slots they skipped
ScheduleAdmin = schedules.ScheduleAdmin


# --- shared pieces ---------------------------------------------------------------------------------


def _started_by(run: AgentRun) -> str:
    return str(run.created_by) if run.created_by_id else "—"


# --- the approval inbox ----------------------------------------------------------------------------


@admin.register(PendingApproval)
class PendingApprovalAdmin(NexoModelAdmin):
    # The arguments come right after the tool so they stay on screen at 1280 px, sidebar open.
    list_display = ("requested", "tool", "arguments", "run_column")
    list_display_links = ("requested", "tool")
    list_filter = (policies.MineFilter, policies.RiskFilter, AgentFilter, ("name", ToolFilter), CapabilityFilter,
                   AgeFilter)
    search_fields = ("run__id", "name")
    search_help_text = "Search by run id or tool name."
    ordering = ("created_at", "id")
    list_select_related = ("run", "run__created_by")
    list_per_page = 50
    # The paginator counts the filtered calls; a second count of all of them is not worth a scan.
    show_full_result_count = False
    actions = ["approve_selected", "deny_selected"]
    decision_template = "admin/nexo_django/pendingapproval/decision.html"
    review_template = "admin/nexo_django/pendingapproval/review_edit.html"
    edit_template = "admin/nexo_django/pendingapproval/edit.html"
    bulk_deny_template = "admin/nexo_django/pendingapproval/bulk_deny.html"

    # Hooks -----------------------------------------------------------------------------------

    def has_decide_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """With ``NEXO["SELF_APPROVAL"]`` off, the person who started a call's run sees it but
        does not decide it (no buttons, and their POST is refused, bulk actions included)."""
        if not super().has_decide_permission(request, obj):
            return False
        return obj is None or nexo_settings.SELF_APPROVAL or not self.is_requester(request, obj)

    def is_requester(self, request: HttpRequest, call: ToolCall) -> bool:
        started_by = call.run.created_by_id
        return started_by is not None and started_by == request.user.pk

    def get_inbox_queryset(self, request: HttpRequest) -> QuerySet[PendingApproval]:
        """The calls waiting for this user. Override to narrow, e.g. to the agents a user owns."""
        return PendingApproval.objects.filter(status=CallStatus.PENDING_APPROVAL)

    def get_queryset(self, request: HttpRequest) -> QuerySet[PendingApproval]:
        return self.get_inbox_queryset(request).select_related(*self.list_select_related).order_by(*self.ordering)

    def get_decision_form(
        self, request: HttpRequest, call: ToolCall, data: Any = None, initial: dict[str, Any] | None = None
    ) -> DecisionForm:
        return DecisionForm(data, initial=initial, call=call, check_edited=self.check_edited_args)

    def check_edited_args(self, call: ToolCall, args: dict[str, Any]) -> None:
        """Validate edited arguments against the tool's schema and the gate, before the review
        page. ``runs.decide`` checks them again when the decision is recorded."""
        runs.check_edited_args(call.run, call, args)

    def get_call_preview(self, request: HttpRequest, call: ToolCall) -> CallPreview:
        """The workspace the call acts in and, for a write, the diff against the current file."""
        return call_preview(call.run, call)

    def get_other_pending(self, request: HttpRequest, call: ToolCall) -> QuerySet[PendingApproval]:
        return self.get_inbox_queryset(request).filter(run_id=call.run_id).exclude(pk=call.pk).order_by("created_at", "id")

    # Columns (model text escaped, hidden characters shown) ---------------------------------------

    class Media:
        css = {"all": ("nexo_django/admin.css",)}

    @admin.display(description="requested", ordering="created_at")
    def requested(self, obj: ToolCall) -> SafeString:
        # The deadline sits under the age: a column of its own would push the arguments off a laptop.
        return format_html('<span title="{}">{}</span><br><small>{}</small>', obj.created_at.isoformat(" ", "seconds"),
                           timesince(obj.created_at, depth=1), self.deadline(obj))

    @admin.display(description="run", ordering="agent")
    def run_column(self, obj: ToolCall) -> SafeString:
        # The class name only (the dotted path is its title): the arguments need the width.
        by = format_html(" <small>by {}</small>", obj.run.created_by) if obj.run.created_by_id else ""
        origin = durable_schedules.schedule_of(obj.run)  # read from the run's row: no query
        on = (format_html(' <small class="nexo-schedule">on schedule {}</small>', mark_hidden(str(origin.get("name"))))
              if origin else "")
        return format_html('<span title="{}">{}</span><br>{}{}{}', obj.agent, mark_hidden(obj.run.agent_name),
                           self.run_link(obj.run_id), by, on)

    @admin.display(description="tool", ordering="name")
    def tool(self, obj: ToolCall) -> SafeString:
        if obj.capability == obj.name:
            return reveal(obj.name)
        return format_html("{}<br><small>{}</small>", reveal(obj.name), obj.capability)

    @admin.display(description="arguments")
    def arguments(self, obj: ToolCall) -> SafeString:
        # The hidden digest makes bulk approval "what you saw is what you approve", as on the
        # decision page: the changelist rows sit inside the action form.
        # What the call acts on comes first (admin.targets), then the arguments.
        kind, target = targets.call_target(obj.name, obj.capability, obj.args, obj.server)
        lead = format_html('<span class="nexo-target" title="{}"><small>{}</small> <code>{}</code></span><br>',
                           kind, kind, reveal(targets.short(target), keep="")) if target else ""
        return format_html(
            '{}<span class="nexo-preview">{}</span><input type="hidden" name="digest_{}" value="{}">',
            lead, preview(obj.args), obj.pk, obj.digest,
        )

    def get_list_display(self, request: HttpRequest) -> Any:
        # The reviewer agent's column where some approval policy names one (durable.policy.reviewer).
        shown = super().get_list_display(request)
        return (*shown, "risk_column") if policies.reviewers_configured() else shown

    @admin.display(description="risk", ordering="risk")
    def risk_column(self, obj: ToolCall) -> SafeString:
        # The reviewer agent's advice (durable.policy.reviewer), its reason as the title.
        if not obj.risk:
            return format_html("{}", "—")
        label = f"{obj.risk}, denied" if obj.reviewer_denied_at else obj.risk
        return format_html('<span class="nexo-risk {}" title="{}">{}</span>', obj.risk, mark_hidden(obj.risk_reason),
                           label)

    @admin.display(description="started by", ordering="run__created_by")
    def started_by(self, obj: ToolCall) -> str:
        return _started_by(obj.run)

    @admin.display(description="deadline", ordering="expires_at")
    def deadline(self, obj: ToolCall) -> SafeString:
        if obj.expires_at is None:
            return format_html('<span class="nexo-deadline">{}</span>', "no deadline")
        left = obj.expires_at - timezone.now()
        # From the deadline on it is expired, whether or not the reconciler has run.
        words = (f"expires in {timesince(timezone.now(), obj.expires_at, depth=1)}" if left.total_seconds() > 0
                 else "expired: it can no longer be decided")
        return format_html('<span class="nexo-deadline" title="{}">{}</span>',
                           obj.expires_at.isoformat(" ", "seconds"), words)

    # Views -----------------------------------------------------------------------------------

    @method_decorator(xframe_options_deny)
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        views.refuse_post_without_permission(self, request)
        views.refuse_nul_in_query(request)
        if request.method == "GET":
            views.announce_needs_attention(self, request)
            workflows.announce_questions(self, request)
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None) or {}
        cl = context.get("cl")
        if cl is not None:
            context["title"] = f"Pending approvals ({cl.result_count} waiting)"
        return response

    def get_needs_attention(self, request: HttpRequest) -> QuerySet[AgentRun]:
        """Runs that wait for a person though no call of theirs is pending (a call whose outcome
        a crash hid): the inbox lists them above the pending calls. Override to narrow."""
        return AgentRun.objects.filter(status=RunStatus.NEEDS_ATTENTION).order_by("updated_at", "id")

    @method_decorator(xframe_options_deny)
    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return views.decision_view(self, request, object_id)

    @method_decorator(xframe_options_deny)
    def edit_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return views.edit_view(self, request, object_id)

    def arguments_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return downloads.pending_arguments_view(self, request, object_id)

    def get_urls(self) -> list[URLPattern]:
        # The editor and the full arguments are pages apart from the decision page, so the
        # decision page and what its buttons post stay small whatever the arguments' size.
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/edit/", wrap(self.edit_view), name="nexo_django_pendingapproval_edit"),
            path("<path:object_id>/arguments/", wrap(self.arguments_view), name="nexo_django_pendingapproval_arguments"),
            *super().get_urls(),
        ]

    # Bulk actions ----------------------------------------------------------------------------

    @admin.action(description="Approve selected calls", permissions=["decide"])
    def approve_selected(self, request: HttpRequest, queryset: QuerySet[PendingApproval]) -> None:
        views.bulk_approve(self, request, queryset)

    @admin.action(description="Deny selected calls (with one note)", permissions=["decide"])
    def deny_selected(self, request: HttpRequest, queryset: QuerySet[PendingApproval]) -> HttpResponse | None:
        return views.bulk_deny(self, request, queryset)


# --- runs ------------------------------------------------------------------------------------------


@admin.register(AgentRun)
class AgentRunAdmin(NexoModelAdmin):
    list_display = ("short_id", "agent_name", "status", "pending", "started_by", "created_at", "age", "finished_at")
    list_filter = ("status", RunAgentFilter, ("created_by", admin.RelatedOnlyFieldListFilter), AgeFilter)
    search_fields = ("id", "agent")
    search_help_text = "Search by run id or agent path."
    list_select_related = ("created_by",)
    date_hierarchy = None
    actions = ["cancel_selected"]
    detail_template = "admin/nexo_django/agentrun/detail.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[AgentRun]:
        # A correlated count, computed for the rows of the page only (not every run, as a
        # GROUP BY would).
        pending = (
            ToolCall.objects.filter(run=OuterRef("pk"), status=CallStatus.PENDING_APPROVAL)
            .order_by()
            .values("run")
            .annotate(n=Count("pk"))
            .values("n")
        )
        return super().get_queryset(request).annotate(
            pending_count=Coalesce(Subquery(pending, output_field=IntegerField()), 0)
        )

    def get_queue_warning(self, request: HttpRequest, run: AgentRun) -> str | None:
        """Why a queued run may wait forever (no worker listens on its queue), or None."""
        warning = queue_warning(run=run) if run.status == RunStatus.QUEUED else None
        return str(warning) if warning is not None else None

    @admin.display(description="run", ordering="created_at")
    def short_id(self, obj: AgentRun) -> str:
        return str(obj.pk)[:8]

    @admin.display(description="agent", ordering="agent")
    def agent_name(self, obj: AgentRun) -> str:
        return obj.agent_name

    @admin.display(description="pending", ordering="pending_count")
    def pending(self, obj: AgentRun) -> Any:
        count = int(getattr(obj, "pending_count", 0))
        if not count:
            return count
        inbox = reverse(f"{self.admin_site.name}:nexo_django_pendingapproval_changelist")
        return format_html('<a href="{}?q={}">{}</a>', inbox, obj.pk, count)

    @admin.display(description="started by", ordering="created_by")
    def started_by(self, obj: AgentRun) -> str:
        return _started_by(obj)

    @admin.display(description="age")
    def age(self, obj: AgentRun) -> str:
        return timesince(obj.created_at)

    @method_decorator(xframe_options_deny)
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        views.refuse_post_without_permission(self, request)
        views.refuse_nul_in_query(request)
        return super().changelist_view(request, {"title": "Agent runs", **(extra_context or {})})

    @method_decorator(xframe_options_deny)
    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return views.run_detail_view(self, request, object_id)

    def call_arguments_view(self, request: HttpRequest, object_id: str, call_id: str) -> HttpResponse:
        return downloads.run_call_arguments_view(self, request, object_id, call_id)

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/calls/<str:call_id>/arguments/", wrap(self.call_arguments_view),
                 name="nexo_django_agentrun_call_arguments"),
            *super().get_urls(),
        ]

    @admin.action(description="Cancel selected runs", permissions=["decide"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[AgentRun]) -> None:
        views.bulk_cancel(self, request, queryset)


# --- the decision log ------------------------------------------------------------------------------


@admin.register(Decision)
class DecisionAdmin(NexoModelAdmin):
    """Read-only audit log: who decided what, when, on which digest."""

    list_display = ("decided_at", "verdict", "tool", "run_column", "decided_by", "channel_user", "source", "rule_column", "edited",
                    "stop", "note_preview", "outcome")
    list_display_links = None
    list_filter = (audit.OutcomeFilter, "verdict", "source", "stop", ("decided_by", admin.RelatedOnlyFieldListFilter))
    search_fields = ("tool_call__run__id", "tool_call__name")
    list_select_related = ("tool_call", "decided_by")
    ordering = ("-decided_at", "-id")
    actions = None
    change_list_template = "admin/nexo_django/decision/change_list.html"

    def get_urls(self) -> list[Any]:
        export = self.admin_site.admin_view(lambda request, fmt: audit.export_view(self, request, fmt))
        return [path("export/<str:fmt>/", export, name="nexo_django_decision_export"),
                *insight_views.urls(self.admin_site), *super().get_urls()]

    @admin.display(description="rule", ordering="rule")
    def rule_column(self, obj: Decision) -> Any:
        if obj.rule_id is None:
            return "—"
        url = reverse(f"{self.admin_site.name}:nexo_django_approvalrule_change", args=[obj.rule_id])
        # What the rule said when it decided (it may say something else now, or be disabled).
        said = rule_history.describe(obj.rule_said)
        return format_html('<a href="{}">#{}</a>{}', url, obj.rule_id,
                           format_html("<br><small>{}</small>", reveal(said)) if said else "")

    @admin.display(description="outcome")
    def outcome(self, obj: Decision) -> str:
        return outcomes.of_call(obj.tool_call, obj, getattr(obj, "nexo_run_status", None)).text

    def get_queryset(self, request: HttpRequest) -> QuerySet[Decision]:
        # The run's status, for the outcome of an approved call that never ran (not the run's row).
        return super().get_queryset(request).annotate(nexo_run_status=F("tool_call__run__status"))

    @admin.display(description="tool")
    def tool(self, obj: Decision) -> SafeString:
        return format_html("{} <small>{}</small>", reveal(obj.tool_call.name), reveal(obj.tool_call.tool_call_id))

    @admin.display(description="run")
    def run_column(self, obj: Decision) -> SafeString:
        return self.run_link(obj.tool_call.run_id)

    @admin.display(description="edited", boolean=True)
    def edited(self, obj: Decision) -> bool:
        return obj.args is not None

    @admin.display(description="note")
    def note_preview(self, obj: Decision) -> SafeString:
        return reveal(obj.note[:80] + ("…" if len(obj.note) > 80 else ""), keep="")

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # A decision is shown with its run: the call, its arguments and what came of it.
        if not self.has_view_permission(request):
            raise PermissionDenied
        decision = self.get_object(request, object_id)
        if decision is None:
            raise Http404("No such decision.")
        return HttpResponseRedirect(self.run_url(decision.tool_call.run_id))

    @method_decorator(xframe_options_deny)
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        views.refuse_post_without_permission(self, request)
        views.refuse_nul_in_query(request)
        return super().changelist_view(request, extra_context)
