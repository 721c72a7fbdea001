"""Attacks on the schedules: forged admin requests, hostile form input, races and clocks, the
command's bad arguments. Each checks that the world is untouched: no run, nothing written, a
clear error (scripted models, the inline queue)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from django.core.management import CommandError, call_command
from django.db import close_old_connections
from django.test import Client

from nexo_django.core.errors import ConfigurationError
from nexo_django.durable import runs, schedules
from nexo_django.models import AgentRun
from nexo_django.schedule_models import Schedule, ScheduleSlot
from tests.admin.support import client_for, csrf_post, make_user
from tests.schedules.helpers import SLOT_OF, make
from tests.schedules.test_admin_schedules import ADD, GOOD

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

CHANGELIST = "/admin/nexo_django/schedule/"


def page(schedule: Schedule) -> str:
    return f"{CHANGELIST}{schedule.pk}/change/"


def untouched(before: Schedule) -> None:
    after = Schedule.objects.get(pk=before.pk)
    for name in ("prompt", "target", "cron", "enabled", "next_slot", "run_as_id", "paused_reason"):
        assert getattr(after, name) == getattr(before, name), name
    assert not AgentRun.objects.exists()


# --- the wrong person, forged requests ---------------------------------------------------------


def test_a_viewer_cannot_edit_pause_or_resume_by_forged_posts() -> None:
    schedule = make(cron="0 * * * *")
    client = client_for(make_user("vic", "nexo_django.view_schedule"))
    assert csrf_post(client, page(schedule), {**GOOD, "prompt": "rm -rf /"}).status_code == 403
    for action in ("pause_selected", "resume_selected", "delete_selected"):
        csrf_post(client, CHANGELIST, {"action": action, "_selected_action": [schedule.pk], "post": "yes"})
    untouched(schedule)


def test_staff_without_any_schedule_permission_is_refused() -> None:
    schedule = make(cron="0 * * * *")
    client = client_for(make_user("nobody"))
    assert csrf_post(client, page(schedule), {**GOOD, "prompt": "x"}).status_code == 403
    assert csrf_post(client, ADD, GOOD).status_code == 403
    assert csrf_post(client, CHANGELIST, {"action": "pause_selected", "_selected_action": [schedule.pk]}
                     ).status_code == 403
    untouched(schedule)
    assert Schedule.objects.count() == 1


def test_a_post_without_csrf_token_is_refused() -> None:
    schedule = make(cron="0 * * * *")
    editor = make_user("ed", "nexo_django.add_schedule", "nexo_django.change_schedule", "nexo_django.view_schedule")
    client = client_for(editor)
    assert client.post(ADD, GOOD).status_code == 403
    assert client.post(page(schedule), {**GOOD, "prompt": "x"}).status_code == 403
    assert client.post(CHANGELIST, {"action": "pause_selected", "_selected_action": [schedule.pk]}).status_code == 403
    untouched(schedule)
    assert Schedule.objects.count() == 1


def test_an_anonymous_post_is_sent_to_the_login_page() -> None:
    schedule = make(cron="0 * * * *")
    response = Client().post(page(schedule), {**GOOD, "prompt": "x"})
    assert response.status_code == 302 and "/login/" in response["Location"]
    untouched(schedule)


def test_the_editor_cannot_approve_the_calls_of_the_runs_the_schedule_starts(settings: Any) -> None:
    settings.NEXO = {**getattr(settings, "NEXO", {}), "SELF_APPROVAL": False}
    from nexo_django.conf import nexo_settings

    assert nexo_settings.SELF_APPROVAL is False
    author = make_user("ann", "nexo_django.add_schedule", "nexo_django.change_schedule", "nexo_django.view_schedule")
    editor = make_user("ed", "nexo_django.change_schedule", "nexo_django.view_schedule",
                       "nexo_django.decide_toolcall", "nexo_django.view_pendingapproval")
    assert csrf_post(client_for(author), ADD, {**GOOD, "target": "tests.schedule_agents.Asks", "cron": "0 * * * *",
                                                "timezone": "UTC"}).status_code == 302
    schedule = Schedule.objects.get()
    assert csrf_post(client_for(editor), page(schedule), {**GOOD, "target": "tests.schedule_agents.Asks",
                                                          "cron": "0 * * * *", "timezone": "UTC",
                                                          "prompt": "Edited."}).status_code == 302
    schedule.refresh_from_db()
    assert schedule.run_as == editor
    assert schedule.next_slot is not None
    schedules.tick(schedule.next_slot + timedelta(seconds=1))
    run = AgentRun.objects.get()
    assert run.created_by == editor and run.status == "suspended"
    [call] = run.pending_calls()
    with pytest.raises(PermissionDenied):
        runs.decide(call, approved=True, by=editor)
    response = csrf_post(client_for(editor), f"/admin/nexo_django/pendingapproval/{call.pk}/change/",
                         {"decision": "approve", "digest": call.digest if hasattr(call, "digest") else ""})
    assert response.status_code in (302, 403)
    call.refresh_from_db()
    assert call.status == "pending_approval"
    assert AgentRun.objects.get().status == "suspended"


def test_a_resume_by_another_person_makes_them_the_runs_starter(settings: Any) -> None:
    """Resuming starts runs as much as saving does: the person who resumes is who they run as,
    so with SELF_APPROVAL off they cannot approve what their resume started."""
    author = make_user("ann", "nexo_django.change_schedule", "nexo_django.view_schedule")
    schedule = make(cron="0 * * * *", enabled=False, run_as=author)
    resumer = make_user("rick", "nexo_django.change_schedule", "nexo_django.view_schedule")
    csrf_post(client_for(resumer), CHANGELIST, {"action": "resume_selected", "_selected_action": [schedule.pk]})
    schedule.refresh_from_db()
    assert schedule.enabled and schedule.run_as == resumer


# --- hostile input in the form -------------------------------------------------------------------


def _refusal(change: dict[str, Any], client: Client | None = None) -> Any:
    """The add form's answer to ``change``: the form again (200), nothing stored, nothing run."""
    client = client or client_for(make_user("ed", "nexo_django.add_schedule", "nexo_django.change_schedule",
                                            "nexo_django.view_schedule"))
    response = csrf_post(client, ADD, {**GOOD, **change})
    assert response.status_code == 200, response.status_code
    assert not Schedule.objects.exists() and not AgentRun.objects.exists()
    return response


