"""The admin of schedules: a form that refuses what cannot run (an invalid cron expression or
timezone, a class path that does not import) with the reason, and a page listing the runs the
schedule started and the slots it skipped, with why.

Changing schedules is Django's ``nexo_django.change_schedule`` permission: it starts runs, so give
it as you would the right to start them. The runs are started as the person who last saved (or resumed) the
schedule (its ``run_as``): they are that person's runs for the approval rules (with
``NEXO["SELF_APPROVAL"]`` off they cannot approve them).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..core.errors import ConfigurationError
from ..display import reveal
from ..durable import schedules
from ..durable.slots import Calendar, check_cron, zone
from ..models import AgentRun
from ..schedule_models import Schedule, ScheduleSlot
from .workflows import BoundedJSONField

#: slots listed on a schedule's page, newest first
SHOWN = 50
#: the fields whose change moves the next slot
CALENDAR_FIELDS = ("cron", "interval", "timezone", "enabled")


def refused_as_error(check: Any, value: Any) -> Any:
    """``check(value)``, its ``ConfigurationError`` (the reason, naming the fix) as the form's error."""
    try:
        return check(value)
    except ConfigurationError as exc:
        raise forms.ValidationError(str(exc)) from exc


class PayloadField(BoundedJSONField):
    what = "the payload"


class ScheduleForm(forms.ModelForm):
    payload = PayloadField(required=False, widget=forms.Textarea(attrs={"rows": 6, "cols": 60}),
                           help_text="A workflow's payload (JSON).")

    class Meta:
        model = Schedule
        fields = ("name", "target", "prompt", "payload", "permissions", "sandbox", "cwd", "cron", "interval",
                  "timezone", "enabled", "overlap", "missed", "max_failures")

    def clean_cron(self) -> str:
        value = str(self.cleaned_data.get("cron") or "")
        return refused_as_error(check_cron, value) if value.strip() else ""

    def clean_timezone(self) -> str:
        value = str(self.cleaned_data.get("timezone") or "")
        refused_as_error(zone, value)
        return value

    def clean_target(self) -> str:
        value = str(self.cleaned_data.get("target") or "")
        refused_as_error(schedules.target_class, value)
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        try:
            Calendar.of(data.get("cron") or "", data.get("interval"), data.get("timezone") or "UTC")
            probe = Schedule(**{k: data.get(k) for k in ("target", "prompt", "payload", "permissions", "sandbox",
                                                          "cwd", "cron", "interval", "timezone")})
            probe.prompt, probe.cwd = probe.prompt or "", probe.cwd or ""
            probe.permissions, probe.sandbox = probe.permissions or "", probe.sandbox or ""
            schedules.prepare(probe)
        except ConfigurationError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return data


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = ("name", "target", "when", "timezone", "enabled", "next_slot", "paused_reason_preview")
    list_filter = ("enabled", "kind")
    search_fields = ("name", "target")
    readonly_fields = ("kind", "next_slot", "paused_reason", "paused_at", "consecutive_failures", "run_as",
                       "created_at", "updated_at", "slots")
    actions = ["pause_selected", "resume_selected"]

    @admin.display(description="when")
    def when(self, obj: Schedule) -> str:
        return obj.cron or f"every {obj.interval} s"

    @admin.display(description="paused because")
    def paused_reason_preview(self, obj: Schedule) -> SafeString:
        text = obj.paused_reason
        return reveal(text[:160] + ("…" if len(text) > 160 else ""), keep="")

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        obj.run_as = request.user  # type: ignore[assignment]
        moved = not change or any(name in form.changed_data for name in CALENDAR_FIELDS)
        if moved:
            schedules.prepare(obj)  # the form checked it: the kind and the next slot, from now
            if obj.enabled:
                obj.paused_reason = ""
        if not change:
            obj.save()
            return
        # Only what the form changed (and what follows from it): a tick that fired meanwhile
        # moved next_slot, and writing back the value this form read would move it back.
        fields = [*form.changed_data, "run_as", "updated_at", "kind"]
        if moved:
            fields += ["next_slot", "paused_reason"]
        obj.save(update_fields=sorted(set(fields)))

    @admin.display(description="slots (newest first)")
    def slots(self, obj: Schedule) -> SafeString | str:
        if obj.pk is None:
            return "—"
        rows = list(ScheduleSlot.objects.filter(schedule=obj).order_by("-slot")[:SHOWN])
        if not rows:
            return "none yet"
        statuses = dict(AgentRun.objects.filter(pk__in=[r.run_id for r in rows if r.run_id])
                        .values_list("pk", "status"))
        body = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (
            (row.slot.isoformat(), row.outcome, self._run_cell(row, statuses), reveal(row.reason[:1000], keep=""))
            for row in rows))
        return format_html('<table id="schedule-slots"><thead><tr><th>slot</th><th>outcome</th><th>run</th>'
                           "<th>why</th></tr></thead><tbody>{}</tbody></table>", body)

    def _run_cell(self, row: ScheduleSlot, statuses: dict[Any, str]) -> SafeString | str:
        if row.run_id is None:
            return "—"
        url = reverse(f"{self.admin_site.name}:nexo_django_agentrun_change", args=[row.run_id])
        return format_html('<a href="{}">{}</a> ({})', url, str(row.run_id)[:8], statuses.get(row.run_id, "deleted"))

    @admin.action(description="Pause the selected schedules", permissions=["change"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        count = queryset.filter(enabled=True).update(enabled=False, paused_at=timezone.now(),
                                                     paused_reason=f"paused by {request.user}")
        self.message_user(request, f"{count} schedule(s) paused.", messages.SUCCESS)

    @admin.action(description="Resume the selected schedules (from their next slot)", permissions=["change"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        resumed, refused = 0, []
        for schedule in queryset.filter(enabled=False):
            try:
                schedules.resume(schedule, by=request.user)
                resumed += 1
            except ConfigurationError as exc:
                refused.append(f"{schedule.name}: {exc}")
        self.message_user(request, f"{resumed} schedule(s) resumed.", messages.SUCCESS)
        for reason in refused:
            self.message_user(request, f"Not resumed: {reason}", messages.ERROR)


def scheduled_by(admin_site_name: str, run: AgentRun) -> SafeString | None:
    """A link to the schedule that started ``run`` (its name as it was then), or None."""
    origin = schedules.schedule_of(run)
    if origin is None:
        return None
    url = reverse(f"{admin_site_name}:nexo_django_schedule_change", args=[origin.get("schedule")])
    return format_html('<a href="{}" id="scheduled-by">{}</a> (slot {})', url, reveal(str(origin.get("name")), keep=""),
                       str(origin.get("slot") or ""))
