"""The approvals dashboard and suggested rules, in the admin.

``<admin>/nexo_django/decision/insight/`` (``admin:nexo_django_insight``): charts and their
tables; ``.../insight/csv/<chart>/`` (``admin:nexo_django_insight_csv``) each table as CSV;
``.../insight/suggestions/`` (``admin:nexo_django_insight_suggestions``) suggested rules, accepted
or dismissed by POST; ``.../insight/evidence/`` (``admin:nexo_django_insight_evidence``) the
decisions behind one. The filters are GET parameters (``period``, ``agent``, ``tool``), checked:
a bad one is answered 400 with what to write instead.

Looking needs an active staff user with ``nexo_django.view_decision`` (or the decide
permission); anyone else is refused (403) before anything is counted. Accepting or dismissing
needs the decide permission, as every rule change does. Each page is sent with
``Content-Security-Policy: default-src 'self'``: the charts are SVG drawn here (:mod:`.svg`),
styled by a static stylesheet, with no script.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import date
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.http.response import HttpResponseBase
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from ...display import reveal
from ...durable.insight import dashboard, evidence, suggest
from ...durable.insight.dashboard import Filters
from ..audit import export_response
from ..base import DECIDE_PERMISSION
from . import svg

VIEW_PERMISSION = "nexo_django.view_decision"
CSP = "default-src 'self'"
MAX_NAME = 255


class BadFilter(ValueError):
    pass


def may_look(request: HttpRequest) -> bool:
    user = request.user
    return bool(user.is_active and user.is_staff and (user.has_perm(VIEW_PERMISSION) or user.has_perm(DECIDE_PERMISSION)))


def filters_of(request: HttpRequest) -> Filters:
    """The page's filters from its GET parameters; ``BadFilter`` naming the one to fix."""
    period = request.GET.get("period", dashboard.DEFAULT_PERIOD)
    if period not in dashboard.PERIODS:
        raise BadFilter(f"period {period[:40]!r} is not one of {', '.join(dashboard.PERIODS)}: "
                        f"write for instance ?period={dashboard.DEFAULT_PERIOD}")
    names = {}
    for key in ("agent", "tool"):
        value = request.GET.get(key, "")
        if len(value) > MAX_NAME or any(ord(c) < 32 for c in value):
            raise BadFilter(f"{key} must be a name of at most {MAX_NAME} characters without control characters "
                            "(the dotted path of an Agent class, a tool's name), or left empty for all")
        names[key] = value
    return Filters(period=period, agent=names["agent"], tool=names["tool"])


def _secure(response: HttpResponseBase) -> HttpResponseBase:
    response["Content-Security-Policy"] = CSP
    response["X-Frame-Options"] = "DENY"
    return response


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _pct(value: float) -> str:
    return f"{value * 100:.0f} %"


class Page:
    """What one page computes, each part once: the three wait charts share one query, the
    pending chart and the page's header one count."""

    def __init__(self, filters: Filters, today: date, *, charts: int) -> None:
        self.filters, self.today = filters, today
        self.charts = charts  # how many charts the page draws (1: a CSV, which reads its own)

    @functools.cached_property
    def waits(self) -> dict[str, list[dict[str, Any]]]:
        return dashboard.all_waits(self.filters, self.today)

    def wait(self, by: str) -> list[dict[str, Any]]:
        return self.waits[by] if self.charts > 1 else dashboard.waits(self.filters, self.today, by)

    @functools.cached_property
    def pending(self) -> dict[str, Any]:
        return dashboard.pending_ages(self.filters, timezone.now())


#: chart name -> (columns of its table and CSV, how to compute its rows)
Table = tuple[tuple[str, ...], Callable[[Page], list[dict[str, Any]]]]
TABLES: dict[str, Table] = {
    "over_time": (("day", *dashboard.OUTCOMES), lambda p: dashboard.over_time(p.filters, p.today)),
    "reviewers": (("reviewer", "approved", "denied"), lambda p: dashboard.by_reviewer(p.filters, p.today)),
    "wait_agent": (("name", "decisions", "median", "p90"), lambda p: p.wait("agent")),
    "wait_tool": (("name", "decisions", "median", "p90"), lambda p: p.wait("tool")),
    "wait_reviewer": (("name", "decisions", "median", "p90"), lambda p: p.wait("reviewer")),
    "pending": (("age", "calls"), lambda p: p.pending["bands"]),
    "rates": (("tool", "pattern", "decisions", "approved", "denied", "expired", "approve_rate", "deny_rate"),
              lambda p: dashboard.rates(p.filters, p.today)),
    "runs": (("outcome", "runs"), lambda p: dashboard.runs_by_outcome(p.filters, p.today)),
}
OUTCOME_SERIES = [svg.Series(o, o, o.replace(" ", "-")) for o in dashboard.OUTCOMES]
WAIT_SERIES = [svg.Series("median", "median", "median"), svg.Series("p90", "p90", "p90")]
TITLES = {
    "over_time": "Decisions over time", "reviewers": "Decisions by reviewer",
    "wait_agent": "Time to a person's decision, by agent", "wait_tool": "Time to a person's decision, by tool",
    "wait_reviewer": "Time to a person's decision, by approver", "pending": "Waiting now, by age",
    "rates": "Approve and deny rates, by tool and target", "runs": "Runs by outcome, among those that changed in the period",
}


