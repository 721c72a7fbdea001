"""A workflow's questions and their answers: who may answer, the schema, once only, and the
reconciler's expiry. The pass that asks is :mod:`.workflow_runs`; an answer wakes its run
(:mod:`.parents`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import jsonschema
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from .. import schema_forms, storable
from ..conf import nexo_settings
from ..core.errors import AlreadyDecided, ApprovalExpired, InvalidAnswer, WorkflowError
from ..models import AgentRun, OpenQuestion, RunEvent, StepKind, StepStatus, WorkflowStep
from . import dispatch, outbox, parents, runs, sql


def _event(run_id: Any, type: str, **data: Any) -> None:
    sql.create(RunEvent(run_id=run_id, type=type, data=data))


# --- people: questions and answers ----------------------------------------------------------------


def open_questions() -> QuerySet[OpenQuestion]:
    """Every question waiting for an answer, oldest first, with its run: what an inbox or a
    channel announces (``answer_question`` records an answer)."""
    return (OpenQuestion.objects.filter(kind=StepKind.QUESTION, status=StepStatus.WAITING)
            .select_related("run", "run__created_by").order_by("created_at", "id"))


def step_of(notice: Any) -> WorkflowStep | None:
    """The question a ``question.*`` notice is about: by its ``step`` id, or (an MCP server's ask,
    written in the suspending commit before it had an id) by its ``key``, in the notice's run."""
    payload = notice.payload if isinstance(notice.payload, dict) else {}
    found = WorkflowStep.objects.filter(run_id=notice.run_id, kind=StepKind.QUESTION).select_related("run", "answered_by")
    if isinstance(payload.get("step"), int):
        return found.filter(pk=payload["step"]).first()
    if isinstance(payload.get("key"), str):
        return found.filter(name=payload["key"]).first()
    return None


def answer_question(step: WorkflowStep, value: Any, *, by: Any, source: str = "api",
                    channel_user: str = "") -> WorkflowStep:
    """Record ``by``'s answer to the question ``step`` (see :func:`answer`)."""
    return answer(step.run, step.name, value, by=by, source=source, channel_user=channel_user)


def check_answer(step: WorkflowStep, value: Any) -> None:
    """``InvalidAnswer`` with the reason if ``value`` does not match the question's schema."""
    # Before anything walks it recursively (is_json, jsonschema): a value nested 100,000 deep
    # from Python raised RecursionError here; no deeper than what could be stored.
    if type(value) in (dict, list, tuple) and storable.deeper_than(value, storable.MAX_DEPTH):
        raise InvalidAnswer(f"the answer to {step.name!r} nests lists and objects more than {storable.MAX_DEPTH} "
                            "levels deep; send flatter data")
    if not storable.is_json(value):
        raise InvalidAnswer(f"the answer to {step.name!r} must be JSON, not {type(value).__name__}")
    if step.schema is None:
        return
    validator = jsonschema.validators.validator_for(step.schema)(step.schema, format_checker=schema_forms.format_checker())
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        raise InvalidAnswer(f"the answer to {step.name!r} was refused: {error.message}" + (f" (at {where})" if where else ""),
                            tuple(error.absolute_path))


