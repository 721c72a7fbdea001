"""The approvals dashboard's numbers against a history built here and counted by hand (not by
the dashboard's queries), on SQLite and PostgreSQL; who may see it; its filters."""

from __future__ import annotations

import csv
import io
import math
import re
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from nexo_django.durable import runs
from nexo_django.durable.insight import tally
from nexo_django.models import (
    AgentRun,
    ApprovalRule,
    CallStatus,
    RunStatus,
    ToolCall,
    args_digest,
)
from tests.admin.support import client_for, make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

DASHBOARD = "/admin/nexo_django/decision/insight/"
ALPHA, BETA = "tests.insight.Alpha", "tests.insight.Beta"


def pending_call(agent: str, name: str, args: dict[str, Any], waited: float, n: int) -> ToolCall:
    """A call waiting for a person since ``waited`` seconds ago. Its run is marked running, so a
    decision wakes nothing (the agents are names only: what is counted here is decisions)."""
    run = AgentRun.objects.create(agent=agent, prompt="p", status=RunStatus.RUNNING)
    capability = name if name in ("shell", "write", "read") else name
    call = ToolCall.objects.create(run=run, agent=agent, tool_call_id=f"c{n}", name=name, capability=capability,
                                   args=args, digest=args_digest(args), status=CallStatus.PENDING_APPROVAL)
    ToolCall.objects.filter(pk=call.pk).update(created_at=timezone.now() - timedelta(seconds=waited))
    call.refresh_from_db()
    return call


#: (agent, tool, args, waited seconds, how it is decided, by whom)
HISTORY = [
    (ALPHA, "shell", {"command": "make test"}, 30, "approve", "ann"),
    (ALPHA, "shell", {"command": "make test"}, 300, "approve", "bob"),
    (ALPHA, "shell", {"command": "make test"}, 3000, "approve", "ann"),
    (ALPHA, "shell", {"command": "rm -rf /"}, 60, "deny", "bob"),
    (ALPHA, "deploy", {}, 7200, "approve", "ann"),
    (ALPHA, "deploy", {}, 90000, "expire", None),
    (BETA, "shell", {"command": "ls"}, 5, "rule", None),
    (BETA, "shell", {"command": "ls"}, 20, "approve", "bob"),
    (BETA, "deploy", {}, 600, "deny", "ann"),
    (BETA, "deploy", {}, 1200, "deny", "bob"),
]
#: calls left waiting: (agent, tool, waited seconds)
WAITING = [(ALPHA, "shell", 120), (ALPHA, "deploy", 2 * 3600), (BETA, "shell", 3 * 86400), (BETA, "shell", 30 * 86400)]


def build_history() -> dict[str, Any]:
    users = {name: make_user(name, "nexo_django.decide_toolcall") for name in ("ann", "bob")}
    rule = ApprovalRule.objects.create(agent=BETA, tool="shell", path="ls")
    for n, (agent, tool, args, waited, how, by) in enumerate(HISTORY):
        call = pending_call(agent, tool, args, waited, n)
        user = users.get(by) if by else None
        if how == "approve":
            runs.decide(call, approved=True, by=user, source="admin")
        elif how == "deny":
            runs.decide(call, approved=False, by=user, source="admin")
        elif how == "expire":
            runs.decide(call, approved=False, source="expiry")
        else:
            runs.decide(call, approved=True, source="rule", rule=rule)
    for n, (agent, tool, waited) in enumerate(WAITING):
        pending_call(agent, tool, {"command": "x"} if tool == "shell" else {}, waited, 100 + n)
    return users


def chart_values(html: str, chart: str) -> dict[tuple[str, str], float]:
    """(series, category) -> value, read from the chart's SVG marks."""
    svg = re.search(rf'<svg[^>]*id="{chart}".*?</svg>', html, re.S)
    assert svg, f"no chart {chart}"
    marks = re.findall(r'data-series="([^"]*)" data-category="([^"]*)" data-value="([^"]*)"', svg.group(0))
    return {(s, c): float(v) for s, c, v in marks}


