"""An agent run inside a workflow (``Workflow.run_agent``) wakes its workflow run when it ends.

The workflow run suspended while its agent waited; the agent's end (done, failed, cancelled, in
whichever process) queues it again so its next pass reads the agent's answer. The workflow looks
again after its own suspension commits (``workflow_runs``), so an end that came while it was still
running is not lost either; the reconciler is the last resort (``workflow_runs.wake_forgotten``).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from ..models import AgentRun, RunStatus
from ..signals import run_status_changed
from . import dispatch, sql


def wake(run_id: Any) -> bool:
    """Queue the workflow run ``run_id`` again if it is suspended (a compare-and-set; its job is
    sent at commit)."""
    generation = sql.requeue_fetch(run_id, RunStatus.SUSPENDED, RunStatus.QUEUED, timezone.now())
    if generation is None:
        return False
    if run_status_changed.has_listeners(AgentRun):
        def send() -> None:
            run = AgentRun.objects.filter(pk=run_id).first()
            if run is not None:
                run_status_changed.send(sender=AgentRun, run=run, old=RunStatus.SUSPENDED, new=RunStatus.QUEUED)

        transaction.on_commit(send)
    dispatch.enqueue_run(run_id, generation)
    return True


def child_ended(run: AgentRun) -> None:
    """``run`` reached a final status: wake its workflow run, if it has one (no query otherwise)."""
    if run.parent_id is not None:
        wake(run.parent_id)
