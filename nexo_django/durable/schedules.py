"""Schedules fire: :func:`tick` finds the schedules whose next slot has come and :func:`fire`s each.

Exactly one run per slot, whatever the number of schedulers: a slot is taken by a compare-and-set
of the schedule's ``next_slot`` (the one read), in the same transaction as its ``ScheduleSlot`` row
(unique per schedule and slot time) and the run it starts (``run_later``'s rows; the job is sent
at commit). A scheduler that loses the compare-and-set does nothing more; one killed before its
commit leaves nothing, and the next tick fires the slot; one killed after it left a queued run
that its job, or the reconciler, takes up. The tick is driven by rq (``manage.py rqcron
nexo_django.durable.schedule_cron``: rq's cron enqueues :func:`nexo_django.durable.jobs.tick_schedules`),
or by ``manage.py nexo_schedules tick`` from any scheduler; the clock is a parameter (``now``).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.module_loading import import_string

from ..core.errors import ConfigurationError
from ..core.permissions import MODES
from ..models import AgentRun, RunStatus
from ..schedule_models import Missed, Overlap, Schedule, ScheduleSlot, SlotOutcome
from . import outbox, runs, workflow_runs
from .agent import Agent
from .journal import crash_point
from .slots import WALK, Calendar
from .workflow import Workflow

log = logging.getLogger("nexo_django.schedules")

#: a slot seen later than this after its time is a missed slot (``Schedule.missed`` decides)
MISSED_AFTER = timedelta(minutes=5)
#: schedules a tick fires at most (the rest are due at the next tick)
BATCH = 200
#: missed slots recorded one by one at most; the last row counts the rest
RECORDED = 20
ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SUSPENDED, RunStatus.NEEDS_ATTENTION)
FINISHED = (RunStatus.DONE, RunStatus.FAILED)


# --- what a schedule names --------------------------------------------------------------------


def target_class(path: str) -> tuple[type, str]:
    """The class ``path`` names and its kind (``"agent"`` or ``"workflow"``); ``ConfigurationError``
    with the reason when it does not import or is neither."""
    if (not isinstance(path, str) or "." not in path or len(path) > 255
            or not all(part.isidentifier() for part in path.split("."))):
        raise ConfigurationError(f"class path {path[:300]!r}: give a dotted path such as 'myapp.agents.Triage'")
    if path.split(".", 1)[0] in sys.stdlib_module_names:
        # Checking a path imports its module: never one of the standard library's, some of which
        # act when imported (``antigravity`` opens a web browser).
        raise ConfigurationError(f"class path {path!r} is in the standard library; name an Agent or a Workflow "
                                 "class of your project")
    try:
        cls = import_string(path)
    except Exception as exc:  # ImportError, or whatever the module raised while importing
        raise ConfigurationError(f"class {path!r} does not import: {type(exc).__name__}: {exc}") from exc
    if cls in (Agent, Workflow):
        raise ConfigurationError(f"{path!r} is the base class; name your subclass of it")
    if isinstance(cls, type) and issubclass(cls, Agent):
        return cls, "agent"
    if isinstance(cls, type) and issubclass(cls, Workflow):
        return cls, "workflow"
    raise ConfigurationError(f"{path!r} is not an Agent or a Workflow subclass; name the class to run")


def calendar(schedule: Schedule) -> Calendar:
    return Calendar.of(schedule.cron, schedule.interval, schedule.timezone)


def run_options(schedule: Schedule, kind: str) -> dict[str, Any]:
    """The options each run of ``schedule`` takes (checked: a bad one is refused, never stored)."""
    options: dict[str, Any] = {}
    if schedule.permissions:
        if kind != "agent" or schedule.permissions not in MODES:
            raise ConfigurationError(f"permissions {schedule.permissions!r}: give one of {', '.join(MODES)} "
                                     "(an agent's only), or leave it blank")
        options["permissions"] = schedule.permissions
    if schedule.sandbox:
        if kind != "agent" or schedule.sandbox not in ("virtual", "local"):
            raise ConfigurationError(f"sandbox {schedule.sandbox!r}: give 'virtual' or 'local' (an agent's only; "
                                     "a workflow declares its own), or leave it blank")
        options["sandbox"] = schedule.sandbox
    if schedule.cwd:
        options["cwd"] = schedule.cwd
    return options


def prepare(schedule: Schedule, now: datetime | None = None) -> None:
    """Check ``schedule`` and set its kind and next slot (from ``now``): what the admin's form and
    ``save`` do before storing it. ``ConfigurationError`` with the reason; nothing is changed then."""
    cal = calendar(schedule)
    _, kind = target_class(schedule.target)
    run_options(schedule, kind)
    if kind == "workflow" and schedule.prompt:
        raise ConfigurationError("a workflow takes a payload (JSON), not a prompt: move the text into the payload")
    schedule.kind = kind
    if schedule.enabled:
        schedule.next_slot = cal.following(now or timezone.now())


# --- firing -------------------------------------------------------------------------------------


@dataclass
class Fired:
    schedule: str
    slot: datetime | None
    #: "started", "skipped", "paused", "armed" (its first slot set), or "taken" (another
    #: scheduler had it: nothing written)
    outcome: str
    run: str | None = None
    reason: str = ""


@dataclass
class TickReport:
    fired: list[Fired] = field(default_factory=list)

    @property
    def started(self) -> list[Fired]:
        return [f for f in self.fired if f.outcome == "started"]

    def __str__(self) -> str:
        counts: dict[str, int] = {}
        for f in self.fired:
            counts[f.outcome] = counts.get(f.outcome, 0) + 1
        return " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "nothing due"


def due(now: datetime, limit: int = BATCH) -> list[Schedule]:
    """The enabled schedules whose next slot has come, oldest slot first (one indexed read)."""
    # A schedule stored without the form (``Schedule.objects.create``) has no next slot yet: it is
    # checked and armed by the first tick that sees it.
    return list(Schedule.objects.filter(Q(next_slot__lte=now) | Q(next_slot__isnull=True), enabled=True)
                .select_related("run_as").order_by("next_slot", "pk")[:limit])


def tick(now: datetime | None = None, *, limit: int = BATCH) -> TickReport:
    """Fire every schedule whose next slot has come at ``now`` (the clock, by default the
    current time). Safe on several schedulers at once."""
    now = now or timezone.now()
    report = TickReport()
    for schedule in due(now, limit):
        try:
            report.fired.append(fire(schedule, now))
        except Exception as exc:  # one schedule's trouble never keeps the others from their slots
            log.exception("schedules: %s not fired", schedule.name)
            report.fired.append(Fired(schedule.name, schedule.next_slot, "taken", reason=f"{type(exc).__name__}: {exc}"))
    if report.fired:
        log.info("schedules: %s", report)
    return report


def fire(schedule: Schedule, now: datetime) -> Fired:
    """Fire the slot(s) of ``schedule`` due at ``now``, as read (its ``next_slot``): the latest due
    slot starts a run (or is skipped, with why), the earlier ones are recorded as missed."""
    read = schedule.next_slot
    if read is None:
        return _arm(schedule, now)
    try:
        cal = calendar(schedule)
    except ConfigurationError as exc:  # edited behind the form's back
        return _pause(schedule, read, now, str(exc))
    slots, count, following = cal.due(read, now)
    if not slots:
        return Fired(schedule.name, None, "taken", reason="not due")
    latest, missed = slots[-1], slots[:-1]
    try:
        with transaction.atomic():
            if not Schedule.objects.filter(pk=schedule.pk, enabled=True, next_slot=read).update(
                    next_slot=following, updated_at=now):
                return Fired(schedule.name, latest, "taken", reason="another scheduler fired it")
            rows = _missed_rows(schedule, missed, count)
            fired = _decide(schedule, latest, now, late=now - latest > MISSED_AFTER)
            rows.append(ScheduleSlot(schedule=schedule, slot=latest, outcome=SlotOutcome.SKIPPED
                                     if fired.outcome != "started" else SlotOutcome.STARTED,
                                     reason=fired.reason, run_id=fired.run))
            ScheduleSlot.objects.bulk_create(rows)
            crash_point("schedule_before_commit")  # tests kill a scheduler here: nothing of the slot is left
        crash_point("schedule_after_commit")  # or here: the run is stored, its job not sent (the reconciler sends it)
    except IntegrityError:
        # The slot's row exists: it was fired (a schedule edited back to an earlier slot). Move
        # on past it, so the next tick does not meet it again.
        Schedule.objects.filter(pk=schedule.pk, next_slot=read).update(next_slot=following, updated_at=now)
        return Fired(schedule.name, latest, "taken", reason="this slot was fired already")
    except DatabaseError as exc:
        log.warning("schedules: %s at %s not fired (%s: %s); the next tick tries again",
                    schedule.name, latest.isoformat(), type(exc).__name__, exc)
        return Fired(schedule.name, latest, "taken", reason=f"{type(exc).__name__}: {exc}")
    return fired


def _arm(schedule: Schedule, now: datetime) -> Fired:
    """Check a schedule stored without the form and give it its first slot after ``now`` (or pause
    it, with the reason, when it cannot run)."""
    try:
        prepare(schedule, now)
    except ConfigurationError as exc:
        return _pause(schedule, None, now, str(exc))
    if not Schedule.objects.filter(pk=schedule.pk, enabled=True, next_slot__isnull=True).update(
            next_slot=schedule.next_slot, kind=schedule.kind, updated_at=now):
        return Fired(schedule.name, None, "taken", reason="another scheduler armed it")
    return Fired(schedule.name, schedule.next_slot, "armed", reason="first slot set")


def _missed_rows(schedule: Schedule, missed: list[datetime], count: int) -> list[ScheduleSlot]:
    shown = missed[-RECORDED:]
    rows = [ScheduleSlot(schedule=schedule, slot=slot, outcome=SlotOutcome.SKIPPED,
                         reason="missed: nothing ticked at its time; a later slot ran instead") for slot in shown]
    left = count - 1 - len(shown)
    if rows and left > 0:
        more = f"{left}" if count <= WALK else f"{WALK} or more"
        rows[0].reason += f" ({more} earlier missed slots are not listed)"
    return rows


def _decide(schedule: Schedule, slot: datetime, now: datetime, *, late: bool) -> Fired:
    """Inside the slot's transaction: start its run, or say why not (and pause when it must)."""
    if late and schedule.missed == Missed.SKIP:
        return Fired(schedule.name, slot, "skipped", reason=f"missed: seen {_ago(now - slot)} late, and the "
                     "schedule skips missed slots")
    history = _recent(schedule)
    failures = _failures(schedule, history)
    if schedule.max_failures and failures >= schedule.max_failures:
        last = next((run_id for run_id, status, _ in history if status == RunStatus.FAILED), None)
        error = AgentRun.objects.filter(pk=last).values_list("error", flat=True).first() if last else ""
        reason = f"{failures} runs in a row failed (the last: run {last}: {(error or '')[:300]})"
        return _pause_here(schedule, slot, now, reason, last, failures)
    if failures != schedule.consecutive_failures:
        Schedule.objects.filter(pk=schedule.pk).update(consecutive_failures=failures)
    if schedule.overlap == Overlap.SKIP and history and history[0][1] in ACTIVE:
        run_id, status, _ = history[0]
        return Fired(schedule.name, slot, "skipped", reason=f"overlap: the previous run {run_id} is still {status}")
    try:
        cls, kind = target_class(schedule.target)
        options = run_options(schedule, kind)
        origin = {"schedule": schedule.pk, "name": schedule.name, "slot": slot.isoformat()}
        with transaction.atomic():  # a start refused (bad options) leaves nothing of itself
            if kind == "agent":
                run = runs.start_run(cls, schedule.prompt, user=schedule.run_as, later=True, origin=origin, **options)
                run_id = str(run.pk)
            else:
                started = workflow_runs.start_workflow(cls, schedule.payload, user=schedule.run_as, later=True,
                                                       origin=origin, **options)
                run_id = str(started.pk)
    except DatabaseError:
        raise  # the database's trouble, not the schedule's: the slot is tried again at the next tick
    except Exception as exc:  # whatever building the run raised: paused with it, never a crash loop
        return _pause_here(schedule, slot, now, f"the run could not start: {type(exc).__name__}: {exc}", None,
                           failures)
    return Fired(schedule.name, slot, "started", run=run_id)


