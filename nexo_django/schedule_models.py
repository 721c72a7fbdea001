"""Schedules: an agent or a workflow started on a calendar (``durable/schedules.py`` fires them).

``ScheduleSlot`` is the exactly-once key: one row per schedule and slot time (a unique constraint),
written in the commit that starts the slot's run or records why it was skipped.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from .storable import StoredJSONField


class Overlap(models.TextChoices):
    SKIP = "skip", "skip the slot while the previous run is queued, running or waiting"
    RUN = "run", "start a run anyway"


class Missed(models.TextChoices):
    LATEST = "latest", "run the latest missed slot once"
    SKIP = "skip", "skip missed slots"


class SlotOutcome(models.TextChoices):
    STARTED = "started"
    SKIPPED = "skipped"


class Schedule(models.Model):
    name = models.CharField(max_length=200, unique=True)
    target = models.CharField(
        max_length=255, help_text="Dotted path of an Agent or Workflow class, e.g. myapp.agents.Triage.")
    #: "agent" or "workflow": what ``target`` named when it was last checked
    kind = models.CharField(max_length=10, default="agent", editable=False)
    prompt = models.TextField(blank=True, default="", help_text="An agent's prompt.")
    payload = StoredJSONField(null=True, blank=True, help_text="A workflow's payload (JSON).")
    permissions = models.CharField(max_length=20, blank=True, default="",
                                   help_text="A permission mode for an agent's runs; blank: the class's own.")
    sandbox = models.CharField(max_length=20, blank=True, default="",
                               help_text='"virtual" or "local" for an agent; blank: the class\'s own.')
    cwd = models.CharField(max_length=1000, blank=True, default="", help_text="The workspace folder of a local sandbox.")
    cron = models.CharField(max_length=200, blank=True, default="",
                            help_text='A cron expression, e.g. "0 7 * * 1-5" (07:00 on weekdays, in the timezone).')
    interval = models.PositiveIntegerField(null=True, blank=True, help_text="Or: every this many seconds.")
    timezone = models.CharField(max_length=64, default="UTC", help_text="An IANA name, e.g. Europe/Berlin.")
    enabled = models.BooleanField(default=True)
    paused_reason = models.TextField(blank=True, default="")
    paused_at = models.DateTimeField(null=True, blank=True)
    overlap = models.CharField(max_length=10, choices=Overlap.choices, default=Overlap.SKIP)
    missed = models.CharField(max_length=10, choices=Missed.choices, default=Missed.LATEST)
    max_failures = models.PositiveIntegerField(
        default=3, help_text="Pause after this many failed runs in a row (0: never).")
    consecutive_failures = models.PositiveIntegerField(default=0, editable=False)
    #: The next slot to fire: every tick compares-and-sets it, so one scheduler fires each slot.
    next_slot = models.DateTimeField(null=True, blank=True, editable=False)
    run_as = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+", help_text="The user the runs are started as (their requester).")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        indexes = [
            # The tick's one read: enabled schedules whose next slot has come.
            models.Index(fields=["next_slot"], condition=models.Q(enabled=True), name="nexo_schedule_due"),
        ]

    def __str__(self) -> str:
        return self.name


class ScheduleSlot(models.Model):
    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="slots", db_index=False)
    slot = models.DateTimeField()
    outcome = models.CharField(max_length=10, choices=SlotOutcome.choices)
    reason = models.TextField(blank=True, default="")
    run = models.ForeignKey("nexo_django.AgentRun", null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="+", db_index=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-slot"]
        constraints = [models.UniqueConstraint(fields=["schedule", "slot"], name="nexo_schedule_slot_once")]

    def __str__(self) -> str:
        return f"{self.schedule_id} at {self.slot.isoformat()} ({self.outcome})"