def _chart(name: str, rows: list[dict[str, Any]]) -> Any:
    title = TITLES[name]
    if name == "over_time":
        return svg.bars(name, title, [{**r, "day": r["day"].isoformat()} for r in rows], "day", OUTCOME_SERIES)

    if name == "reviewers":
        return svg.bars(name, title, rows, "reviewer", [svg.Series("approved", "approved", "approved"),
                                                         svg.Series("denied", "denied", "denied")])
    if name.startswith("wait_"):
        return svg.bars(name, title, rows, "name", WAIT_SERIES, stacked=False, fmt=_duration)
    if name == "pending":
        return svg.bars(name, title, rows, "age", [svg.Series("calls", "calls waiting", "pending")])
    if name == "rates":
        shown = [{"label": f"{r['tool']} {r['pattern']}", "approved": r["approved"], "denied": r["denied"],
                  "expired": r["expired"]} for r in rows]
        return svg.bars(name, title, shown, "label", [svg.Series(o, o, o) for o in ("approved", "denied", "expired")])
    return svg.bars(name, title, rows, "outcome", [svg.Series("runs", "runs", "runs")])


def _display(name: str, column: str, value: Any) -> Any:
    if column in ("median", "p90"):
        return _duration(value)
    if column.endswith("_rate"):
        return _pct(value)
    if column in ("agent", "name", "tool", "pattern", "reviewer"):
        return reveal(str(value))
    return value


def _refused(request: HttpRequest, site: Any, error: str) -> HttpResponseBase:
    context = {**site.each_context(request), "title": "Approvals dashboard", "error": error,
               "periods": list(dashboard.PERIODS)}
    return _secure(TemplateResponse(request, "admin/nexo_django/insight/dashboard.html", context, status=400))


def dashboard_view(site: Any, request: HttpRequest) -> HttpResponseBase:
    if not may_look(request):
        raise PermissionDenied
    try:
        filters = filters_of(request)
    except BadFilter as exc:
        return _refused(request, site, str(exc))
    today = timezone.now().date()
    query = urlencode({k: v for k, v in (("period", filters.period), ("agent", filters.agent),
                                        ("tool", filters.tool)) if v})
    charts = []
    page = Page(filters, today, charts=len(TABLES))
    for name, (columns, compute) in TABLES.items():
        rows = compute(page)
        charts.append({
            "name": name, "title": TITLES[name], "svg": _chart(name, rows), "columns": columns,
            "rows": [[_display(name, c, r[c]) for c in columns] for r in rows],
            "csv": reverse(f"{site.name}:nexo_django_insight_csv", args=[name]) + (f"?{query}" if query else ""),
        })
    pending = page.pending
    context = {
        **site.each_context(request), "title": "Approvals dashboard", "filters": filters, "charts": charts,
        "periods": list(dashboard.PERIODS), "choices": dashboard.choices(filters, today),
        "total": dashboard.summary(filters, today)["decisions"], "pending_total": pending["total"],
        "oldest": _duration(pending["oldest_seconds"]),
        "suggestions_url": reverse(f"{site.name}:nexo_django_insight_suggestions"),
    }
    return _secure(TemplateResponse(request, "admin/nexo_django/insight/dashboard.html", context))


