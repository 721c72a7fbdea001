"""The short chaos run: bench/chaos.py for ~20 s (scripted models, real workers, real servers).

Workers SIGKILLed every few hundred ms, Redis flushed, PostgreSQL (fsync on) restarted: at the
end no run is left queued or running, no side effect ran twice, and no write the database says
succeeded is missing on disk; workflows finish with each checkpoint recorded once and each
question answered once, and no notice is posted twice (workers also die after a step's record and
between a notice's send and its record); schedules ticking all along start at most one run per
slot, leave no slot half-fired, and still tick after. The long run and its figures: ``python -m bench.chaos``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(420)
def test_short_chaos_run_loses_nothing_and_repeats_no_side_effect() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "NEXO_", "BENCH_"))}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env["PYTHONPATH"] = str(REPO_ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--seconds", "20", "--runs", "10", "--workers", "3",
         "--kill-every", "0.3", "--flushes", "2", "--pg-restarts", "2", "--drain", "120"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("figure=chaos ")]
    figures = dict(item.split("=", 1) for item in line.split())
    context = f"{line}\n{done.stderr[-3000:]}"
    # The chaos did happen.
    assert int(figures["worker_kills"]) >= 20, context
    assert (figures["redis_flushes"], figures["pg_restarts"]) == ("2", "2"), context
    # ... and it cost nothing.
    assert figures["left_queued_or_running"] == "0", context
    # Every run finished: none left waiting on a decision (the approver decides what Slack shows,
    # also while a killed post's notice waits for its claim to run out).
    assert (figures["suspended"], figures["needs_attention"], figures["drained"]) == ("0", "0", "True"), context
    assert figures["double_executions"] == "0", context
    assert figures["lost_writes"] == "0", context
    # Workflows and the outbox: each recorded step ran once, each question was answered once,
    # every workflow finished, no notice was posted twice to Slack, every notice was delivered.
    for invariant in ("workflows_unfinished", "checkpoint_double_runs", "checkpoints_lost", "questions_answered_twice",
                      "notices_posted_twice", "notices_undelivered"):
        assert figures[invariant] == "0", f"{invariant}: {context}"
    assert int(figures["slack_posts"]) > 0 and int(figures["webhook_events"]) > 0, context
    # Schedules ticked by two racing schedulers all along: one run at most per slot, no slot left
    # half-fired, every schedule still ticking after the chaos.
    for invariant in ("slot_runs_doubled", "slots_half_fired", "schedules_not_ticking"):
        assert figures[invariant] == "0", f"{invariant}: {context}"
    assert int(figures["schedule_runs"]) >= 3 and figures["schedules"] == "3", context
