"""Standing rules: who wrote them and what they said (issue 32, items 2 and 3). Whoever changed a
rule is one of its authors (four eyes excludes them too); every change is recorded; a decision by
a rule keeps what the rule said. A path the gate cannot normalise is decided by no rule, and deny
wins on the normalised path. Scripted agents, inline queue."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest

from nexo_django.durable import rule_history
from nexo_django.models import ApprovalRule, ApprovalRuleChange, CallStatus, Decision, RunStatus
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.admin.support import DECISIONS, client_for, csrf_post, make_user
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

RULES = "/admin/nexo_django/approvalrule/"


def _edit(client: Any, rule: ApprovalRule, **changes: Any) -> None:
    data = {"agent": rule.agent, "tool": rule.tool, "path": rule.path, "verdict": rule.verdict,
            "enabled": "on" if rule.enabled else "", "expires_at": "", "note": rule.note, **changes}
    data = {k: v for k, v in data.items() if v != "" or k in ("path", "agent", "note", "expires_at")}
    response = csrf_post(client, f"{RULES}{rule.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:2000]


def test_the_requester_who_widened_a_rule_is_not_approved_by_it_scripted(tmp_path: Path, settings: Any) -> None:
    settings.NEXO = {"SELF_APPROVAL": False}
    ann = make_user("ann", "nexo_django.decide_toolcall")
    rick = make_user("rick", "nexo_django.decide_toolcall")  # an approver who also starts runs
    rule = ApprovalRule.objects.create(tool="write", path="/harmless/*", created_by=ann)
    _edit(client_for(rick), rule, path="/*")
    rule.refresh_from_db()
    assert rule.path == "/*" and rule.changed_by == rick
    run = Scribe.run("write hi", cwd=tmp_path, user=rick)
    assert run.status == RunStatus.SUSPENDED and not Decision.objects.exists()  # a person decides
    assert not (tmp_path / "notes.txt").exists()
    # Someone else saving it afterwards does not launder it: rick changed it once, rick stays an author.
    _edit(client_for(ann), rule, note="looked at it")
    rule.refresh_from_db()
    assert rule.changed_by == ann
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    assert Scribe.run("write hi", cwd=tmp_path / "b", user=rick).status == RunStatus.SUSPENDED
    # Another person's run is approved by it, as before.
    assert Scribe.run("write hi", cwd=tmp_path / "c", user=make_user("carl")).status == RunStatus.DONE


def test_every_change_of_a_rule_is_recorded_with_who_when_before_and_after(tmp_path: Path) -> None:
    ann = make_user("ann", "nexo_django.decide_toolcall")
    bob = make_user("bob", "nexo_django.decide_toolcall")
    client = client_for(ann)
    response = csrf_post(client, f"{RULES}add/", {"agent": "", "tool": "write", "path": "/notes/*",
                                                   "verdict": "approved", "enabled": "on", "note": ""})
    assert response.status_code == 302
    rule = ApprovalRule.objects.get()
    _edit(client_for(bob), rule, path="/*")
    _edit(client_for(bob), ApprovalRule.objects.get(), path="/*")  # saved unchanged: nothing to record
    rule.refresh_from_db()
    _edit(client_for(ann), rule, enabled="")
    created, widened, disabled = ApprovalRuleChange.objects.filter(rule_pk=rule.pk).order_by("id")
    assert (created.action, created.changed_by, created.before, created.after["path"]) == ("created", ann, None, "/notes/*")
    assert (widened.action, widened.changed_by) == ("changed", bob)
    assert (widened.before["path"], widened.after["path"]) == ("/notes/*", "/*")
    assert (disabled.changed_by, disabled.before["enabled"], disabled.after["enabled"]) == (ann, True, False)
    assert widened.changed_at <= disabled.changed_at
    page = client.get(f"{RULES}{rule.pk}/change/").content.decode()
    assert "changed by bob" in page and "/notes/*" in page
    csrf_post(client, f"{RULES}{rule.pk}/delete/", {"post": "yes"})
    deleted = ApprovalRuleChange.objects.filter(rule_pk=rule.pk).last()
    assert deleted is not None and (deleted.action, deleted.changed_by, deleted.after) == ("deleted", ann, None)


def test_a_decision_by_rule_keeps_what_the_rule_said_after_it_is_edited_scripted(tmp_path: Path) -> None:
    ann = make_user("ann", "nexo_django.decide_toolcall")
    rule = ApprovalRule.objects.create(tool="write", path="/notes.txt", created_by=ann, note="release notes")
    run = Scribe.run("write hi", cwd=tmp_path)
    assert run.status == RunStatus.DONE
    _edit(client_for(ann), rule, path="/*", enabled="")
    decision = Decision.objects.get()
    assert decision.rule_said is not None
    assert {k: decision.rule_said[k] for k in ("id", "tool", "path", "verdict")} == {
        "id": rule.pk, "tool": "write", "path": "/notes.txt", "verdict": "approved"}
    client = client_for(ann)
    text = b"".join(client.get(f"{DECISIONS}export/csv/").streaming_content).decode()
    [row] = csv.DictReader(io.StringIO(text))
    assert '"path": "/notes.txt"' in row["rule_said"] and row["outcome"] == "ran_ok"
    log = client.get(DECISIONS).content.decode()
    assert rule_history.describe(decision.rule_said) in log  # "approved write /notes.txt for any agent (rule #1)"


# --- item 3: no rule decides what the gate cannot normalise ---------------------------------------


@pytest.mark.parametrize("path", ["x/../secret/key", "/secret/key", "~/secret/key", "secret/key\x00.txt", "secret/"])
def test_a_path_the_gate_cannot_normalise_goes_to_a_person_scripted(path: str, tmp_path: Path) -> None:
    ApprovalRule.objects.create(tool="write", path="")  # any path: allow
    ApprovalRule.objects.create(tool="write", path="/secret/*", verdict="denied")
    model = ScriptedModel([tool_call("write", path=path, content="owned"), reply("Done.")])
    run = Scribe.run("write", cwd=tmp_path, model=model)
    [call] = run.pending_calls()
    assert call.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()
    assert run.status == RunStatus.SUSPENDED


@pytest.mark.parametrize("path", ["secret/key", "./secret//key", "secret/./key"])
def test_deny_wins_on_the_normalised_path_scripted(path: str, tmp_path: Path) -> None:
    ApprovalRule.objects.create(tool="write", path="")
    ApprovalRule.objects.create(tool="write", path="/*")
    ApprovalRule.objects.create(tool="write", path="/secret/*", verdict="denied")
    model = ScriptedModel([tool_call("write", path=path, content="owned"), reply("Done.")])
    run = Scribe.run("write", cwd=tmp_path, model=model)
    decision = Decision.objects.get()
    assert decision.verdict == "denied" and decision.rule_said["path"] == "/secret/*"
    assert run.status == RunStatus.DONE and not (tmp_path / "secret" / "key").exists()
