"""An MCP tool's questions, kept durably: the run holds no worker while a person answers.

A tool call (allowed by the MCP gate) whose server answers ``input_required`` (protocol
2026-07-28) raises ``InputRequired`` in the loop; the run's journal hands it here. Each of its
asks becomes a question of the run: a ``WorkflowStep`` of kind ``question`` on the agent run, named
``mcp:<call id>:<round>:<key>``, its ``schema`` the server's requested schema (form mode) and its
``request`` what the server sent (the mode, the URL of a url-mode ask, the key, the round and the
``requestState``, stored as sent). They are written in the commit that suspends the run, with
their ``question.asked`` notices: the inbox, the channels and the reminders treat them as they treat
a workflow's questions, and every answer goes through the one answering function
(:func:`nexo_django.durable.workflow_questions.answer`, whose ``action`` is ``accept`` with the
form's content, ``decline`` or ``cancel``; an ask that expires is a ``cancel``).

When the last ask of a round is answered the run is queued; its next pass calls the same tool once
more with ``inputResponses`` and the stored ``requestState`` (a call with a side effect is marked
executing first, as every call: a worker that dies during it leaves its outcome to a person, never
a second retry). A server that answers ``input_required`` again asks again, up to
``mcp_input.MAX_ROUNDS`` rounds; past them the model gets an error.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from .. import schema_forms
from ..core.agent import WAITING
from ..core.errors import InputRequired
from ..core.mcp_input import MAX_ROUNDS, Answers
from ..core.tools import Tool, error
from ..models import CallStatus, Notice, StepKind, StepStatus, ToolCall, WorkflowStep, args_digest
from . import driver, outbox
from .deadlines import deadline

PREFIX = "mcp:"


def step_name(call_id: str, round_: int, key: str) -> str:
    return f"{PREFIX}{call_id}:{round_}:{key}"[:200]


def asks_of(run_id: Any, call_id: str) -> list[WorkflowStep]:
    return list(WorkflowStep.objects.filter(run_id=run_id, kind=StepKind.QUESTION,
                                            name__startswith=f"{PREFIX}{call_id}:").order_by("seq"))


def _round(step: WorkflowStep) -> int:
    request = step.request if isinstance(step.request, dict) else {}
    return int(request.get("round") or 0)


def asked_before(row: ToolCall | None) -> bool:
    """Whether the call of ``row`` asked for input (its row is marked so while it waits)."""
    return row is not None and isinstance(row.result, dict) and "input_required" in row.result


def answers_for(run_id: Any, call_id: str) -> Any:
    """The answers of the call's last round of asks (``Answers``), ``WAITING`` while one still
    waits, or None: the call asked for nothing."""
    rows = asks_of(run_id, call_id)
    if not rows:
        return None
    last = max(_round(r) for r in rows)
    current = [r for r in rows if _round(r) == last]
    if any(r.status == StepStatus.WAITING for r in current):
        return WAITING
    answers: dict[str, dict[str, Any]] = {}
    for row in current:
        key = str((row.request or {}).get("key"))
        result = row.result if row.status == StepStatus.ANSWERED and isinstance(row.result, dict) else None
        answers[key] = result or {"action": "cancel"}  # ended unanswered: dismissed
    return Answers(answers, (current[0].request or {}).get("state"), last)


def asked(journal: Any, call: dict[str, Any], tool: Tool, required: InputRequired) -> Any:
    """Keep the asks of ``required`` for the suspending commit (:func:`write`); None, or the
    error the model gets past the rounds' bound."""
    rows = asks_of(journal.run.pk, call["id"])
    round_ = max((_round(r) for r in rows), default=0) + 1
    if round_ > MAX_ROUNDS:
        return error(f"MCP tool {tool.name!r} asked a person for input {MAX_ROUNDS} times and asks again; it was "
                     "stopped (a server that asks without end)")
    seq = (WorkflowStep.objects.filter(run_id=journal.run.pk).order_by("-seq").values_list("seq", flat=True).first())
    seq = -1 if seq is None else seq
    expires_at = deadline(type(journal.agent), timezone.now())
    for ask in required.asks.values():
        seq += 1
        journal.new_asks.append(WorkflowStep(
            run_id=journal.run.pk, seq=seq, name=step_name(call["id"], round_, ask.key), kind=StepKind.QUESTION,
            status=StepStatus.WAITING, question=ask.message, schema=ask.schema,
            field_order=schema_forms.order_of(ask.schema), workflow=journal.run.agent, expires_at=expires_at,
            request={"mcp": True, "tool": tool.name, "call": call["id"], "key": ask.key, "mode": ask.mode,
                     "url": ask.url, "round": round_, "state": required.state},
        ))
    journal.asking.append((call, tool, round_))
    return None


def write(batch: Any, journal: Any, now: datetime) -> list[str]:
    """Add the kept asks and their ``question.asked`` notices to the suspending commit's batch; each
    asking call's row waits ``approved`` (not executing), marked ``{"input_required": round}`` (a
    row made now for a call that had none): what tells its next pass to read the answers. The
    notices' keys."""
    for call, tool, round_ in journal.asking:
        row = journal.calls.get(call["id"])
        mark = {"status": CallStatus.APPROVED, "result": {"input_required": round_}, "updated_at": now}
        if row is not None:
            batch.update(ToolCall, {"id": row.pk}, mark)
        else:
            batch.create([driver.new(
                ToolCall, run_id=journal.run.pk, agent=journal.run.agent, tool_call_id=call["id"], name=call["name"],
                capability=tool.capability, args=call.get("args") or {}, digest=args_digest(call.get("args")),
                idempotent=tool.idempotent, server=str(getattr(tool, "server", "") or "")[:200], **mark)])
    if not journal.new_asks:
        return []
    for step in journal.new_asks:
        step.created_at = step.updated_at = now
    batch.create(journal.new_asks)
    found = []
    for step in journal.new_asks:
        found += outbox.rows("question.asked", journal.run.pk, [], now, {"key": step.name}, subject=step.name)
    if found:
        batch.insert(Notice, outbox.COLUMNS, found)
    return [r[2] for r in found]