def answer(run: AgentRun, key: str, value: Any, *, by: Any, source: str = "api", channel_user: str = "",
           action: str = "accept") -> WorkflowStep:
    """Record the answer to the question ``key`` of ``run``, once, and wake the run: the one path
    every answer takes (the admin's form, the JSON endpoint, Slack's buttons and modal, a signed
    webhook, MCP elicitation). ``by`` needs ``nexo_django.decide_toolcall`` (and an active account);
    with ``NEXO["SELF_APPROVAL"]`` off the run's starter is refused. An answer the schema refuses
    raises ``InvalidAnswer`` with the reason, and nothing is recorded; of two answers at once one is
    recorded, the other raises ``AlreadyDecided`` naming who answered. ``source`` (where it was
    answered) and ``channel_user`` (who, in that channel's terms) are recorded with it. ``action``:
    an MCP server's ask (``durable.elicitation``) may also be declined or cancelled (no value then);
    a workflow's question takes an answer."""
    user = runs._user(by)
    if user is None or not getattr(user, "is_active", False) or not user.has_perm("nexo_django.decide_toolcall"):
        raise PermissionDenied("answering a workflow's question needs the nexo_django.decide_toolcall permission")
    step = WorkflowStep.objects.filter(run_id=run.pk, name=key, kind=StepKind.QUESTION).select_related("run").first()
    if step is None:
        raise WorkflowError(f"run {run.pk} has asked no question {key!r}")
    if not nexo_settings.SELF_APPROVAL and step.run.created_by_id == user.pk:
        raise PermissionDenied(f"{user} started this workflow and cannot answer its questions: NEXO['SELF_APPROVAL'] "
                               "is off, so another person with the decide permission must")
    if step.status != StepStatus.WAITING:
        raise _answered(step)
    now = timezone.now()
    if step.expires_at is not None and step.expires_at <= now:
        raise ApprovalExpired(f"question {key!r} expired at {step.expires_at.isoformat(' ', 'seconds')} without an "
                              "answer; it can no longer be answered")
    asked_by_server = isinstance(step.request, dict)
    if action not in ("accept", "decline", "cancel") or (action != "accept" and not asked_by_server):
        raise InvalidAnswer(f"question {key!r} takes an answer" + (", or decline or cancel" if asked_by_server else "")
                            + f", not {str(action)[:40]!r}")
    if action == "accept":
        check_answer(step, value)
    if asked_by_server:  # what the server gets back: MCP's ElicitResult
        value = {"action": action, **({"content": value} if action == "accept" and step.schema is not None else {})}
    with transaction.atomic():
        sql.lock(AgentRun, run.pk)  # the run first, as every writer of a run's rows
        if not WorkflowStep.objects.filter(pk=step.pk, status=StepStatus.WAITING).update(
            status=StepStatus.ANSWERED, result=value, answered_by=user, answered_at=now, updated_at=now,
            answer_source=str(source)[:64], channel_user=str(channel_user)[:255],
        ):
            raise _answered(WorkflowStep.objects.select_related("answered_by").get(pk=step.pk))
        _event(run.pk, "answered", key=key, by=str(user), source=str(source)[:64])
        outbox.on_question("question.answered", step, now)
        parents.wake(run.pk)
    step.status, step.result, step.answered_by, step.answered_at = StepStatus.ANSWERED, value, user, now
    step.answer_source, step.channel_user = str(source)[:64], str(channel_user)[:255]
    if dispatch.is_inline() and isinstance(run, AgentRun) and not transaction.get_connection().in_atomic_block:
        run.refresh_from_db()
    return step


def _answered(step: WorkflowStep) -> AlreadyDecided:
    if step.status == StepStatus.EXPIRED:
        return ApprovalExpired(f"question {step.name!r} ended without an answer (expired, or its run was cancelled)")
    when = step.answered_at.isoformat(" ", "seconds") if step.answered_at else "earlier"
    return AlreadyDecided(f"question {step.name!r} was already answered by {step.answered_by or 'someone'} at {when}")


# --- the reconciler's part ------------------------------------------------------------------------


def overdue_questions(now: datetime) -> QuerySet[WorkflowStep]:
    """The questions still waiting past their deadline."""
    return WorkflowStep.objects.filter(status=StepStatus.WAITING, kind=StepKind.QUESTION, expires_at__lte=now)


def expire_questions(now: datetime) -> list[str]:
    """Questions still waiting past their deadline end as "no answer" (``ask`` raises ``NoAnswer``
    in the run's next pass, which is queued); the ids of their runs."""
    expired: list[str] = []
    for step in overdue_questions(now)[:200]:
        with transaction.atomic():
            sql.lock(AgentRun, step.run_id)
            if WorkflowStep.objects.filter(pk=step.pk, status=StepStatus.WAITING).update(
                status=StepStatus.EXPIRED, answered_at=now, updated_at=now
            ):
                _event(step.run_id, "expired", key=step.name)
                outbox.on_question("question.expired", step, now)
                parents.wake(step.run_id)
                expired.append(str(step.run_id))
    return expired


def expire_open_questions(run: AgentRun) -> None:
    """The run was cancelled (inside the cancel's transaction): its open questions can no longer
    be answered, and their messages say so (a ``question.expired`` notice each, as the
    reconciler's expiry writes)."""
    now = timezone.now()
    waiting = list(WorkflowStep.objects.filter(run_id=run.pk, kind=StepKind.QUESTION, status=StepStatus.WAITING))
    if waiting and WorkflowStep.objects.filter(pk__in=[s.pk for s in waiting], status=StepStatus.WAITING).update(
        status=StepStatus.EXPIRED, answered_at=now, updated_at=now
    ):
        for step in waiting:
            outbox.on_question("question.expired", step, now)