def refused(change: dict[str, Any], client: Client | None = None) -> str:
    html = _refusal(change, client).content.decode()
    assert "errorlist" in html
    return html


def refused_fields(change: dict[str, Any]) -> set[str]:
    """The fields the form refused ``change`` under."""
    return set(_refusal(change).context["adminform"].form.errors)


@pytest.mark.parametrize("target", [
    "os.system", "builtins.eval", "subprocess.Popen", "tests..schedule_agents.Nightly", "tests.schedule_agents..Nightly",
    "../../etc.passwd", "tests.schedule_agents.NOT_A_CLASS", "a" * 5000 + ".B", "tests.schedule_agents.Nightly\x00",
    "tests.schedule_agents.Night ly", "nexo_django.Agent", "nexo_django.Workflow",
])
def test_class_paths_that_are_no_agent_class_are_refused(target: str) -> None:
    assert "target" in refused_fields({"target": target})


def test_a_class_path_into_the_standard_library_is_not_imported(tmp_path: Any) -> None:
    """Validating the form imports the module named: a module of the standard library with side
    effects at import (``antigravity`` opens a web browser, ``this`` prints) is refused unimported."""
    import sys

    client = client_for(make_user("ed", "nexo_django.add_schedule", "nexo_django.view_schedule"))
    for name in ("antigravity", "this", "turtle"):
        sys.modules.pop(name, None)
        html = refused({"target": f"{name}.Agent"}, client)
        assert name not in sys.modules, f"{name} was imported by the form"
        assert "standard library" in html


@pytest.mark.parametrize(("cron", "reason"), [
    ("*/1 * * * * *", "field(s)"), ("0 0 31 2 *", "never falls"), ("0 0 31 4,6,9,11 *", "never falls"),
    ("* " * 1000, "at most 200"), ("0 7 * * \x00", ""), ("@reboot", ""), ("H * * * *", ""),
    ("*/0 * * * *", ""), ("0-99999999999 * * * *", ""), ("0 0 * * 8", ""),
])
def test_hostile_cron_expressions_are_refused_quickly(cron: str, reason: str) -> None:
    started = time.monotonic()
    html = refused({"cron": cron})
    assert time.monotonic() - started < 5
    assert reason in html