def csv_view(site: Any, request: HttpRequest, chart: str) -> HttpResponseBase:
    if not may_look(request):
        raise PermissionDenied
    if chart not in TABLES:
        raise Http404(f"No chart {chart[:40]!r}: one of {', '.join(TABLES)}.")
    try:
        filters = filters_of(request)
    except BadFilter as exc:
        return _secure(HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8"))
    columns, compute = TABLES[chart]
    rows = compute(Page(filters, timezone.now().date(), charts=1))
    return export_response(iter(rows), columns, "csv", f"insight-{chart}")


def _evidence_url(site: Any, s: suggest.Suggestion) -> str:
    return reverse(f"{site.name}:nexo_django_insight_evidence") + "?" + urlencode(
        {"agent": s.agent, "tool": s.tool, "path": s.path})


def suggestions_view(site: Any, request: HttpRequest) -> HttpResponseBase:
    if not may_look(request):
        raise PermissionDenied
    if request.method == "POST":
        return _decide_suggestion(site, request)
    found = suggest.suggestions()
    rows = [{"s": s, "agent": reveal(s.agent.rsplit(".", 1)[-1]), "agent_path": reveal(s.agent), "tool": reveal(s.tool),
             "path": reveal(s.path) if s.path else "any call", "wait": _duration(s.mean_wait),
             "evidence": _evidence_url(site, s)} for s in found]
    context = {**site.each_context(request), "title": "Suggested rules", "rows": rows,
               "can_decide": request.user.has_perm(DECIDE_PERMISSION), "min_approvals": suggest.MIN_APPROVALS,
               "dashboard_url": reverse(f"{site.name}:nexo_django_insight")}
    return _secure(TemplateResponse(request, "admin/nexo_django/insight/suggestions.html", context))


def _decide_suggestion(site: Any, request: HttpRequest) -> HttpResponseBase:
    if not request.user.has_perm(DECIDE_PERMISSION):
        raise PermissionDenied
    back = reverse(f"{site.name}:nexo_django_insight_suggestions")
    agent, tool, path = (request.POST.get(k, "") for k in ("agent", "tool", "path"))
    action = request.POST.get("action")
    found = suggest.find(agent, tool, path)
    if found is None:
        messages.error(request, "Nothing changed: that rule is not (or no longer) supported by the history, or was "
                                "accepted or dismissed already.")
        return HttpResponseRedirect(back)
    if action == "accept":
        try:
            rule = suggest.accept(found, request.user, note=request.POST.get("note", ""))
        except ValidationError as exc:
            messages.error(request, f"Nothing changed: {' '.join(exc.messages)}")
            return HttpResponseRedirect(back)
        messages.success(request, f"Rule #{rule.pk} created; it approves none of your own runs (four eyes).")
        return HttpResponseRedirect(reverse(f"{site.name}:nexo_django_approvalrule_change", args=[rule.pk]))
    if action == "dismiss":
        suggest.dismiss(agent, tool, path, request.user, note=request.POST.get("note", ""))
        messages.success(request, "Suggestion dismissed; it is not suggested again.")
        return HttpResponseRedirect(back)
    messages.error(request, "Nothing changed: the action is accept or dismiss.")
    return HttpResponseRedirect(back)


def evidence_view(site: Any, request: HttpRequest) -> HttpResponseBase:
    if not may_look(request):
        raise PermissionDenied
    agent, tool, path = (request.GET.get(k, "") for k in ("agent", "tool", "path"))
    if not agent or not tool or len(agent) > MAX_NAME or len(tool) > MAX_NAME or len(path) > 1000:
        return _secure(HttpResponse("evidence needs ?agent=...&tool=...&path=... as the suggestion names them",
                                    status=400, content_type="text/plain; charset=utf-8"))
    found = evidence.decisions(agent, tool, path)
    for row in found["rows"]:
        row["run_url"] = reverse(f"{site.name}:nexo_django_agentrun_change", args=[row["run_id"]])
        row["target"], row["wait"] = reveal(row["target"]), _duration(row["wait"])
    context = {**site.each_context(request), "title": "Decisions behind a suggested rule", "found": found,
               "agent": reveal(agent), "tool": reveal(tool), "path": reveal(path) if path else "any call",
               "scan": evidence.SCAN}
    return _secure(TemplateResponse(request, "admin/nexo_django/insight/evidence.html", context))


def urls(site: Any) -> list[Any]:
    from django.urls import path

    def wrap(view: Callable[..., HttpResponseBase]) -> Any:
        return site.admin_view(lambda request, *a, **k: view(site, request, *a, **k))

    return [
        path("insight/", wrap(dashboard_view), name="nexo_django_insight"),
        path("insight/csv/<str:chart>/", wrap(csv_view), name="nexo_django_insight_csv"),
        path("insight/suggestions/", wrap(suggestions_view), name="nexo_django_insight_suggestions"),
        path("insight/evidence/", wrap(evidence_view), name="nexo_django_insight_evidence"),
    ]
