"""The decisions behind a suggested rule: the latest of those its pattern matches.

Bounded: the last :data:`SCAN` decisions (by id) of the agent and tool are looked at, and the
rule's own matching (:func:`nexo_django.durable.rules.matches`) says which of them it covers. The
tallies (:mod:`.tally`) hold the counts of all of them; this page shows the rows.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Max
from django.utils import timezone

from ...models import ApprovalRule, Decision, Verdict
from .. import rules

SCAN = 10_000
SHOWN = 200


def decisions(agent: str, tool: str, path: str) -> dict[str, Any]:
    """``{"rows": [...], "approved": n, "denied": n}`` among the last :data:`SCAN` decisions."""
    top = Decision.objects.aggregate(top=Max("pk"))["top"] or 0
    rule = ApprovalRule(agent=agent, tool=tool, path=path, verdict=Verdict.APPROVED, enabled=True)
    now = timezone.now()
    rows: list[dict[str, Any]] = []
    counts = {"approved": 0, "denied": 0}
    scan = (Decision.objects.filter(pk__gt=top - SCAN, tool_call__agent=agent, tool_call__name=tool)
            .select_related("tool_call", "decided_by").order_by("-pk"))
    for decision in scan.iterator(chunk_size=1000):
        call = decision.tool_call
        if not rules.decidable(call) or not rules.matches(rule, call, agent, now):
            continue
        counts["approved" if decision.verdict == Verdict.APPROVED else "denied"] += 1
        if len(rows) < SHOWN:
            rows.append({"decided_at": decision.decided_at, "verdict": decision.verdict, "source": decision.source,
                         "by": str(decision.decided_by or "—"), "run_id": call.run_id, "call": call.tool_call_id,
                         "target": rules.gate_path(call.capability, call.args) or
                         (call.args.get("command", "") if isinstance(call.args, dict) else ""),
                         "wait": (decision.decided_at - call.created_at).total_seconds()})
    return {"rows": rows, **counts}
