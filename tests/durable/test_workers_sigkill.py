"""What SIGKILL does to a forking rq worker, as docs/deployment.md says (issue 24, item 8): killing
rq's main process alone leaves its work horse finishing the job, and the run finishes; killing the
horse too leaves the run to the reconciler. Real redis-server, real rqworker processes SIGKILLed,
scripted models."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from nexo_django.durable.recovery import reconcile
from nexo_django.models import AgentRun, RunStatus
from tests.durable_agents import SlowSleeper
from tests.servers import descendants, pid_alive, signal_quietly, wait_dead, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable, pytest.mark.redis]


def _running_in_a_horse(workers: Any) -> tuple[AgentRun, int, list[int]]:
    """The run, the index of the worker whose horse drives it, and that horse's pids."""
    run = SlowSleeper.run_later("rest")  # one 4 s tool call: long enough to kill meanwhile
    wait_until(lambda: AgentRun.objects.get(pk=run.pk).status == RunStatus.RUNNING, timeout=30,
               what="a worker to claim the run")

    def busy() -> tuple[int, list[int]] | None:
        for index, pid in enumerate(workers.pids):
            horses = descendants(pid)
            if horses:
                return index, horses
        return None

    index, horses = wait_until(busy, timeout=10, what="the work horse")
    return run, index, horses


def test_sigkill_of_rqs_main_process_leaves_the_horse_finishing_the_run_scripted(rq_worker: Any) -> None:
    workers = rq_worker(1)
    run, index, horses = _running_in_a_horse(workers)
    main = workers.pids[index]
    signal_quietly(main, signal.SIGKILL)
    wait_dead([main])
    assert any(pid_alive(pid) for pid in horses)  # the horse goes on without its parent
    done = wait_until(lambda: AgentRun.objects.filter(pk=run.pk, status=RunStatus.DONE).first(), timeout=30,
                      what="the orphaned horse to finish the run")
    assert done.result == "Rested." and done.recoveries == 0  # finished by the horse, not recovered
    wait_dead(horses)
    assert reconcile().requeued == []


def test_sigkill_of_the_worker_and_its_horse_leaves_the_run_to_the_reconciler_scripted(
    rq_worker: Any, settings: Any
) -> None:
    settings.NEXO = {**settings.NEXO, "LEASE_SECONDS": 2}
    workers = rq_worker(2)
    run, index, _ = _running_in_a_horse(workers)
    workers.kill(index)  # the worker and its horse at once, like a lost machine
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.RUNNING
    requeued = wait_until(lambda: reconcile().requeued, timeout=15, what="the lease to expire")
    assert requeued == [str(run.pk)]
    done = wait_until(lambda: AgentRun.objects.filter(pk=run.pk, status=RunStatus.DONE).first(), timeout=30,
                      what="the other worker to finish the run")
    assert done.recoveries == 1
