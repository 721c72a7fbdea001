"""The example's one schedule: the Reviewer reads the published notes at 08:00 on weekdays
(Europe/Berlin). A data migration, so `migrate` gives every copy of the project the schedule; edit
or pause it in the admin (Nexo django > Schedules)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import migrations

NAME = "morning review"


def add_schedule(apps: Any, schema_editor: Any) -> None:
    schedule = apps.get_model("nexo_django", "Schedule")
    schedule.objects.get_or_create(name=NAME, defaults={
        "target": "example_project.notes.agents.Reviewer",
        "prompt": "Review published/notes.md: is it ready for the team?",
        "sandbox": "local", "cwd": str(settings.NOTES_WORKSPACE),
        "cron": "0 8 * * 1-5", "timezone": "Europe/Berlin",
    })  # armed (its first slot set) by the first tick that sees it


def remove_schedule(apps: Any, schema_editor: Any) -> None:
    apps.get_model("nexo_django", "Schedule").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [("nexo_django", "0018_schedules")]
    operations = [migrations.RunPython(add_schedule, remove_schedule)]
