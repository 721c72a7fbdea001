"""Two schedulers racing for the same slots, in threads and in two processes, and a scheduler
killed in the middle of a slot: one run per slot (scripted models, the inline queue)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import close_old_connections, connection

from nexo_django.durable import schedules
from nexo_django.durable.recovery import reconcile
from nexo_django.models import AgentRun
from nexo_django.schedule_models import ScheduleSlot
from tests.schedules.helpers import make

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SLOT = datetime(2026, 6, 1, 7, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]


def scheduler_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(REPO),
           "NEXO_TEST_DB_NAME": str(connection.settings_dict["NAME"]), **extra}
    env.pop("REDIS_URL", None)  # the inline queue: each run runs at the commit that starts it
    for key in ("NEXO_TEST_RQ_QUEUES", "NEXO_TEST_NEXO_SETTINGS", "NEXO_TEST_CRASH_AT"):
        env.pop(key, None) if key not in extra else None
    return env


def test_threads_racing_for_every_slot_start_one_run_each() -> None:
    for n in range(5):
        make(name=f"s{n}", cron="0 * * * *")
    for hour in range(3):
        now = SLOT + timedelta(hours=hour, seconds=1)
        barrier = threading.Barrier(4)
        outcomes: list[str] = []
        errors: list[BaseException] = []

        def race(now: datetime = now, barrier: threading.Barrier = barrier, outcomes: list[str] = outcomes,
                 errors: list[BaseException] = errors) -> None:
            try:
                barrier.wait()
                outcomes.extend(f.outcome for f in schedules.tick(now).fired)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
            finally:
                close_old_connections()

        threads = [threading.Thread(target=race) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert outcomes.count("started") == 5, outcomes
        assert set(outcomes) <= {"started", "taken"}
    assert AgentRun.objects.count() == 15
    assert ScheduleSlot.objects.filter(outcome="started").count() == 15


def test_two_scheduler_processes_racing_start_one_run_per_slot(tmp_path: Path) -> None:
    for n in range(10):
        make(name=f"s{n}", cron="0 * * * *")
    for hour in range(2):
        go = tmp_path / f"go-{hour}"
        now = (SLOT + timedelta(hours=hour, seconds=1)).isoformat()
        procs = [subprocess.Popen([sys.executable, "-m", "tests.schedules.race_tick", now, str(go)],
                                  env=scheduler_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(2)]
        go.touch()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
            results += json.loads(out.decode().strip().splitlines()[-1])
        started = [name for name, outcome in results if outcome == "started"]
        assert sorted(started) == sorted(f"s{n}" for n in range(10)), results
    assert AgentRun.objects.count() == 20
    for n in range(10):
        assert ScheduleSlot.objects.filter(schedule__name=f"s{n}", outcome="started").count() == 2


def test_a_scheduler_killed_before_its_commit_leaves_nothing_and_the_next_tick_fires_once(tmp_path: Path) -> None:
    make()
    go = tmp_path / "go"
    go.touch()
    proc = subprocess.run([sys.executable, "-m", "tests.schedules.race_tick", SLOT.isoformat(), str(go)],
                          env=scheduler_env(NEXO_TEST_CRASH_AT="schedule_before_commit"), cwd=REPO,
                          capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()
    assert not AgentRun.objects.exists() and not ScheduleSlot.objects.exists()
    assert len(schedules.tick(SLOT + timedelta(seconds=30)).started) == 1
    assert schedules.tick(SLOT + timedelta(seconds=31)).fired == []
    assert AgentRun.objects.count() == 1


def test_a_scheduler_killed_after_its_commit_leaves_its_one_run(tmp_path: Path) -> None:
    """Killed once the slot committed (on the inline queue its run ran at that commit): the slot
    is taken, the next tick starts nothing more."""
    make()
    go = tmp_path / "go"
    go.touch()
    proc = subprocess.run([sys.executable, "-m", "tests.schedules.race_tick", SLOT.isoformat(), str(go)],
                          env=scheduler_env(NEXO_TEST_CRASH_AT="schedule_after_commit"), cwd=REPO,
                          capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()
    run = AgentRun.objects.get()
    assert run.status == "done", run.error
    assert ScheduleSlot.objects.get().run_id == run.pk
    assert schedules.tick(SLOT + timedelta(seconds=30)).fired == []
    assert reconcile(stale_after=0).resent == []
    assert AgentRun.objects.count() == 1
