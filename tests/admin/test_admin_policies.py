"""The admin of approval policies: refused with the reason when they could not work, nothing saved;
every change recorded with who made it."""

from __future__ import annotations

import html
from typing import Any

import pytest
from django.contrib.auth.models import Group

from nexo_django.models import ApprovalPolicy, ApprovalPolicyChange
from tests.admin.support import client_for, csrf_post, make_user
from tests.durable.policy_support import member

pytestmark = pytest.mark.django_db

ADD = "/admin/nexo_django/approvalpolicy/add/"


@pytest.fixture
def ops() -> Group:
    group = Group.objects.create(name="ops")
    member("olga", group)
    member("otto", group)
    return group


@pytest.fixture
def carol() -> Any:
    return make_user("carol", "nexo_django.decide_toolcall")


def form(ops: Group, **change: Any) -> dict[str, Any]:
    data = {"name": "Deploys", "order": "10", "enabled": "on", "agent": "", "capability": "write", "tool": "",
            "target": "/deploy/*", "approvers": [ops.pk], "quorum": "2", "escalate_after": "",
            "escalation_groups": [], "reviewer": ""}
    data.update(change)
    return {k: v for k, v in data.items() if v is not None}


def refused(carol: Any, data: dict[str, Any]) -> str:
    response = csrf_post(client_for(carol), ADD, data)
    assert response.status_code == 200  # the form again, with its errors
    assert not ApprovalPolicy.objects.exists() and not ApprovalPolicyChange.objects.exists()
    errors = html.unescape(response.content.decode())
    return errors


def test_a_valid_policy_is_saved_and_its_author_recorded(carol: Any, ops: Group) -> None:
    response = csrf_post(client_for(carol), ADD, form(ops))
    assert response.status_code == 302, response.content.decode()[:3000]
    saved = ApprovalPolicy.objects.get()
    assert list(saved.approvers.all()) == [ops] and saved.created_by == carol
    last = ApprovalPolicyChange.objects.latest("id")
    assert last.changed_by == carol and last.after["approvers"] == [ops.pk] and last.after["quorum"] == 2


def test_a_policy_with_no_group_is_refused(carol: Any, ops: Group) -> None:
    assert ("Choose at least one approver group: the policy routes the calls it matches to the people in it."
            in refused(carol, form(ops, approvers=[])))


def test_a_quorum_larger_than_the_group_is_refused(carol: Any, ops: Group) -> None:
    assert ("The quorum is 3 but ops has 2 active members who could approve (the policy's authors never do): "
            "lower the quorum or add people to the group." in refused(carol, form(ops, quorum="3")))


def test_the_saver_does_not_count_towards_the_quorum(carol: Any, ops: Group) -> None:
    carol.groups.add(ops)
    assert "The quorum is 3 but ops has 2 active members" in refused(carol, form(ops, quorum="3"))


@pytest.mark.parametrize(("capability", "target", "says"), [
    ("write", "deploy/*", "Paths are matched /-rooted, as the gate normalises them: write /deploy/* (or a pattern like /deploy/*)."),
    ("write", "/deploy/../etc/*", "The gate normalises every path (no '.', '..' or '//' is left in it), so this pattern could never match"),
    ("fetch", "https://api.example.com/x", "A fetch policy matches the URL's host only"),
    ("mcp", "github", "An MCP policy matches 'server: tool'"),
    ("glob", "*.py", "glob calls name no target to match; leave it empty."),
    ("", "/deploy/*", "A target is matched against what one kind of call acts on: choose a capability"),
])
def test_a_target_the_gate_cannot_match_is_refused(carol: Any, ops: Group, capability: str, target: str,
                                                   says: str) -> None:
    assert says in refused(carol, form(ops, capability=capability, target=target, quorum="1"))


def test_half_an_escalation_is_refused(carol: Any, ops: Group) -> None:
    assert ("An escalation needs both a delay and at least one escalation group; give both, or neither."
            in refused(carol, form(ops, escalate_after="00:10:00", quorum="1")))


def test_a_reviewer_that_does_not_import_is_refused(carol: Any, ops: Group) -> None:
    assert "The reviewer nowhere.Reviewer does not import" in refused(carol, form(ops, reviewer="nowhere.Reviewer",
                                                                                   quorum="1"))


def test_someone_without_the_decide_permission_cannot_add_a_policy(ops: Group) -> None:
    viewer = make_user("vic")
    assert csrf_post(client_for(viewer), ADD, form(ops)).status_code == 403
    assert not ApprovalPolicy.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_mine_to_decide_leaves_out_own_runs_and_calls_of_a_policy_one_changed(
        ops: Group, tmp_path: Any, settings: Any) -> None:
    from tests.admin.support import INBOX
    from tests.durable.policy_support import policy, waiting_call

    settings.NEXO = {"SELF_APPROVAL": False}
    olga = ops.user_set.get(username="olga")
    otto = ops.user_set.get(username="otto")
    policy(otto, approvers=[ops])  # otto wrote it: never decides under it
    routed = waiting_call(tmp_path / "a")
    own = waiting_call(tmp_path / "b", user=olga)
    page = client_for(olga).get(INBOX, {"decide": "mine"}).content.decode()
    assert f"/{routed.pk}/change/" in page and f"/{own.pk}/change/" not in page
    page = client_for(otto).get(INBOX, {"decide": "mine"}).content.decode()
    assert f"/{routed.pk}/change/" not in page and f"/{own.pk}/change/" not in page
