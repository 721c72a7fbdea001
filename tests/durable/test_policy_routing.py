"""Approval policies route a call to its groups: only their members decide it, by what held when it
suspended (scripted agents, both databases)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext

from nexo_django.durable.policy import matching
from nexo_django.durable.policy.check import PolicyRefusal
from nexo_django.models import ApprovalPolicyChange, CallStatus, RunStatus, ToolCall
from tests.admin.support import client_for, decision_url
from tests.durable.policy_support import member, nothing_decided, policy, waiting_call
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


@pytest.fixture
def ops() -> Group:
    return Group.objects.create(name="ops")


@pytest.fixture
def people(ops: Group) -> dict[str, Any]:
    return {"ann": member("ann", ops), "bob": member("bob"), "carol": member("carol", ops)}


def test_the_database_stamps_each_call_with_the_policies_version(tmp_path: Path, people: dict[str, Any],
                                                                ops: Group) -> None:
    before = waiting_call(tmp_path / "a")
    assert before.policy_version == 0  # no policy was ever written: nothing to look up
    policy(people["carol"], approvers=[ops])
    after = waiting_call(tmp_path / "b")
    assert after.policy_version == ApprovalPolicyChange.objects.latest("id").pk


def test_the_trigger_is_in_place() -> None:
    """SQLite drops a table's triggers when a later migration rebuilds it: this says so."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'nexo_django_toolcall'")
        else:
            cursor.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = 'nexo_django_toolcall'::regclass "
                           "AND NOT tgisinternal")
        assert [r[0] for r in cursor.fetchall()] == ["nexo_call_policy_version"]


def test_a_non_member_is_refused_and_nothing_is_decided(tmp_path: Path, people: dict[str, Any], ops: Group) -> None:
    policy(people["carol"], approvers=[ops])
    call = waiting_call(tmp_path)
    with pytest.raises(PolicyRefusal, match=r"^bob is not in ops, the approvers of policy “Notes” that routes this "
                                            r"call; ask a member of ops$"):
        call.approve(by=people["bob"])
    nothing_decided(call)
    call.approve(by=people["ann"])
    call.refresh_from_db()
    assert call.status in (CallStatus.APPROVED, CallStatus.SUCCEEDED)
    assert call.run.__class__.objects.get(pk=call.run_id).status == RunStatus.DONE


def test_nobody_decides_under_a_policy_they_changed(tmp_path: Path, people: dict[str, Any], ops: Group) -> None:
    policy(people["carol"], approvers=[ops])  # carol is in ops, and wrote the policy
    call = waiting_call(tmp_path)
    with pytest.raises(PolicyRefusal, match="carol created or changed approval policy “Notes”, so they cannot decide"):
        call.deny(by=people["carol"])
    nothing_decided(call)


def test_a_call_needs_a_person_under_a_policy(tmp_path: Path, people: dict[str, Any], ops: Group) -> None:
    policy(people["carol"], approvers=[ops])
    call = waiting_call(tmp_path)
    with pytest.raises(PolicyRefusal, match=r"a member of ops decides it, so pass by=<that person>"):
        call.approve()
    nothing_decided(call)


def test_a_call_no_policy_matches_keeps_todays_behaviour(tmp_path: Path, people: dict[str, Any], ops: Group) -> None:
    policy(people["carol"], approvers=[ops], target="/deploy/*")
    call = waiting_call(tmp_path)
    call.approve(by=people["bob"])
    call.refresh_from_db()
    assert call.policy_said is None and call.status != CallStatus.PENDING_APPROVAL


def test_a_policy_deleted_while_a_call_waits_still_routes_it(tmp_path: Path, people: dict[str, Any],
                                                            ops: Group) -> None:
    found = policy(people["carol"], approvers=[ops])
    call = waiting_call(tmp_path)
    found.delete()
    with pytest.raises(PolicyRefusal, match="bob is not in ops"):
        call.approve(by=people["bob"])
    nothing_decided(call)
    call.approve(by=people["ann"])
    call.refresh_from_db()
    assert call.status != CallStatus.PENDING_APPROVAL
    assert call.policy_said["name"] == "Notes"


