"""Standing rules in the admin: "approve, and always allow" on the decision page, and the rules'
own pages (scripted agents)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, LogEntry

from nexo_django.models import ApprovalRule, Decision, RunEvent, RunStatus, ToolCall
from tests.admin.support import (
    RLO,
    HostileScribe,
    approver,
    client_for,
    csrf_post,
    decision_url,
    page_digest,
    viewer,
)
from tests.durable_agents import Scribe
from tests.lifecycle_agents import Hurried

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

RULES = "/admin/nexo_django/approvalrule/"


def waiting(agent: Any, tmp_path: Path) -> ToolCall:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return agent.run("write a note", cwd=tmp_path).pending_calls().get()


def test_the_decision_page_offers_always_allow_for_the_calls_folder(tmp_path: Path) -> None:
    call = waiting(Hurried, tmp_path)
    html = client_for(approver()).get(decision_url(call)).content.decode()
    assert 'value="approve_always"' in html
    assert 'name="rule_path"' in html and 'value="/notes/*"' in html


def test_approve_always_approves_and_creates_an_audited_rule(tmp_path: Path) -> None:
    ann = approver()
    client = client_for(ann)
    call = waiting(Hurried, tmp_path / "first")
    digest = page_digest(client.get(decision_url(call)).content.decode())
    response = csrf_post(client, decision_url(call), {"action": "approve_always", "digest": digest,
                                                      "rule_path": "/notes/*", "note": "notes are fine"})
    assert response.status_code == 302
    rule = ApprovalRule.objects.get()
    assert (rule.agent, rule.tool, rule.path, rule.verdict, rule.created_by) == (Hurried.path(), "write", "/notes/*",
                                                                                 "approved", ann)
    decision = Decision.objects.get(tool_call=call)
    assert (decision.source, decision.decided_by, decision.rule) == ("admin", ann, None)  # the person's own
    assert LogEntry.objects.filter(object_id=str(rule.pk), action_flag=ADDITION, user=ann).exists()
    assert RunEvent.objects.filter(run_id=call.run_id, type="rule_created", data__rule=rule.pk).exists()
    # The next such call is decided by the rule, with nobody asked.
    (tmp_path / "second").mkdir()
    second = Hurried.run("again", cwd=tmp_path / "second")
    assert second.status == RunStatus.DONE
    assert Decision.objects.get(tool_call__run=second).rule == rule
    listing = client.get(RULES).content.decode()
    assert "/notes/*" in listing and "ann" in listing
    assert '<td class="field-decided">1</td>' in listing


def test_always_allow_refuses_a_pattern_that_is_not_rooted(tmp_path: Path) -> None:
    call = waiting(Scribe, tmp_path)
    client = client_for(approver())
    digest = page_digest(client.get(decision_url(call)).content.decode())
    response = csrf_post(client, decision_url(call), {"action": "approve_always", "digest": digest, "rule_path": "notes.txt"})
    assert response.status_code == 302 and response["Location"] == decision_url(call)
    assert not ApprovalRule.objects.exists() and not Decision.objects.exists()


def test_a_rule_added_in_the_admin_records_who_made_it() -> None:
    ann = approver()
    client = client_for(ann)
    response = csrf_post(client, RULES + "add/", {"agent": "", "tool": "write", "path": "/docs/*", "verdict": "approved",
                                                  "enabled": "on", "note": "docs"})
    assert response.status_code == 302
    assert ApprovalRule.objects.get().created_by == ann


def test_a_shell_rule_must_name_the_whole_command() -> None:
    response = csrf_post(client_for(approver()), RULES + "add/", {"tool": "shell", "path": "", "verdict": "approved",
                                                                  "enabled": "on"})
    assert response.status_code == 200 and "names the whole command" in response.content.decode()
    assert not ApprovalRule.objects.exists()


def test_only_deciders_make_rules() -> None:
    client = client_for(viewer())
    assert client.get(RULES).status_code == 200  # staff may look
    response = csrf_post(client, RULES + "add/", {"tool": "write", "verdict": "approved", "enabled": "on"})
    assert response.status_code == 403
    assert not ApprovalRule.objects.exists()


def test_a_rule_that_decided_calls_is_kept(tmp_path: Path) -> None:
    rule = ApprovalRule.objects.create(tool="write")
    Scribe.run("write hi", cwd=tmp_path)
    response = csrf_post(client_for(approver()), f"{RULES}{rule.pk}/delete/", {"post": "yes"})
    assert response.status_code == 200 and "Cannot delete approval rule" in response.content.decode()
    assert ApprovalRule.objects.filter(pk=rule.pk).exists()


def test_always_allow_is_not_offered_for_a_path_with_hidden_characters(tmp_path: Path) -> None:
    call = waiting(HostileScribe, tmp_path)
    html = client_for(approver()).get(decision_url(call)).content.decode()
    assert 'id="always-allow-refused"' in html and 'value="approve_always"' not in html
    assert RLO not in html
