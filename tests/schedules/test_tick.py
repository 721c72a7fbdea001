"""Schedules fire through the clock's seam: one run per slot, missed slots by policy, overlap,
pauses (scripted models; the inline queue runs each run at commit)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from nexo_django.durable import schedules
from nexo_django.models import AgentRun, Notice
from nexo_django.schedule_models import Schedule, ScheduleSlot
from tests.schedules.helpers import T0, make

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SLOT = datetime(2026, 6, 1, 7, 0, tzinfo=UTC)


def test_nothing_fires_before_the_slot_and_one_run_fires_at_it() -> None:
    schedule = make()
    assert schedule.next_slot == SLOT
    assert schedules.tick(SLOT - timedelta(seconds=1)).fired == []
    report = schedules.tick(SLOT + timedelta(seconds=5))
    [fired] = report.started
    run = AgentRun.objects.get()
    assert str(run.pk) == fired.run and run.status == "done", run.error
    assert run.options["_schedule"] == {"schedule": schedule.pk, "name": "nightly", "slot": SLOT.isoformat()}
    [slot] = ScheduleSlot.objects.all()
    assert (slot.slot, slot.outcome, slot.run_id) == (SLOT, "started", run.pk)
    schedule.refresh_from_db()
    assert schedule.next_slot == SLOT + timedelta(days=1)
    # The same tick again, or a later one before the next slot: nothing more.
    assert schedules.tick(SLOT + timedelta(seconds=5)).fired == []
    assert schedules.tick(SLOT + timedelta(hours=23)).fired == []
    assert AgentRun.objects.count() == 1


def test_an_idle_tick_is_one_statement() -> None:
    for n in range(20):
        make(name=f"s{n}")
    with CaptureQueriesContext(connection) as ctx:
        assert schedules.tick(T0).fired == []
    assert len(ctx.captured_queries) == 1


def test_missed_slots_run_the_latest_once_and_are_recorded() -> None:
    make()
    later = SLOT + timedelta(days=3, minutes=1)  # everything was down for three nights
    [fired] = schedules.tick(later).fired
    assert fired.outcome == "started" and fired.slot == SLOT + timedelta(days=3)
    rows = list(ScheduleSlot.objects.order_by("slot").values_list("slot", "outcome", "reason"))
    assert [r[:2] for r in rows] == [(SLOT, "skipped"), (SLOT + timedelta(days=1), "skipped"),
                                     (SLOT + timedelta(days=2), "skipped"), (SLOT + timedelta(days=3), "started")]
    assert all(r[2].startswith("missed:") for r in rows[:3])
    assert AgentRun.objects.count() == 1


def test_missed_slots_are_skipped_when_the_policy_says_so() -> None:
    make(missed="skip")
    [fired] = schedules.tick(SLOT + timedelta(hours=2)).fired
    assert fired.outcome == "skipped" and "skips missed slots" in fired.reason
    assert not AgentRun.objects.exists()
    [row] = ScheduleSlot.objects.all()
    assert row.outcome == "skipped" and row.reason.startswith("missed: seen 2 h late")
    # On time the next day: it runs.
    assert schedules.tick(SLOT + timedelta(days=1, seconds=10)).started


def test_a_long_outage_records_a_bounded_number_of_rows() -> None:
    make(cron="* * * * *")
    [fired] = schedules.tick(SLOT + timedelta(days=3)).fired
    assert fired.outcome == "started"
    assert ScheduleSlot.objects.count() == schedules.RECORDED + 1
    first = ScheduleSlot.objects.order_by("slot").first()
    assert first is not None and "or more earlier missed slots are not listed" in first.reason


def test_overlap_skip_waits_while_the_previous_run_waits_for_a_person() -> None:
    make(target="tests.schedule_agents.Asks", cron="0 * * * *")
    assert schedules.tick(SLOT + timedelta(seconds=1)).started
    run = AgentRun.objects.get()
    assert run.status == "suspended"
    [fired] = schedules.tick(SLOT + timedelta(hours=1, seconds=1)).fired
    assert fired.outcome == "skipped" and fired.reason == f"overlap: the previous run {run.pk} is still suspended"
    assert AgentRun.objects.count() == 1
    run.cancel()
    assert schedules.tick(SLOT + timedelta(hours=2, seconds=1)).started


def test_overlap_run_starts_anyway() -> None:
    make(target="tests.schedule_agents.Asks", cron="0 * * * *", overlap="run")
    schedules.tick(SLOT + timedelta(seconds=1))
    schedules.tick(SLOT + timedelta(hours=1, seconds=1))
    assert list(AgentRun.objects.values_list("status", flat=True)) == ["suspended", "suspended"]


def test_a_workflow_schedule_starts_the_workflow_with_its_payload() -> None:
    make(target="tests.schedule_agents.Tally", prompt="", payload={"items": 3})
    assert schedules.tick(SLOT).started
    run = AgentRun.objects.get()
    assert (run.kind, run.status) == ("workflow", "done"), run.error
    assert run.options["_schedule"]["name"] == "nightly"


def test_a_schedule_created_without_the_form_is_armed_by_the_first_tick() -> None:
    Schedule.objects.create(name="raw", target="tests.schedule_agents.Nightly", prompt="x", cron="0 7 * * *")
    [fired] = schedules.tick(T0).fired
    assert fired.outcome == "armed"
    assert Schedule.objects.get().next_slot == SLOT
    assert schedules.tick(SLOT).started


@pytest.mark.parametrize(("fields", "words"), [
    ({"cron": "61 * * * *"}, "is not valid"),
    ({"timezone": "Mars/Olympus"}, "is not a known IANA name"),
    ({"target": "tests.schedule_agents.Gone"}, "does not import"),
    ({"target": "tests.schedule_agents.NOT_A_CLASS"}, "is not an Agent or a Workflow subclass"),
    ({"permissions": "root"}, "give one of"),
])
def test_a_schedule_stored_with_bad_input_is_paused_with_the_reason(fields: dict[str, str], words: str) -> None:
    Schedule.objects.create(**{"name": "raw", "target": "tests.schedule_agents.Nightly", "cron": "0 7 * * *",
                               **fields})
    [fired] = schedules.tick(T0).fired
    assert fired.outcome == "paused"
    schedule = Schedule.objects.get()
    assert not schedule.enabled and words in schedule.paused_reason
    assert schedules.tick(T0 + timedelta(days=2)).fired == []  # paused: no crash loop
    assert not AgentRun.objects.exists()


def test_a_class_that_stops_importing_pauses_the_schedule_with_the_error() -> None:
    schedule = make()
    Schedule.objects.filter(pk=schedule.pk).update(target="tests.schedule_agents.Renamed")
    [fired] = schedules.tick(SLOT).fired
    assert fired.outcome == "paused"
    schedule.refresh_from_db()
    assert not schedule.enabled and schedule.paused_at == SLOT
    assert "class 'tests.schedule_agents.Renamed' does not import" in schedule.paused_reason
    [row] = ScheduleSlot.objects.all()
    assert row.outcome == "skipped" and "does not import" in row.reason
    for day in range(1, 4):  # every later tick: nothing, no error
        assert schedules.tick(SLOT + timedelta(days=day)).fired == []
    assert not AgentRun.objects.exists()


def test_failures_in_a_row_pause_the_schedule_and_write_a_notice(settings: object) -> None:
    settings.NEXO = {**settings.NEXO, "CHANNELS": {"ops": {  # type: ignore[attr-defined]
        "BACKEND": "webhook", "URL": "http://127.0.0.1:9/", "SECRET": "s", "EVENTS": ["schedule.paused"]}}}
    make(target="tests.schedule_agents.Breaks", cron="0 * * * *", max_failures=2)
    for hour in range(2):
        assert schedules.tick(SLOT + timedelta(hours=hour, seconds=1)).started
    assert list(AgentRun.objects.values_list("status", flat=True)) == ["failed", "failed"]
    [fired] = schedules.tick(SLOT + timedelta(hours=2, seconds=1)).fired
    assert fired.outcome == "paused"
    schedule = Schedule.objects.get()
    assert not schedule.enabled and schedule.consecutive_failures == 2
    assert schedule.paused_reason.startswith("2 runs in a row failed")
    [notice] = Notice.objects.filter(kind="schedule.paused")
    assert notice.payload["name"] == "nightly" and notice.run_id is not None
    assert AgentRun.objects.count() == 2
    # Resumed: the failures before the pause no longer count.
    schedules.resume(schedule, SLOT + timedelta(hours=5))
    assert schedules.tick(SLOT + timedelta(hours=6, seconds=1)).started


def test_a_success_resets_the_failures_in_a_row() -> None:
    schedule = make(cron="0 * * * *", max_failures=2, target="tests.schedule_agents.Breaks")
    schedules.tick(SLOT + timedelta(seconds=1))
    Schedule.objects.filter(pk=schedule.pk).update(target="tests.schedule_agents.Nightly")
    schedules.tick(SLOT + timedelta(hours=1, seconds=1))
    Schedule.objects.filter(pk=schedule.pk).update(target="tests.schedule_agents.Breaks")
    schedules.tick(SLOT + timedelta(hours=2, seconds=1))
    assert schedules.tick(SLOT + timedelta(hours=3, seconds=1)).started  # failed, done, failed: 1 in a row
    assert Schedule.objects.get().enabled


def test_a_stale_scheduler_writes_nothing_and_never_moves_the_slot_back() -> None:
    """The compare-and-set: a scheduler that read the schedule before another fired it fires
    nothing, builds no run and leaves the next slot where the winner put it. Without it the late
    scheduler would move ``next_slot`` back and try to insert the run."""
    schedule = make(cron="0 * * * *")
    stale = Schedule.objects.get(pk=schedule.pk)
    assert schedules.tick(SLOT + timedelta(seconds=1)).started
    assert schedules.tick(SLOT + timedelta(hours=1, seconds=1)).started
    with CaptureQueriesContext(connection) as ctx:
        fired = schedules.fire(stale, SLOT + timedelta(seconds=2))
    assert fired.outcome == "taken"
    assert not any("INSERT" in q["sql"].upper() for q in ctx.captured_queries), ctx.captured_queries
    assert Schedule.objects.get().next_slot == SLOT + timedelta(hours=2)
    assert AgentRun.objects.count() == 2


def test_a_run_that_cannot_be_built_pauses_its_schedule_and_the_others_still_fire() -> None:
    make(name="a-broken", target="tests.schedule_agents.Unbuildable")
    make(name="b-fine")
    fired = {f.schedule: f for f in schedules.tick(SLOT).fired}
    assert fired["a-broken"].outcome == "paused"
    assert "RuntimeError: the agent's own setup failed" in Schedule.objects.get(name="a-broken").paused_reason
    assert fired["b-fine"].outcome == "started"
    assert AgentRun.objects.count() == 1
    assert [f.schedule for f in schedules.tick(SLOT + timedelta(days=1)).fired] == ["b-fine"]
