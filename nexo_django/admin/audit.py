"""The decision log, downloadable: CSV and JSON, filtered like the admin's changelist, streamed.

``GET <admin>/nexo_django/decision/export/csv/?<the changelist's filters>`` (and ``.../json/``)
answers with a ``StreamingHttpResponse`` over ``.iterator(chunk_size=...)``: rows are read from the
database a chunk at a time and written out as they come, so 100 000 decisions never sit in memory.
Model-produced text in CSV cells that a spreadsheet would run as a formula (``=``, ``+``, ``-``,
``@``, tab, carriage return first) is prefixed with ``'``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F, Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.utils import timezone

from ..durable import outcomes
from ..models import Decision, Verdict

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

CHUNK = 2000
COLUMNS = ("decided_at", "verdict", "source", "decided_by", "channel_user", "run", "agent", "tool", "call_id",
           "capability", "args", "digest", "edited", "stop", "note", "rule", "rule_said", "outcome", "outcome_detail",
           "policy", "approvals", "risk", "risk_reason")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")

#: (label, filter) of each outcome: an expiry is neither a person's denial nor a rule's
OUTCOMES: dict[str, tuple[str, Q]] = {
    "approved": ("approved by a person", Q(verdict=Verdict.APPROVED) & ~Q(source__in=("rule", "expiry"))),
    "denied": ("denied by a person", Q(verdict=Verdict.DENIED) & ~Q(source__in=("rule", "expiry"))),
    "expired": ("expired without a decision", Q(source="expiry")),
    "rule": ("decided by a standing rule", Q(source="rule")),
}


class OutcomeFilter(admin.SimpleListFilter):
    title = "outcome"
    parameter_name = "outcome"

    def lookups(self, request: HttpRequest, model_admin: ModelAdmin[Any]) -> list[tuple[str, str]]:
        counts = model_admin.get_queryset(request).order_by().aggregate(
            **{key: Count("pk", filter=q) for key, (_, q) in OUTCOMES.items()}
        )
        return [(key, f"{label} ({counts[key]})") for key, (label, _) in OUTCOMES.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(OUTCOMES[value][1]) if value in OUTCOMES else queryset


def row(decision: Decision) -> dict[str, Any]:
    call = decision.tool_call
    happened = outcomes.of_call(call, decision, getattr(decision, "nexo_run_status", None))
    return {
        "decided_at": decision.decided_at.isoformat(),
        "verdict": decision.verdict,
        "source": decision.source,
        "decided_by": str(decision.decided_by) if decision.decided_by_id else "",
        "channel_user": decision.channel_user,
        "run": str(call.run_id),
        "agent": call.agent,
        "tool": call.name,
        "call_id": call.tool_call_id,
        "capability": call.capability,
        # What was decided on: the edited arguments if the approver changed them.
        "args": decision.args if decision.args is not None else call.args,
        "digest": decision.digest,
        "edited": decision.args is not None,
        "stop": decision.stop,
        "note": decision.note,
        "rule": decision.rule_id,
        # What the rule said when it decided, whatever it says now.
        "rule_said": decision.rule_said,
        # What happened after the decision (durable.outcomes), from the call's row.
        "outcome": happened.kind,
        "outcome_detail": happened.text,
        # The approval policy that routed it (as it was when the call suspended), each approval
        # of its quorum (who, when, from where), and the reviewer agent's advice.
        "policy": call.policy_said,
        "approvals": [{"by": str(a.approved_by or ""), "at": a.approved_at.isoformat(), "source": a.source}
                      for a in call.approvals.all()],
        "risk": call.risk,
        "risk_reason": call.risk_reason,
    }


def _cell(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        value = json.dumps(value, ensure_ascii=False, sort_keys=True)
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return "" if value is None else value


class _Line:
    """A file whose write returns what it was given: csv.writer then makes lines to stream."""

    def write(self, value: str) -> str:
        return value


def csv_lines(decisions: Iterator[Decision]) -> Iterator[str]:
    return table_csv((row(decision) for decision in decisions), COLUMNS)


def table_csv(rows: Iterator[dict[str, Any]], columns: Sequence[str]) -> Iterator[str]:
    """``rows`` as CSV lines, a header first; formula-like cells made inert."""
    writer = csv.writer(_Line())
    yield writer.writerow(columns)
    for data in rows:
        yield writer.writerow([_cell(data[c]) for c in columns])


def table_json(rows: Iterator[dict[str, Any]]) -> Iterator[str]:
    """``rows`` as one JSON array, streamed a row at a time."""
    yield "["
    first = True
    for data in rows:
        yield ("\n" if first else ",\n") + json.dumps(data, ensure_ascii=False, default=str)
        first = False
    yield "\n]\n"


def refuse_export(model_admin: Any, request: HttpRequest, fmt: str) -> HttpResponseBase | None:
    """Why an export request is refused (a response), or ``None``: GET or HEAD only, the view
    permission, and a format this module writes."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    if fmt not in ("csv", "json"):
        return HttpResponseBadRequest("export as csv or json")
    return None


def export_response(rows: Iterator[dict[str, Any]], columns: Sequence[str], fmt: str, name: str) -> StreamingHttpResponse:
    """``rows`` streamed as a ``fmt`` attachment named ``nexo-<name>-<timestamp>.<fmt>``."""
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    if fmt == "csv":
        response = StreamingHttpResponse(table_csv(rows, columns), content_type="text/csv; charset=utf-8")
    else:
        response = StreamingHttpResponse(table_json(rows), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="nexo-{name}-{stamp}.{fmt}"'
    return response


def export_view(model_admin: ModelAdmin[Any], request: HttpRequest, fmt: str) -> HttpResponseBase:
    """The changelist's decisions (its filters, search and order, every page) as ``fmt``."""
    if (refused := refuse_export(model_admin, request, fmt)) is not None:
        return refused
    try:
        changelist = model_admin.get_changelist_instance(request)
    except IncorrectLookupParameters:
        return HttpResponseBadRequest("these filters are not the changelist's; export from the decisions page")
    queryset = changelist.get_queryset(request).select_related("tool_call", "decided_by").prefetch_related(
        "tool_call__approvals__approved_by")
    if "nexo_run_status" not in queryset.query.annotations:  # a project's own admin, not DecisionAdmin's
        queryset = queryset.annotate(nexo_run_status=F("tool_call__run__status"))
    decisions = queryset.iterator(chunk_size=CHUNK)
    return export_response((row(decision) for decision in decisions), COLUMNS, fmt, "decisions")
