"""The example project's schedule (its data migration): the Reviewer at 08:00 on weekdays in
Berlin, armed by the first tick, run at its slot in the example's workspace (scripted agent,
inline queue)."""

from __future__ import annotations

import importlib
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.apps import apps

from nexo_django.durable import schedules
from nexo_django.models import AgentRun
from nexo_django.schedule_models import Schedule

pytestmark = pytest.mark.django_db(transaction=True)

MIGRATION = importlib.import_module("example_project.notes.migrations.0001_morning_review")


def test_the_migration_adds_the_morning_review_which_runs_at_eight_in_berlin(example: Path) -> None:
    (example / "published").mkdir(parents=True)
    (example / "published" / "notes.md").write_text("Notes.\n")
    MIGRATION.add_schedule(apps, None)
    MIGRATION.add_schedule(apps, None)  # migrating again adds no second one
    schedule = Schedule.objects.get()
    assert (schedule.name, schedule.cwd) == ("morning review", str(example))
    schedules.tick(datetime(2026, 6, 1, 5, 0, tzinfo=UTC))  # Monday 07:00 in Berlin: armed
    schedule.refresh_from_db()
    assert schedule.next_slot == datetime(2026, 6, 1, 6, 0, tzinfo=UTC)
    [fired] = schedules.tick(datetime(2026, 6, 1, 6, 0, 5, tzinfo=UTC)).started
    run = AgentRun.objects.get(pk=fired.run)
    assert run.status == "done", run.error
    assert run.result == "(scripted model) published/notes.md is short, clear and ready."
    MIGRATION.remove_schedule(apps, None)
    assert not Schedule.objects.exists()
