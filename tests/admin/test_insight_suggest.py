"""Suggested rules: never wider than their evidence (seeded random histories with denials and
expiries mixed in, checked with the gate's own matching), and accepted or dismissed only by a
person with the decide permission, through the audited path of any rule change."""

from __future__ import annotations

import random
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.utils import timezone

from nexo_django.durable import rule_history, rules, runs
from nexo_django.durable.insight import suggest, tally
from nexo_django.models import (
    ApprovalRule,
    ApprovalRuleChange,
    DismissedSuggestion,
    ToolCall,
)
from tests.admin.support import client_for, csrf_post, make_user
from tests.admin.test_insight_dashboard import pending_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SUGGESTIONS = "/admin/nexo_django/decision/insight/suggestions/"
AGENTS = ("tests.insight.Alpha", "tests.insight.Beta")
PIECES = ("docs", "doc", "d[1]", "a*", "q?", "notes", "sub", "x.md", "y.md", "../up", "", "z")
COMMANDS = ("make test", "make", "ls", "ls -la", "rm -rf /")


def random_history(rng: random.Random) -> list[tuple[str, ToolCall, str, str, int]]:
    """(agent, unsaved call, outcome, source, reviewer) of a few dozen decisions."""
    history = []
    for _ in range(rng.randint(3, 40)):
        agent = rng.choice(AGENTS)
        tool = rng.choice(("write", "write", "read", "shell", "deploy"))
        if tool in ("write", "read"):
            args: dict[str, Any] = {"path": "/".join(rng.choice(PIECES) for _ in range(rng.randint(1, 3)))}
        elif tool == "shell":
            args = {"command": rng.choice(COMMANDS)}
        else:
            args = {}
        outcome = rng.choices(("approved", "denied", "expired"), weights=(7, 2, 1))[0]
        source = "expiry" if outcome == "expired" else rng.choices(("admin", "rule"), weights=(9, 1))[0]
        call = ToolCall(agent=agent, name=tool, capability=tool, args=args, created_at=timezone.now())
        history.append((agent, call, outcome, source, rng.randint(1, 3)))
    return history


def test_a_suggestion_is_never_wider_than_its_evidence() -> None:
    rng = random.Random(50)
    now = timezone.now()
    made = 0
    for case in range(200):
        for table in tally.TABLES:
            table.model._default_manager.all().delete()
        history = random_history(rng)
        merged = tally.Merged()
        for _, call, outcome, source, reviewer in history:
            merged.add(tally.rows_of(call, verdict="denied" if outcome != "approved" else "approved", source=source,
                                     reviewer=reviewer, rule=None, at=now))
        tally.write(merged.result())
        for s in suggest.suggestions():
            made += 1
            rule = ApprovalRule(agent=s.agent, tool=s.tool, path=s.path, enabled=True)
            rules.validate(s.tool, rules.capability_of(s.tool), s.path)  # a rule the admin accepts
            covered = 0
            for agent, call, outcome, source, _ in history:
                if agent != s.agent or call.name != s.tool:
                    continue
                hit = rules.decidable(call) and rules.matches(rule, call, agent, now)
                if outcome != "approved":
                    assert not hit, (case, s, call.args, outcome)  # never matches a denied or expired target
                elif source != "rule":
                    covered += hit
            # Every approval it was made of is covered (its group's, and maybe others it also matches).
            assert covered >= s.approved >= suggest.MIN_APPROVALS, (case, s)
    assert made > 20  # the histories do support suggestions: the check above is not vacuous


def three_approvals() -> dict[str, Any]:
    users = {n: make_user(n, "nexo_django.decide_toolcall") for n in ("ann", "bob", "carl")}
    for n, by in enumerate(("ann", "bob", "ann")):
        call = pending_call(AGENTS[0], "shell", {"command": "make test"}, 60 * (n + 1), n)
        runs.decide(call, approved=True, by=users[by], source="admin")
    return users


def test_the_page_shows_a_suggestion_with_its_evidence_and_accepting_it_is_an_audited_rule_change() -> None:
    users = three_approvals()
    client = client_for(users["carl"])
    html = client.get(SUGGESTIONS).content.decode()
    assert 'data-path="make test" data-approved="3" data-reviewers="2"' in html
    evidence = client.get("/admin/nexo_django/decision/insight/evidence/",
                          {"agent": AGENTS[0], "tool": "shell", "path": "make test"}).content.decode()
    assert '<span id="evidence-approved">3</span>' in evidence
    assert ApprovalRule.objects.count() == 0  # nothing applied by itself
    response = csrf_post(client, SUGGESTIONS, {"agent": AGENTS[0], "tool": "shell", "path": "make test",
                                               "action": "accept"})
    assert response.status_code == 302
    rule = ApprovalRule.objects.get()
    assert (rule.agent, rule.tool, rule.path, rule.verdict, rule.created_by) == (AGENTS[0], "shell", "make test",
                                                                                 "approved", users["carl"])
    change = ApprovalRuleChange.objects.get(rule_pk=rule.pk)
    assert (change.action, change.changed_by) == ("created", users["carl"])
    assert rule_history.authored_by(users["carl"].pk, [rule.pk]) == {rule.pk}  # four eyes: carl's runs are not its
    assert LogEntry.objects.filter(object_id=str(rule.pk), action_flag=ADDITION, user=users["carl"]).exists()
    assert 'data-path="make test"' not in client.get(SUGGESTIONS).content.decode()


def test_dismissing_is_recorded_and_only_the_decide_permission_may_accept_or_dismiss() -> None:
    users = three_approvals()
    viewer = client_for(make_user("vera", "nexo_django.view_decision"))
    for action in ("accept", "dismiss"):
        response = csrf_post(viewer, SUGGESTIONS, {"agent": AGENTS[0], "tool": "shell", "path": "make test",
                                                   "action": action})
        assert response.status_code == 403
    assert not ApprovalRule.objects.exists() and not DismissedSuggestion.objects.exists()
    client = client_for(users["bob"])
    # A rule the history does not support is not created, whatever the form says.
    csrf_post(client, SUGGESTIONS, {"agent": AGENTS[0], "tool": "shell", "path": "make", "action": "accept"})
    csrf_post(client, SUGGESTIONS, {"agent": "", "tool": "shell", "path": "make test", "action": "accept"})
    assert not ApprovalRule.objects.exists()
    response = csrf_post(client, SUGGESTIONS, {"agent": AGENTS[0], "tool": "shell", "path": "make test",
                                               "action": "dismiss"})
    assert response.status_code == 302
    dismissed = DismissedSuggestion.objects.get()
    assert (dismissed.agent, dismissed.tool, dismissed.path, dismissed.dismissed_by) == (AGENTS[0], "shell",
                                                                                         "make test", users["bob"])
    assert 'id="no-suggestions"' in client.get(SUGGESTIONS).content.decode()
    assert not ApprovalRule.objects.exists()