def viewer_client() -> Any:
    return client_for(make_user("vera", "nexo_django.view_decision"))


def within_bucket(shown: float, exact: float) -> bool:
    return abs(math.log(shown / exact)) <= math.log(tally.RATIO) / 2 + 1e-9


def nearest_rank(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


def test_the_dashboard_counts_what_happened() -> None:
    build_history()
    html = viewer_client().get(DASHBOARD).content.decode()
    today = timezone.now().date().isoformat()
    over_time = chart_values(html, "over_time")
    # By hand from HISTORY: approvals by people 5, by rule 1, denials 3, expiries 1.
    assert over_time == {("approved", today): 5, ("approved by rule", today): 1, ("denied", today): 3,
                         ("denied by rule", today): 0, ("expired", today): 1}
    reviewers = chart_values(html, "reviewers")
    assert reviewers == {("approved", "ann"): 3, ("denied", "ann"): 1, ("approved", "bob"): 2, ("denied", "bob"): 2}
    # A person's waits only (no rule's, no expiry's).
    people = [(a, t, w, by) for a, t, _, w, how, by in HISTORY if how in ("approve", "deny")]
    waits_by_tool = chart_values(html, "wait_tool")
    for tool in ("shell", "deploy"):
        exact = [w for _, t, w, _ in people if t == tool]
        assert within_bucket(waits_by_tool[("median", tool)], nearest_rank(exact, 0.5)), (tool, waits_by_tool)
        assert within_bucket(waits_by_tool[("p90", tool)], nearest_rank(exact, 0.9)), (tool, waits_by_tool)
    waits_by_reviewer = chart_values(html, "wait_reviewer")
    ann = [w for *_, w, by in people if by == "ann"]
    assert within_bucket(waits_by_reviewer[("median", "ann")], nearest_rank(ann, 0.5))
    pending = chart_values(html, "pending")
    assert pending == {("calls", "under 10 min"): 1, ("calls", "10 min – 1 h"): 0, ("calls", "1 h – 1 day"): 1,
                       ("calls", "1 – 7 days"): 1, ("calls", "over 7 days"): 1}
    rates = chart_values(html, "rates")
    assert rates[("approved", "shell make test")] == 3 and ("denied", "shell make test") in rates
    assert rates[("denied", "shell make test")] == 0
    assert rates[("denied", "deploy (no target)")] == 2 and rates[("expired", "deploy (no target)")] == 1
    runs_chart = chart_values(html, "runs")
    # Each call had a run of its own, all marked running.
    assert runs_chart == {("runs", "running"): len(HISTORY) + len(WAITING)}
    assert 'id="insight-total" data-value="10"' in html


def test_the_filters_narrow_every_chart_and_the_csv_says_the_same() -> None:
    build_history()
    client = viewer_client()
    html = client.get(DASHBOARD, {"agent": ALPHA, "period": "7d"}).content.decode()
    today = timezone.now().date().isoformat()
    assert chart_values(html, "over_time") == {("approved", today): 4, ("approved by rule", today): 0,
                                               ("denied", today): 1, ("denied by rule", today): 0,
                                               ("expired", today): 1}
    assert sum(chart_values(html, "pending").values()) == 2
    response = client.get(DASHBOARD + "csv/reviewers/", {"agent": ALPHA, "tool": "shell"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert {(r["reviewer"], r["approved"], r["denied"]) for r in rows} == {("ann", "2", "0"), ("bob", "1", "1")}


@pytest.mark.parametrize("query", [{"period": "forever"}, {"agent": "x" * 300}, {"tool": "a\x01b"}])
def test_a_bad_filter_is_refused_with_a_reason(query: dict[str, str]) -> None:
    client = viewer_client()
    response = client.get(DASHBOARD, query)
    assert response.status_code == 400
    assert 'id="insight-error"' in response.content.decode()
    assert client.get(DASHBOARD + "csv/over_time/", query).status_code == 400


def test_nobody_without_the_view_permission_sees_a_number() -> None:
    build_history()
    staff = client_for(make_user("sam"))  # staff, no permission on decisions
    for url in (DASHBOARD, DASHBOARD + "csv/over_time/", DASHBOARD + "suggestions/",
                DASHBOARD + "evidence/?agent=a&tool=b"):
        response = staff.get(url)
        assert response.status_code == 403, url
        assert b"data-value" not in response.content and b"make test" not in response.content
    outsider = client_for(make_user("otto", "nexo_django.view_decision", staff=False))
    response = outsider.get(DASHBOARD)
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_the_decision_log_links_to_the_dashboard_and_the_suggestions() -> None:
    """A new user finds the pages from the admin: the decision log's tools link to both."""
    page = viewer_client().get("/admin/nexo_django/decision/").content.decode()
    for anchor, url in (("insight-dashboard", DASHBOARD), ("insight-suggestions", DASHBOARD + "suggestions/")):
        assert re.search(rf'<a href="{re.escape(url)}" id="{anchor}">', page), anchor


def test_every_page_is_sent_with_a_strict_content_security_policy() -> None:
    client = viewer_client()
    for url in (DASHBOARD, DASHBOARD + "suggestions/", DASHBOARD + "?period=nope"):
        response = client.get(url)
        assert response["Content-Security-Policy"] == "default-src 'self'"
        assert b"<script>" not in response.content.split(b"</header>")[-1]  # no inline script of ours


def test_the_tallies_written_by_each_decision_are_what_a_recount_finds() -> None:
    build_history()

    def everything() -> list[list[tuple[Any, ...]]]:
        # Waits to the second: a decision's row is stamped a moment after decide() counted it.
        return [sorted(tuple(round(v) if isinstance(v, float) else v for v in row)
                       for row in t.model._default_manager.values_list(*t.columns)) for t in tally.TABLES]

    written = everything()
    # Each decision is counted once by day and once by month.
    assert sum(row[8] for row in written[0]) == 2 * len(HISTORY)
    assert tally.rebuild() == len(HISTORY)
    assert everything() == written
    # An installation whose tallies are missing (decisions from before them) counts them again.
    for t in tally.TABLES:
        t.model._default_manager.all().delete()
    out = io.StringIO()
    call_command("nexo_insight", "--rebuild", "--chunk", "3", stdout=out)
    assert out.getvalue() == f"counted {len(HISTORY)} decisions into the approvals dashboard's tallies\n"
    assert everything() == written
    with pytest.raises(CommandError, match="--rebuild counts every decision again"):
        call_command("nexo_insight")


def test_a_long_period_reads_months() -> None:
    build_history()
    html = viewer_client().get(DASHBOARD, {"period": "365d"}).content.decode()
    month = timezone.now().date().replace(day=1).isoformat()
    assert chart_values(html, "over_time")[("approved", month)] == 5
    assert 'id="insight-total" data-value="10"' in html


def test_a_chart_escapes_every_name_it_draws() -> None:
    """The bars are written as text, not through format_html: a tool named like markup is drawn
    as its characters, in the attribute and the title alike."""
    from nexo_django.admin.insight import svg

    hostile = '<img src=x onerror=alert(1)>"\'&'
    drawn = str(svg.bars("c", "t <b>", [{"name": hostile, "n": 3}], "name", [svg.Series("n", "n <i>", "n")], unit="<u>"))
    assert "<img" not in drawn and "<b>" not in drawn and "<i>" not in drawn and "<u>" not in drawn
    assert 'data-category="&lt;img src=x onerror=alert(1)&gt;&quot;&#x27;&amp;"' in drawn
    assert 'data-value="3"' in drawn