def _recent(schedule: Schedule) -> list[tuple[str, str, datetime]]:
    """The runs the schedule started lately, newest first: (run id, status, slot)."""
    limit = min(max(schedule.max_failures, 1), 100) + 5
    return [(str(run_id), status, created) for run_id, status, created in
            ScheduleSlot.objects.filter(schedule=schedule, outcome=SlotOutcome.STARTED, run__isnull=False)
            .order_by("-slot").values_list("run_id", "run__status", "slot")[:limit]]


def _failures(schedule: Schedule, history: list[tuple[str, str, datetime]]) -> int:
    """Failed runs in a row among the finished ones (since the schedule was last resumed)."""
    count = 0
    for _, status, slot in history:
        if schedule.paused_at is not None and slot <= schedule.paused_at:
            break
        if status in ACTIVE or status == RunStatus.CANCELLED:
            continue
        if status != RunStatus.FAILED:
            break
        count += 1
    return count


def _pause_here(schedule: Schedule, slot: datetime | None, now: datetime, reason: str, run_id: str | None,
                failures: int) -> Fired:
    Schedule.objects.filter(pk=schedule.pk).update(
        enabled=False, paused_reason=reason[:4000], paused_at=now, consecutive_failures=failures)
    outbox.on_schedule_paused(schedule, reason, run_id, now)
    log.warning("schedules: %s paused: %s", schedule.name, reason)
    return Fired(schedule.name, slot, "paused", reason=f"paused: {reason}")


