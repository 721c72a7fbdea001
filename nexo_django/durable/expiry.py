"""Approval requests end: a call waits for a person until its deadline, then the reconciler
expires it.

The deadline is set when the call starts waiting (``ToolCall.expires_at``, from the agent's
``approval_timeout`` or ``NEXO["APPROVAL_TIMEOUT"]``). An expiry is a decision like any other,
recorded through :func:`nexo_django.durable.runs.decide` (so exactly once, whoever else decides at the same
moment): ``verdict="denied"``, ``source="expiry"``, nobody's; the call's status is ``expired``, and
the model is told that nobody decided (not that a person refused). ``on_timeout = "stop"`` cancels
the run instead of letting it go on.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from ..core.errors import AlreadyDecided
from ..models import AgentRun, CallStatus, ToolCall
from .deadlines import on_timeout_of
from .runs import decide

#: calls expired per query of a round (a round goes on until none is overdue)
BATCH = 200


def _waited(call: ToolCall) -> str:
    if call.expires_at is None:
        return ""
    seconds = round((call.expires_at - call.created_at).total_seconds())
    days, rest = divmod(max(seconds, 0), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [f"{n} {unit}{'s' if n != 1 else ''}" for n, unit in
             ((days, "day"), (hours, "hour"), (minutes, "minute"), (seconds, "second")) if n]
    return " within " + ", ".join(parts[:2]) if parts else ""


def overdue_calls(now: datetime) -> QuerySet[ToolCall]:
    """The calls still waiting at ``now`` past their deadline."""
    return ToolCall.objects.filter(status=CallStatus.PENDING_APPROVAL, expires_at__lte=now)


def expire_overdue(now: datetime) -> list[str]:
    """Expire every call still waiting at ``now`` past its deadline; the ids of their runs (one
    per call expired, in order). Safe on several machines at once: each expiry is ``decide()``'s
    compare-and-set, and a call someone decided meanwhile is left as they decided it."""
    expired: list[str] = []
    policies: dict[str, str] = {}
    seen: set[int] = set()
    while True:
        overdue = list(
            overdue_calls(now).exclude(pk__in=seen).select_related("run").order_by("expires_at", "id")[:BATCH]
        )
        if not overdue:
            return expired
        for call in overdue:
            seen.add(call.pk)
            stop = policies.setdefault(call.agent or call.run.agent, on_timeout_of(call.agent or call.run.agent)) == "stop"
            note = f"expired: nobody decided{_waited(call)}" + ("; the run is stopped" if stop else "")
            try:
                decide(call, approved=False, stop=stop, note=note, source="expiry")
            except (AlreadyDecided, AgentRun.DoesNotExist):
                continue  # decided (or gone) since it was read: as they left it
            expired.append(str(call.run_id))
