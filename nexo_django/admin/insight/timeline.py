"""The picture of a run: its model turns, tool calls and waits for people on one time axis, and a
workflow's steps, questions and agents inside. Drawn from what the run's page already loaded
(its window of events, a workflow's steps): no query of its own, bounded as that page is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.utils.safestring import SafeString

from ...models import RunEvent
from .svg import Span, timeline


def run_spans(events: Sequence[RunEvent]) -> list[Span]:
    """Spans from a run's events in order: ``model_request`` to ``model_reply`` (a turn),
    ``tool_call`` to its ``tool_result``, ``suspended`` to each call's ``decision`` or
    ``expired`` (a wait for a person: who decided, and how)."""
    if not events:
        return []
    origin = events[0].created_at
    at = [(e.created_at - origin).total_seconds() for e in events]
    spans: list[Span] = []
    turn: tuple[float, Any] | None = None
    calls: dict[str, tuple[float, str]] = {}
    waiting: dict[str, float] = {}
    for e, t in zip(events, at, strict=True):
        data = e.data if isinstance(e.data, dict) else {}
        if e.type == "model_request":
            turn = (t, data.get("turn"))
        elif e.type == "model_reply" and turn is not None:
            spans.append(Span("model", f"turn {turn[1]}", turn[0], t, "turn"))
            turn = None
        elif e.type == "tool_call":
            calls[str(data.get("id"))] = (t, str(data.get("name", "")))
        elif e.type == "tool_result" and str(data.get("id")) in calls:
            start, name = calls.pop(str(data.get("id")))
            spans.append(Span("tools", name, start, t, "denied" if data.get("error") else "call"))
        elif e.type == "suspended":
            for call in data.get("pending") or []:
                waiting.setdefault(str(call), t)
        elif e.type in ("decision", "expired") and str(data.get("call")) in waiting:
            start = waiting.pop(str(data.get("call")))
            verdict = "expired" if e.type == "expired" else str(data.get("verdict", ""))
            who = str(data.get("by") or ("a rule" if data.get("source") == "rule" else "nobody named"))
            spans.append(Span("people", f"{data.get('call')} {verdict}", start, t,
                              "wait" if verdict == "approved" else "denied", detail=f"by {who}"))
    # What is still open runs to the last event shown.
    end = at[-1]
    for call, start in waiting.items():
        spans.append(Span("people", f"{call} waiting", start, end, "wait", detail="no decision yet"))
    return spans


def of_run(events: Sequence[RunEvent]) -> SafeString | None:
    spans = run_spans(events)
    if not spans:
        return None
    return timeline("run-timeline", "The run: model turns, tool calls and waits for people", spans)


def workflow_spans(steps: Sequence[dict[str, Any]]) -> list[Span]:
    """A workflow's steps from its page's rows (``created_at``, ``updated_at``/``answered_at``):
    checkpoints, questions (with who answered) and agents inside."""
    dated = [s for s in steps if s.get("created_at") is not None]
    if not dated:
        return []
    origin = min(s["created_at"] for s in dated)
    spans = []
    for s in dated:
        end = s.get("answered_at") or s.get("updated_at") or s["created_at"]
        lane = {"question": "questions", "agent": "agents"}.get(s["kind"], "steps")
        detail = f"answered by {s['answered_by']}" if s.get("answered_by") else str(s.get("status", ""))
        spans.append(Span(lane, str(s["name"]), (s["created_at"] - origin).total_seconds(),
                          (end - origin).total_seconds(), {"questions": "question", "agents": "agent"}.get(lane, "step"),
                          detail=detail))
    return spans


def of_workflow(steps: Sequence[dict[str, Any]]) -> SafeString | None:
    spans = workflow_spans(steps)
    if not spans:
        return None
    return timeline("workflow-timeline", "The workflow: its steps, questions and agents", spans)