def _pause(schedule: Schedule, slot: datetime | None, now: datetime, reason: str) -> Fired:
    """Pause ``schedule`` outside a slot's transaction (what it names cannot even be read)."""
    with transaction.atomic():
        if not Schedule.objects.filter(pk=schedule.pk, enabled=True, next_slot=slot).update(updated_at=now):
            return Fired(schedule.name, slot, "taken", reason="another scheduler had it")
        return _pause_here(schedule, slot, now, reason, None, schedule.consecutive_failures)


def resume(schedule: Schedule, now: datetime | None = None, *, by: Any = None) -> None:
    """Enable ``schedule`` again from its next slot after ``now`` (the slots while it was paused are
    not run); its failures in a row count again from zero. ``by``: the person resuming it, who its
    runs are started as from now on (resuming starts runs as saving does)."""
    now = now or timezone.now()
    prepare(schedule, now)
    extra = {"run_as": by} if by is not None else {}
    Schedule.objects.filter(pk=schedule.pk).update(enabled=True, paused_reason="", next_slot=calendar(schedule)
                                                   .following(now), consecutive_failures=0, updated_at=now,
                                                   **extra)


def _ago(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h"


def schedule_of(run: AgentRun) -> dict[str, Any] | None:
    """What started ``run``, if a schedule did: ``{"schedule": id, "name": ..., "slot": ...}``."""
    origin = (run.options or {}).get(runs.ORIGIN)
    return origin if isinstance(origin, dict) else None
