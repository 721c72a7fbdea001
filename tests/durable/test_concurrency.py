"""Many approvers at once: one decision, one resume, one execution (scripted models).

Runs on SQLite here and again on PostgreSQL in the suite's PostgreSQL pass.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError, connections

from nexo_django.core.errors import AlreadyDecided
from nexo_django.models import AgentRun, Decision, RunEvent, RunStatus, ToolCall
from tests.durable_agents import Bumper, ParallelScribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

APPROVERS = 8


def race(n: int, action: Any) -> list[str]:
    """Run ``action(i)`` in n threads released together; return what each got."""
    barrier = threading.Barrier(n)
    outcomes: list[str] = [""] * n

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            action(i)
            outcomes[i] = "ok"
        except AlreadyDecided:
            outcomes[i] = "already decided"
        except OperationalError as exc:  # SQLite: a writer that waited past its timeout
            outcomes[i] = f"busy: {exc}"
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return outcomes


def test_scripted_concurrent_approvers_make_one_decision_and_one_execution(counter: Path) -> None:
    run = Bumper.run("bump")
    call_pk = run.pending_calls()[0].pk
    outcomes = race(APPROVERS, lambda i: ToolCall.objects.get(pk=call_pk).approve(note=f"approver {i}"))
    assert outcomes.count("ok") == 1, outcomes
    assert all(o in ("ok", "already decided") for o in outcomes), outcomes
    assert Decision.objects.filter(tool_call_id=call_pk).count() == 1
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.DONE
    assert counter.read_text().split() == ["one"]
    # one wake-up: the run went queued -> running once after the decision
    assert RunEvent.objects.filter(run=run, type="decision").count() == 1
    assert AgentRun.objects.get(pk=run.pk).generation == 2


def test_scripted_concurrent_approve_and_deny_one_wins(counter: Path) -> None:
    run = Bumper.run("bump")
    call_pk = run.pending_calls()[0].pk

    def act(i: int) -> None:
        call = ToolCall.objects.get(pk=call_pk)
        (call.approve if i % 2 else call.deny)(note=str(i))

    outcomes = race(APPROVERS, act)
    assert outcomes.count("ok") == 1, outcomes
    decision = Decision.objects.get(tool_call_id=call_pk)
    assert counter.exists() == decision.approved


def test_scripted_two_last_calls_decided_at_once_wake_the_run_exactly_once(tmp_path: Path) -> None:
    run = ParallelScribe.run("two writes", cwd=tmp_path)
    pks = [c.pk for c in run.pending_calls()]
    outcomes = race(2, lambda i: ToolCall.objects.get(pk=pks[i]).approve())
    assert outcomes == ["ok", "ok"], outcomes
    fresh = AgentRun.objects.get(pk=run.pk)
    assert fresh.status == RunStatus.DONE
    assert fresh.generation == 2  # exactly one wake-up
    assert (tmp_path / "a.txt").read_text() == "A" and (tmp_path / "b.txt").read_text() == "B"



def test_scripted_a_decision_whose_batch_saw_the_other_call_pending_looks_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving the race above can hit: decision A's batch sees call B still pending (so it
    does not wake the run), then B's decision commits, also without waking it (it saw A pending).
    A looks again after its own commit and wakes the run, exactly once."""
    from nexo_django.durable import sql
    from nexo_django.models import CallStatus

    run = ParallelScribe.run("two writes", cwd=tmp_path)
    first, second = run.pending_calls()
    real_run = sql.Batch.run

    def run_then_other_decided(self: sql.Batch) -> bool:
        monkeypatch.undo()  # A's batch only
        matched = real_run(self)
        assert self.counts[-1] == 0  # it saw B's call pending: no wake-up
        # B's batch, committed meanwhile, having seen A's call pending: decided, no wake-up.
        ToolCall.objects.filter(pk=second.pk).update(status=CallStatus.APPROVED)
        Decision.objects.create(tool_call=second, verdict="approved", digest=second.digest)
        return matched

    monkeypatch.setattr(sql.Batch, "run", run_then_other_decided)
    first.approve()
    fresh = AgentRun.objects.get(pk=run.pk)
    assert fresh.status == RunStatus.DONE, fresh.status
    assert fresh.generation == 2  # woken once, by A's second look
    assert (tmp_path / "a.txt").read_text() == "A" and (tmp_path / "b.txt").read_text() == "B"


RACES = 48


def test_scripted_approve_racing_cancel_never_escapes_a_database_error(counter: Path) -> None:
    """Approve and cancel of the same run, released together, many times (on PostgreSQL this was
    "deadlock detected" in 8 of 96 races: the decision locked the call then the run, the cancel
    the run then the call). Each ends with one winner and nothing else raised."""
    from nexo_django.core.errors import TransitionError

    unexpected: list[str] = []
    for _ in range(RACES):
        run = Bumper.run("bump")
        call_pk = run.pending_calls()[0].pk
        barrier = threading.Barrier(2)
        got: list[str] = ["", ""]

        def act(
            i: int, run: AgentRun = run, call_pk: int = call_pk, got: list[str] = got,
            barrier: threading.Barrier = barrier,
        ) -> None:
            try:
                barrier.wait(timeout=10)
                if i == 0:
                    ToolCall.objects.get(pk=call_pk).approve(note="race")
                    got[i] = "approved"
                else:
                    got[i] = "cancelled" if AgentRun.objects.get(pk=run.pk).cancel(reason="race") else "too late"
            except (AlreadyDecided, TransitionError):
                got[i] = "lost"
            except Exception as exc:  # what the race must never produce
                got[i] = f"{type(exc).__name__}: {exc}"
            finally:
                connections.close_all()

        threads = [threading.Thread(target=act, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        unexpected += [f"{i}: {g}" for i, g in enumerate(got) if g not in ("approved", "cancelled", "too late", "lost")]
        fresh = AgentRun.objects.get(pk=run.pk)
        assert fresh.status in (RunStatus.DONE, RunStatus.CANCELLED), (got, fresh.status, fresh.error)
        assert not ToolCall.objects.filter(pk=call_pk, status="pending_approval").exists()
    assert unexpected == []
