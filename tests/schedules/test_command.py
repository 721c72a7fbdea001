"""``manage.py nexo_schedules list`` and ``tick`` (scripted agents, the inline queue)."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from nexo_django.models import AgentRun
from nexo_django.schedule_models import Schedule
from tests.schedules.helpers import make

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("nexo_schedules", *args, stdout=out)
    return out.getvalue()


def test_list_says_when_there_are_none_then_lists_them() -> None:
    assert "no schedules" in run("list")
    make(now=timezone.now())
    listed = run("list")
    assert "nightly\ttests.schedule_agents.Nightly\t0 7 * * * UTC\tenabled" in listed and "last none" in listed


def test_tick_fires_what_is_due_once() -> None:
    schedule = make(now=timezone.now() - timedelta(days=1), cron="* * * * *")
    Schedule.objects.filter(pk=schedule.pk).update(next_slot=timezone.now() - timedelta(seconds=30))
    out = run("tick")
    assert "nightly: started" in out and "tick: started=1" in out
    assert run("tick").strip() == "tick: nothing due"
    assert AgentRun.objects.count() == 1
    assert "started" in run("list")


def test_an_unknown_action_is_refused_with_the_choices() -> None:
    with pytest.raises(CommandError, match="invalid choice: 'fire'"):
        run("fire")
