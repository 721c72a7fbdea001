"""The schedules' admin: the form refuses what cannot run, with the reason, and stores nothing;
a schedule's page lists the runs it started and the slots it skipped; a scheduled run that waits
for a person is in the inbox with its schedule named (scripted agents)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from nexo_django.durable import schedules
from nexo_django.models import AgentRun
from nexo_django.schedule_models import Schedule
from tests.admin.support import (
    SCRIPT,
    approver,
    client_for,
    csrf_post,
    decision_url,
    make_user,
    run_url,
)
from tests.schedules.helpers import SLOT_OF, make

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

ADD = "/admin/nexo_django/schedule/add/"
GOOD = {"name": "weekly", "target": "tests.schedule_agents.Nightly", "prompt": "Report.", "payload": "",
        "permissions": "", "sandbox": "", "cwd": "", "cron": "0 7 * * 1", "interval": "", "timezone": "Europe/Berlin",
        "enabled": "on", "overlap": "skip", "missed": "latest", "max_failures": "3"}


def editor() -> Any:
    return make_user("ed", "nexo_django.add_schedule", "nexo_django.change_schedule", "nexo_django.view_schedule")


def test_a_valid_schedule_is_stored_armed_and_run_as_its_author() -> None:
    user = editor()
    response = csrf_post(client_for(user), ADD, GOOD)
    assert response.status_code == 302, response.content.decode()[:2000]
    schedule = Schedule.objects.get()
    assert schedule.kind == "agent" and schedule.run_as == user
    assert schedule.next_slot is not None and schedule.next_slot > timezone.now()
    assert schedule.next_slot.astimezone(schedules.calendar(schedule).tz).strftime("%a %H:%M") == "Mon 07:00"


@pytest.mark.parametrize(("change", "reason"), [
    ({"cron": "61 * * * *"}, "is not valid"),
    ({"cron": "0 0 30 2 *"}, "never falls on a date"),
    ({"cron": "* * * *"}, "has 4 field(s)"),
    ({"timezone": "Mars/Olympus"}, "is not a known IANA name"),
    ({"timezone": "../../../etc/passwd"}, "is not a known IANA name"),
    ({"target": "tests.schedule_agents.Missing"}, "does not import"),
    ({"target": "os.system"}, "is in the standard library"),
    ({"target": "tests.schedule_agents.NOT_A_CLASS"}, "is not an Agent or a Workflow subclass"),
    ({"target": "nothing"}, "give a dotted path"),
    ({"cron": "", "interval": ""}, "not both or neither"),
    ({"interval": "3600"}, "not both or neither"),
    ({"cron": "", "interval": "1"}, "from 60 to a year"),
    ({"permissions": "god"}, "give one of read_only"),
    ({"target": "tests.schedule_agents.Tally"}, "a workflow takes a payload"),
])
def test_the_form_refuses_what_cannot_run_with_the_reason(change: dict[str, str], reason: str) -> None:
    response = csrf_post(client_for(editor()), ADD, {**GOOD, **change})
    assert response.status_code == 200
    html = response.content.decode()
    assert "errorlist" in html
    assert reason.replace("'", "&#x27;") in html or reason in html, html[html.find("errorlist") - 200:][:1500]
    assert not Schedule.objects.exists()


def test_a_hostile_name_and_prompt_are_shown_escaped() -> None:
    response = csrf_post(client_for(editor()), ADD, {**GOOD, "name": SCRIPT, "prompt": SCRIPT})
    assert response.status_code == 302
    schedule = Schedule.objects.get()
    html = client_for(approver_editor()).get(f"/admin/nexo_django/schedule/{schedule.pk}/change/").content.decode()
    assert SCRIPT not in html and "&lt;script&gt;" in html


def approver_editor() -> Any:
    return make_user("eve", "nexo_django.change_schedule", "nexo_django.view_schedule")


def test_a_user_without_the_permission_cannot_add_one() -> None:
    response = csrf_post(client_for(make_user("viewer")), ADD, GOOD)
    assert response.status_code == 403
    assert not Schedule.objects.exists()


def test_the_page_lists_the_runs_started_and_the_slots_skipped_with_why() -> None:
    make(target="tests.schedule_agents.Asks", cron="0 * * * *")
    start = SLOT_OF
    schedules.tick(start + timedelta(seconds=1))
    schedules.tick(start + timedelta(hours=1, seconds=1))  # overlap: skipped
    run = AgentRun.objects.get()
    schedule = Schedule.objects.get()
    html = client_for(approver_editor()).get(f"/admin/nexo_django/schedule/{schedule.pk}/change/").content.decode()
    assert 'id="schedule-slots"' in html
    assert str(run.pk)[:8] in html and "(suspended)" in html
    assert f"overlap: the previous run {run.pk} is still suspended" in html


def test_a_scheduled_run_waiting_for_a_person_is_in_the_inbox_with_its_schedule_named(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.urls_runs"  # the admin and the run pages
    make(target="tests.schedule_agents.Asks", name="weekly report")
    schedules.tick(SLOT_OF + timedelta(seconds=1))
    run = AgentRun.objects.get()
    [call] = run.pending_calls()
    person = approver()
    inbox = client_for(person).get("/admin/nexo_django/pendingapproval/").content.decode()
    assert str(run.pk)[:8] in inbox and 'class="nexo-schedule">on schedule weekly report' in inbox
    page = client_for(person).get(decision_url(call)).content.decode()
    assert 'id="scheduled-by"' in page and "weekly report" in page
    assert 'id="scheduled-by"' in client_for(person).get(run_url(run)).content.decode()
    from django.contrib.auth import get_user_model

    boss = get_user_model().objects.create_superuser("boss")
    page = client_for(boss).get(f"/runs/{run.pk}/").content.decode()
    assert '<span id="run-schedule">on schedule weekly report</span>' in page


def test_editing_a_schedule_does_not_move_back_a_slot_a_tick_fired_meanwhile() -> None:
    user = editor()
    client = client_for(user)
    assert csrf_post(client, ADD, {**GOOD, "cron": "0 * * * *", "timezone": "UTC"}).status_code == 302
    schedule = Schedule.objects.get()
    page = f"/admin/nexo_django/schedule/{schedule.pk}/change/"
    client.get(page)  # the form is read
    fired_at = schedule.next_slot
    assert fired_at is not None
    schedules.tick(fired_at + timedelta(seconds=1))  # meanwhile a tick fires the slot
    moved = Schedule.objects.get().next_slot
    assert moved == fired_at + timedelta(hours=1)
    assert csrf_post(client, page, {**GOOD, "cron": "0 * * * *", "timezone": "UTC", "prompt": "Edited."}).status_code == 302
    after = Schedule.objects.get()
    assert after.prompt == "Edited." and after.next_slot == moved


def test_a_standing_rule_decides_a_scheduled_runs_call_as_any_other() -> None:
    from nexo_django.models import ApprovalRule, Decision

    rule = ApprovalRule.objects.create(agent="tests.schedule_agents.Asks", tool="write", path="/report.txt",
                                       note="weekly reports are fine")
    make(target="tests.schedule_agents.Asks")
    schedules.tick(SLOT_OF + timedelta(seconds=1))
    run = AgentRun.objects.get()
    assert run.status == "done", run.error
    decision = Decision.objects.get()
    assert (decision.source, decision.rule) == ("rule", rule)


def test_the_pause_and_resume_actions() -> None:
    schedule = make(cron="0 * * * *")
    client = client_for(approver_editor())
    changelist = "/admin/nexo_django/schedule/"
    csrf_post(client, changelist, {"action": "pause_selected", "_selected_action": [schedule.pk]})
    schedule.refresh_from_db()
    assert not schedule.enabled and schedule.paused_reason == "paused by eve"
    assert schedules.tick(SLOT_OF + timedelta(seconds=1)).fired == []
    csrf_post(client, changelist, {"action": "resume_selected", "_selected_action": [schedule.pk]})
    schedule.refresh_from_db()
    assert schedule.enabled and schedule.paused_reason == "" and schedule.next_slot > timezone.now()