def test_a_policy_widened_while_a_call_waits_does_not_let_others_decide_it(
        tmp_path: Path, people: dict[str, Any], ops: Group) -> None:
    found = policy(people["carol"], approvers=[ops])
    call = waiting_call(tmp_path)
    found.approvers.add(Group.objects.create(name="everyone"))
    people["bob"].groups.add(Group.objects.get(name="everyone"))
    with pytest.raises(PolicyRefusal, match="bob is not in ops"):
        call.approve(by=people["bob"])
    nothing_decided(call)


def test_a_policy_made_after_a_call_suspended_does_not_route_it(tmp_path: Path, people: dict[str, Any],
                                                               ops: Group) -> None:
    call = waiting_call(tmp_path)
    policy(people["carol"], approvers=[ops])
    call.approve(by=people["bob"])
    call.refresh_from_db()
    assert call.status != CallStatus.PENDING_APPROVAL


def test_a_path_the_gate_cannot_normalise_is_routed_by_no_policy(tmp_path: Path, people: dict[str, Any],
                                                                ops: Group) -> None:
    any_path = matching.said(policy(people["carol"], approvers=[ops], target=""))
    call = ToolCall(name="write", capability="write", args={"path": "a/../../secret"})
    assert matching.target_of(call) is None
    assert matching.choose([any_path], call, "x") is None
    assert matching.choose([any_path], ToolCall(name="write", capability="write", args={"path": "a/./b"}), "x")


def test_the_page_says_a_policy_was_deleted_since_and_who_decides(tmp_path: Path, people: dict[str, Any],
                                                                 ops: Group) -> None:
    found = policy(people["carol"], approvers=[ops])
    call = waiting_call(tmp_path)
    found.delete()
    page = html.unescape(client_for(people["bob"]).get(decision_url(call)).content.decode())
    assert "Decided by ops (approval policy “Notes”)" in page
    assert ("Approval policy “Notes” was deleted after this call suspended; it is decided by what the policy "
            "said then." in page)
    assert "You cannot decide it: bob is not in ops" in page


def _decision_statements(call: ToolCall, user: Any) -> int:
    with CaptureQueriesContext(connection) as ctx:
        call.approve(by=user)
    return len(ctx.captured_queries)


def test_statements_of_a_decision_without_and_with_policies(tmp_path: Path, people: dict[str, Any],
                                                           ops: Group) -> None:
    """No policy: what test_run_queries.py pins. Policies: a few more, for the routed call only."""
    _decision_statements(waiting_call(tmp_path / "warm"), people["ann"])  # the statements prepared
    bare = _decision_statements(waiting_call(tmp_path / "bare"), people["ann"])
    policy(people["carol"], approvers=[ops], target="/deploy/*")
    unmatched = _decision_statements(waiting_call(tmp_path / "unmatched"), people["ann"])
    policy(people["carol"], approvers=[ops], name="All notes", order=1)
    routed = _decision_statements(waiting_call(tmp_path / "routed"), people["ann"])
    # Worked out once per call: the policies at its version (a SELECT), kept on it (an UPDATE);
    # and for a routed call, "did ann change it", "is ann in ops" and her permissions (two: the
    # admin and the channels have read them already on the same user; Python reads them here).
    assert (unmatched - bare, routed - bare) == (2, 6)


def test_a_standing_rule_does_not_approve_a_routed_call(tmp_path: Path, people: dict[str, Any], ops: Group) -> None:
    from nexo_django.models import ApprovalRule, Decision

    policy(people["carol"], approvers=[ops])
    ApprovalRule.objects.create(agent="", tool="write", path="/notes*", created_by=people["bob"])
    call = waiting_call(tmp_path)  # the rule matched, and left it to ops
    nothing_decided(call)
    ApprovalRule.objects.update(verdict="denied")  # a denial by rule stands
    (tmp_path / "b").mkdir()
    run = Scribe.run("write hi", cwd=tmp_path / "b")
    assert Decision.objects.get(tool_call__run=run).source == "rule"