@pytest.mark.parametrize("tz", ["../../etc/localtime", "/etc/localtime", "Europe/../../../etc/passwd", "x" * 65,
                                "UTC\x00", "", "zone.tab", "Europe/Berlin/"])
def test_hostile_timezones_are_refused(tz: str) -> None:
    assert "timezone" in refused_fields({"timezone": tz})


@pytest.mark.parametrize("interval", ["0", "-60", "59", "NaN", "inf", "1e9", str(2**63), "60.5", str(366 * 86400 + 1)])
def test_bad_intervals_are_refused(interval: str) -> None:
    # out of the field's range: under the field; in it but not a schedule's: the form's own error
    assert refused_fields({"cron": "", "interval": interval}) & {"interval", "__all__"}


@pytest.mark.parametrize("change", [
    {"prompt": "Triage\x00 now"}, {"name": "night\x00ly"}, {"cwd": "/tmp\x00/x"},
])
def test_nul_bytes_in_text_fields_are_refused(change: dict[str, str]) -> None:
    assert set(change) <= refused_fields(change)


def test_a_payload_with_nul_bytes_is_stored_and_run_as_sent() -> None:
    """PostgreSQL's jsonb refuses NUL: the payload goes through the codec runs use (a 500 before)."""
    client = client_for(make_user("ed", "nexo_django.add_schedule", "nexo_django.change_schedule",
                                  "nexo_django.view_schedule"))
    payload = '{"a": "nul\\u0000byte", "k\\u0000": [1]}'
    response = csrf_post(client, ADD, {**GOOD, "target": "tests.schedule_agents.Tally", "prompt": "",
                                       "cron": "0 * * * *", "timezone": "UTC", "payload": payload})
    assert response.status_code == 302, response.content.decode()[:3000]
    schedule = Schedule.objects.get()
    assert schedule.payload == {"a": "nul\x00byte", "k\x00": [1]}
    assert schedule.next_slot is not None
    [fired] = schedules.tick(schedule.next_slot + timedelta(seconds=1)).started
    run = AgentRun.objects.get(pk=fired.run)
    assert run.status == "done", run.error
    assert run.options["payload"] == {"a": "nul\x00byte", "k\x00": [1]}


@pytest.mark.parametrize("payload", [
    "[" * 100_000 + "]" * 100_000,
    "[" * 3_000 + "]" * 3_000,
])
def test_hostile_payloads_are_refused_with_a_form_error(payload: str) -> None:
    assert "payload" in refused_fields({"target": "tests.schedule_agents.Tally", "prompt": "", "payload": payload})


def test_a_huge_payload_is_refused_not_stored() -> None:
    assert "payload" in refused_fields({"target": "tests.schedule_agents.Tally", "prompt": "",
                                        "payload": '{"a": "' + "x" * 2_000_000 + '"}'})


# --- races, clocks, outages ------------------------------------------------------------------------


def test_two_ticks_at_once_for_one_slot_start_one_run() -> None:
    make(cron="0 * * * *")
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def race() -> None:
        try:
            barrier.wait()
            outcomes.extend(f.outcome for f in schedules.tick(SLOT_OF + timedelta(seconds=1)).fired)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=race) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert outcomes.count("started") == 1, outcomes
    assert AgentRun.objects.count() == 1 and ScheduleSlot.objects.count() == 1


def test_a_schedule_deleted_between_the_read_and_the_fire_starts_nothing() -> None:
    make(cron="0 * * * *")
    [schedule] = schedules.due(SLOT_OF + timedelta(seconds=1))
    Schedule.objects.all().delete()
    fired = schedules.fire(schedule, SLOT_OF + timedelta(seconds=1))
    assert fired.outcome == "taken"
    assert not AgentRun.objects.exists() and not ScheduleSlot.objects.exists()


