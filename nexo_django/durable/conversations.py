"""Conversations: a follow-up is a new run that continues a finished run's conversation.

Each run keeps its own rows. A follow-up stores only its own prompt; the earlier runs' transcript
rows are read, never copied, as the read-only prefix of what the model is sent
(:func:`prefix`), so a follow-up's writes cost what a first run's do, however long the
conversation. The runs are linked by ``AgentRun.previous`` (one follow-up per run: a line).

Only a run that can no longer change is followed up: ``done`` or ``cancelled``. A run that is
queued, running, waits for a decision or needs attention is refused (its transcript is still
growing, and a provider refuses a new message after a call with no result); so is a ``failed``
run, which ``retry()`` may still take back up (retry it, then follow up once it is done).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from ..core.errors import ConfigurationError, FollowUpRefused
from ..core.llm.base import Message
from ..models import EVENT_COLUMNS, MESSAGE_COLUMNS, AgentRun, RunEvent, RunMessage, RunStatus
from . import agent_classes, dispatch, runs, sql

if TYPE_CHECKING:
    from ..core.agent import Agent

#: The statuses a run may be followed up from: nothing will change its transcript any more.
FOLLOWABLE = frozenset({RunStatus.DONE, RunStatus.CANCELLED})

#: Why a run in each other status cannot be followed up, and what to do.
REFUSALS: dict[str, str] = {
    RunStatus.QUEUED: "it is queued and has not answered yet; follow up once it is done",
    RunStatus.RUNNING: "it is running; follow up once it is done",
    RunStatus.SUSPENDED: "it waits for a decision on a tool call; decide it (approve or deny), "
                         "then follow up once the run is done",
    RunStatus.NEEDS_ATTENTION: "it waits for a person to settle a call whose outcome is unknown; "
                               "settle it and retry the run, then follow up once it is done",
    RunStatus.FAILED: "it failed, and retry() may still take it back up (which would change the "
                      "conversation under the follow-up); retry it and follow up once it is done",
}

def follow_up(run: AgentRun, prompt: str, *, user: Any = None, later: bool = True) -> AgentRun:
    """Start the run that follows ``run`` up (see :meth:`AgentRun.follow_up`)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"run {run.pk}.follow_up(prompt): the prompt must be a non-empty string")
    try:
        with transaction.atomic():
            # Locked (PostgreSQL) so that a decision or a retry cannot move it meanwhile; the
            # unique ``previous`` keeps two follow-ups of one run apart on every database.
            earlier = AgentRun.objects.select_for_update().filter(pk=run.pk).first()
            if earlier is None:
                raise AgentRun.DoesNotExist(f"run {run.pk} no longer exists")
            _check_followable(earlier)
            followed = AgentRun.objects.filter(previous_id=earlier.pk).values_list("pk", flat=True).first()
            if followed is not None:
                raise FollowUpRefused(
                    f"run {earlier.pk} was followed up already (by run {followed}); follow up on the "
                    "last run of the conversation"
                )
            new = _store(earlier, prompt, user, later=later)
    except IntegrityError as exc:  # two follow-ups at once: the other one was stored first
        raise FollowUpRefused(f"run {run.pk} was followed up already, at the same moment; follow up on "
                              "the last run of the conversation") from exc
    if not later:
        runs.execute_run(str(new.pk))
        new.refresh_from_db()
    return new


def _check_followable(run: AgentRun) -> None:
    if run.status in FOLLOWABLE:
        return
    why = REFUSALS.get(run.status, "it is not finished")
    raise FollowUpRefused(f"run {run.pk} cannot be followed up while it is {run.status}: {why}")


def _store(earlier: AgentRun, prompt: str, user: Any, *, later: bool) -> AgentRun:
    """Store the follow-up, queued, with its prompt as its only message: the agent's options and
    the virtual sandbox's files are the earlier run's; a local sandbox must still be the folder
    the conversation started in (``build_agent`` checks its pin)."""
    try:
        cls: type[Agent] = agent_classes.agent_class(earlier.agent)
    except ImportError as exc:
        raise ConfigurationError(f"run {earlier.pk}: cannot import agent {earlier.agent!r}: {exc}") from exc
    runs._check_user(cls, "follow_up", user)
    live = earlier.options.get("_live")
    if live:
        raise ConfigurationError(
            f"run {earlier.pk} was started with non-JSON {', '.join(live)}; a follow-up is rebuilt from "
            f"JSON, so declare them on {cls.__name__} to follow up"
        )
    new = AgentRun(
        agent=earlier.agent, prompt=prompt, status=RunStatus.QUEUED, created_by=runs._user(user),
        options=dict(earlier.options), generation=1, workspace=earlier.workspace, previous=earlier,
    )
    runs.build_agent(new).close()  # a configuration or workspace error reaches the caller first
    now = timezone.now()
    message: Message = {"role": "user", "content": prompt}
    batch = sql.Batch()
    batch.gate_create(new)
    batch.insert(RunMessage, MESSAGE_COLUMNS, [(new.pk, 0, "user", message, now)])
    event = {"agent": earlier.agent, "later": later, "previous": str(earlier.pk)}
    batch.insert(RunEvent, EVENT_COLUMNS, [(new.pk, "created", event, now)])
    batch.run()
    if later:
        dispatch.enqueue_run(new.pk, new.generation)
        runs._refresh_at_commit(new)
    return new
