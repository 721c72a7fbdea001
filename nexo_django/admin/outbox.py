"""The admin of the outbox: every notice to a channel, pending, delivered, skipped or failed with
its last error; people with the decide permission send failed ones again."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..display import reveal
from ..durable import outbox
from ..models import Notice, NoticeStatus
from .base import NexoModelAdmin


@admin.register(Notice)
class NoticeAdmin(NexoModelAdmin):
    list_display = ("created_at", "kind", "channel", "status_column", "attempts", "next_attempt_at", "delivered_at",
                    "run_column", "error_preview")
    list_display_links = None
    list_filter = ("status", "channel", "kind")
    search_fields = ("key", "run__id", "tool_call_id")
    ordering = ("-created_at", "-id")
    actions = ["retry"]

    @admin.display(description="status", ordering="status")
    def status_column(self, obj: Notice) -> SafeString:
        colours: dict[str, str] = {NoticeStatus.FAILED: "#ba2121", NoticeStatus.PENDING: "#b7791f"}
        colour = colours.get(obj.status, "inherit")
        return format_html('<strong style="color:{}">{}</strong>', colour, obj.status)

    @admin.display(description="run")
    def run_column(self, obj: Notice) -> SafeString | str:
        return self.run_link(obj.run_id) if obj.run_id else "—"

    @admin.display(description="last error")
    def error_preview(self, obj: Notice) -> SafeString:
        return reveal(obj.last_error[:160] + ("…" if len(obj.last_error) > 160 else ""), keep="")

    @admin.action(description="Send the selected notices again", permissions=["decide"])
    def retry(self, request: HttpRequest, queryset: QuerySet[Notice]) -> None:
        count = outbox.retry(queryset.filter(status__in=(NoticeStatus.FAILED, NoticeStatus.PENDING)))
        self.message_user(request, f"{count} notice(s) queued to be sent again.", messages.SUCCESS)