def test_a_schedule_paused_between_the_read_and_the_fire_starts_nothing() -> None:
    make(cron="0 * * * *")
    [schedule] = schedules.due(SLOT_OF + timedelta(seconds=1))
    Schedule.objects.update(enabled=False)
    assert schedules.fire(schedule, SLOT_OF + timedelta(seconds=1)).outcome == "taken"
    assert not AgentRun.objects.exists() and not ScheduleSlot.objects.exists()


def test_a_schedule_edited_between_the_read_and_the_fire_keeps_its_new_slot() -> None:
    """An edit moved the next slot (a new cron) after the tick read the old one: the tick's
    compare-and-set fails, the edit stands."""
    make(cron="0 * * * *")
    [schedule] = schedules.due(SLOT_OF + timedelta(seconds=1))
    moved = SLOT_OF + timedelta(days=3)
    Schedule.objects.update(cron="0 0 * * *", next_slot=moved)
    assert schedules.fire(schedule, SLOT_OF + timedelta(seconds=1)).outcome == "taken"
    assert Schedule.objects.get().next_slot == moved and not AgentRun.objects.exists()


def test_the_clock_going_backwards_fires_no_slot_twice() -> None:
    make(cron="0 * * * *")
    assert len(schedules.tick(SLOT_OF + timedelta(hours=2, seconds=1)).started) == 1
    for back in (timedelta(hours=1), timedelta(days=30), timedelta(0)):
        assert schedules.tick(SLOT_OF + timedelta(hours=2, seconds=1) - back).started == []
    assert AgentRun.objects.count() == 1


def test_a_fired_slot_then_a_timezone_change_that_lands_on_it_again_starts_nothing() -> None:
    schedule = make(cron="0 7 * * *", timezone="UTC")
    assert len(schedules.tick(SLOT_OF + timedelta(seconds=1)).started) == 1
    # Edited (behind the form) back to the slot already fired: the slot's row refuses it.
    Schedule.objects.filter(pk=schedule.pk).update(timezone="Europe/London", next_slot=SLOT_OF)
    report = schedules.tick(SLOT_OF + timedelta(minutes=1))
    assert report.started == [] and report.fired[0].outcome == "taken"
    assert AgentRun.objects.count() == 1
    assert Schedule.objects.get().next_slot > SLOT_OF + timedelta(minutes=1)


@pytest.mark.parametrize(("fields", "outage"), [
    ({"cron": "* * * * *"}, timedelta(days=3 * 365)),
    ({"cron": "", "interval": 60}, timedelta(days=3 * 365)),
    ({"cron": "0 0 29 2 *"}, timedelta(days=40 * 365)),
])
def test_a_long_outage_is_bounded_work_and_one_run(fields: dict[str, Any], outage: timedelta) -> None:
    make(**fields)
    started = time.monotonic()
    report = schedules.tick(SLOT_OF + outage)
    assert time.monotonic() - started < 10
    assert len(report.started) == 1
    assert ScheduleSlot.objects.count() <= schedules.RECORDED + 1
    assert AgentRun.objects.count() == 1
    assert schedules.tick(SLOT_OF + outage + timedelta(seconds=1)).started == []


def test_overlap_skip_while_the_previous_run_is_suspended() -> None:
    make(target="tests.schedule_agents.Asks", cron="0 * * * *")
    assert len(schedules.tick(SLOT_OF + timedelta(seconds=1)).started) == 1
    for hour in (1, 2):
        [fired] = schedules.tick(SLOT_OF + timedelta(hours=hour, seconds=1)).fired
        assert fired.outcome == "skipped" and "suspended" in fired.reason
    assert AgentRun.objects.count() == 1


# --- the command ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [(), ("tick", "extra"), ("--now", "yesterday", "tick"), ("TICK",), ("\x00",)])
def test_the_command_refuses_bad_arguments(args: tuple[str, ...]) -> None:
    make(now=datetime.now(UTC) - timedelta(days=2), cron="* * * * *")
    Schedule.objects.update(next_slot=datetime.now(UTC) - timedelta(seconds=30))
    with pytest.raises(CommandError):
        call_command("nexo_schedules", *args)
    assert not AgentRun.objects.exists()


def test_prepare_refuses_a_target_beyond_the_field() -> None:
    with pytest.raises(ConfigurationError):
        schedules.target_class("tests." + "x" * 300 + ".Nightly")
