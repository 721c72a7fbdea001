"""What the admins of nexo_django share: read-only pages, the decide permission, run hooks."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.views.decorators.clickjacking import xframe_options_deny

from ..models import AgentRun, RunEvent, RunMessage

DECIDE_PERMISSION = "nexo_django.decide_toolcall"


class NexoModelAdmin(admin.ModelAdmin):
    """What the three admins share: read-only pages, the decide permission, run hooks."""

    #: Any active staff user may look, read-only. Set False to require Django's view permission
    #: (``view_pendingapproval``, ``view_agentrun``, ``view_decision``) as well.
    staff_can_view = True
    #: Messages shown before "show all"; the page loads only these rows.
    transcript_limit = 20
    events_limit = 50

    def has_decide_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Whether the user may decide calls (and settle, cancel or retry runs). Checked in
        every view that changes anything, not only by the admin site."""
        return bool(request.user.has_perm(DECIDE_PERMISSION))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return (
            self.has_decide_permission(request, obj)
            or (self.staff_can_view and user.is_active and user.is_staff)
            or super().has_view_permission(request, obj)
        )

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    # Nothing is added, edited or deleted here: decisions are immutable, and deleting a run would
    # delete its decisions with it.

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @method_decorator(xframe_options_deny)
    def history_view(self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().history_view(request, object_id, extra_context)

    def get_transcript(self, request: HttpRequest, run: AgentRun) -> QuerySet[RunMessage]:
        """The messages of ``run`` a person may read, in order."""
        return RunMessage.objects.filter(run=run).order_by("seq")

    def get_events(self, request: HttpRequest, run: AgentRun) -> QuerySet[RunEvent]:
        return RunEvent.objects.filter(run=run).order_by("id")

    def run_url(self, run_id: Any) -> str:
        return reverse(f"{self.admin_site.name}:nexo_django_agentrun_change", args=[run_id])

    def call_url(self, call_id: Any) -> str:
        return reverse(f"{self.admin_site.name}:nexo_django_pendingapproval_change", args=[call_id])

    def call_edit_url(self, call_id: Any) -> str:
        return reverse(f"{self.admin_site.name}:nexo_django_pendingapproval_edit", args=[call_id])

    def pending_arguments_url(self, call_id: Any) -> str:
        return reverse(f"{self.admin_site.name}:nexo_django_pendingapproval_arguments", args=[call_id])

    def run_call_arguments_url(self, run_id: Any, call_id: Any) -> str:
        return reverse(f"{self.admin_site.name}:nexo_django_agentrun_call_arguments", args=[run_id, call_id])

    def run_link(self, run_id: Any, label: str | None = None) -> SafeString:
        return format_html('<a href="{}">{}</a>', self.run_url(run_id), label or str(run_id)[:8])


class DecidedAheadAdmin(admin.ModelAdmin):
    """The admin of what decides calls ahead of time (standing rules, approval policies): any
    active staff user may look; making, changing and removing one takes the decide permission."""

    def has_decide_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(DECIDE_PERMISSION))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return self.has_decide_permission(request) or bool(user.is_active and user.is_staff)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self.has_decide_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_decide_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_decide_permission(request)
