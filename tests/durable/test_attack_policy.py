"""Attacks on approval policies (issue 48): the wrong person, quorum tricks, escalation clocks,
hostile and broken reviewer agents, the policy admin. Each attack checks that the outside world is
untouched: the call not run, no file written, no decision recorded, one clear sentence (scripted
agents and reviewers, both databases)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import OperationalError, connections
from django.utils import timezone

from nexo_django.core.errors import (
    AlreadyDecided,
    ApprovalExpired,
    InvalidEditedArguments,
    StaleDecision,
)
from nexo_django.durable.policy import check, matching, reviewer
from nexo_django.durable.policy.check import PolicyRefusal
from nexo_django.durable.recovery import reconcile
from nexo_django.models import (
    AgentRun,
    Approval,
    ApprovalPolicy,
    CallStatus,
    Decision,
    RunEvent,
    RunStatus,
    ToolCall,
)
from tests.admin.support import client_for, csrf_post, decision_url, make_user
from tests.durable.every_path import page_form
from tests.durable.policy_support import member, nothing_decided, policy, waiting_call
from tests.durable_agents import Bumper

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

POLICIES = "/admin/nexo_django/approvalpolicy/"
DELAY = timedelta(minutes=30)


@pytest.fixture(autouse=True)
def _urls(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.durable.every_path"


@pytest.fixture
def ops() -> Group:
    return Group.objects.create(name="ops")


@pytest.fixture
def people(ops: Group) -> dict[str, Any]:
    found = {name: member(name, ops) for name in ("olga", "otto", "uma")}
    found["bob"] = member("bob")
    found["carol"] = member("carol")
    return found


def bumping(user: Any = None) -> ToolCall:
    run = Bumper.run("bump", user=user)
    return ToolCall.objects.select_related("run").get(run=run, status=CallStatus.PENDING_APPROVAL)


def bump_policy(people: dict[str, Any], ops: Group, **fields: Any) -> ApprovalPolicy:
    return policy(people["carol"], approvers=[ops], capability="", tool="bump", target="", **fields)


def nothing_ran(call: ToolCall, counter: Path) -> None:
    nothing_decided(call)
    assert not counter.exists()


# --- the wrong person ----------------------------------------------------------------------------


def test_an_inactive_member_is_refused(people: dict[str, Any], ops: Group, counter: Path) -> None:
    bump_policy(people, ops)
    call = bumping()
    people["olga"].is_active = False
    people["olga"].save()
    with pytest.raises(PolicyRefusal, match=r"^olga's account is inactive"):
        call.approve(by=people["olga"])
    nothing_ran(call, counter)


def test_a_member_without_the_decide_permission_is_refused_in_python(ops: Group, people: dict[str, Any],
                                                                   counter: Path) -> None:
    bump_policy(people, ops)
    stan = make_user("stan")  # staff, in ops, without nexo_django.decide_toolcall
    stan.groups.add(ops)
    call = bumping()
    with pytest.raises(PolicyRefusal, match=r"^stan may not decide calls \(needs nexo_django.decide_toolcall\)"):
        call.approve(by=stan)
    nothing_ran(call, counter)
    # The admin page: 403, nothing decided.
    client = client_for(stan)
    assert csrf_post(client, decision_url(call), {"action": "approve", "digest": call.digest}).status_code == 403
    nothing_ran(call, counter)


def test_a_member_removed_while_the_call_waits_is_refused(people: dict[str, Any], ops: Group, counter: Path) -> None:
    bump_policy(people, ops)
    call = bumping()
    people["olga"].groups.remove(ops)
    with pytest.raises(PolicyRefusal, match="^olga is not in ops"):
        call.approve(by=people["olga"])
    client = client_for(people["olga"])
    response = csrf_post(client, decision_url(call), page_form(client, decision_url(call)))
    assert "Nothing changed: olga is not in ops" in client.get(response["Location"]).content.decode()
    nothing_ran(call, counter)


def test_a_user_added_to_the_group_after_the_call_suspended_may_decide(people: dict[str, Any], ops: Group,
                                                                      counter: Path) -> None:
    """The docs: the policy's groups are kept as they were, the people in them are whoever is in them now."""
    bump_policy(people, ops)
    call = bumping()
    with pytest.raises(PolicyRefusal, match="^bob is not in ops"):
        call.approve(by=people["bob"])
    people["bob"].groups.add(ops)
    assert isinstance(call.approve(by=people["bob"]), Decision)
    assert counter.read_text().split() == ["one"]


def test_the_requester_is_refused_under_a_policy(people: dict[str, Any], ops: Group, settings: Any,
                                                 counter: Path) -> None:
    settings.NEXO = {"SELF_APPROVAL": False}
    bump_policy(people, ops)
    call = bumping(user=people["olga"])
    with pytest.raises(Exception, match="^olga started this run and cannot decide its calls"):
        call.deny(by=people["olga"])
    nothing_ran(call, counter)


@pytest.mark.parametrize(("by", "approved", "source"), [
    ("bob", True, "expiry"), (None, True, "expiry"), ("bob", False, "expiry"),
    ("bob", True, "rule"), ("bob", False, "rule"), (None, False, "rule"),
])
def test_a_built_in_source_does_not_let_anyone_past_the_policy(people: dict[str, Any], ops: Group, counter: Path,
                                                              by: str | None, approved: bool, source: str) -> None:
    """``source="expiry"`` and ``"rule"`` are the reconciler's and a standing rule's, never a way
    round the check for a person (or nobody) calling ``approve()``/``deny()`` with them."""
    bump_policy(people, ops)
    call = bumping()
    decide = call.approve if approved else call.deny
    with pytest.raises(PolicyRefusal):
        decide(by=people[by] if by else None, source=source)
    nothing_ran(call, counter)


def test_a_member_who_changes_the_policy_while_the_call_waits_is_refused(people: dict[str, Any], ops: Group,
                                                                          counter: Path) -> None:
    found = bump_policy(people, ops)
    call = bumping()
    found.name, found.changed_by = "Bumps", people["olga"]
    found.save()
    with pytest.raises(PolicyRefusal, match="^olga created or changed approval policy “Notes”"):
        call.approve(by=people["olga"])
    nothing_ran(call, counter)


# --- quorum --------------------------------------------------------------------------------------


def test_an_approval_by_a_member_removed_since_does_not_count(people: dict[str, Any], ops: Group,
                                                             counter: Path) -> None:
    bump_policy(people, ops, quorum=2)
    call = bumping()
    call.approve(by=people["olga"])
    people["olga"].groups.remove(ops)  # olga leaves the team: her approval no longer speaks for ops
    got = call.approve(by=people["otto"])
    assert isinstance(got, Approval), "otto's approval alone reached a quorum of 2"
    nothing_ran(call, counter)
    assert "1 of 2 approved, by otto (no longer counted: olga)" in check.note(call, timezone.now())
    call.approve(by=people["uma"])
    assert counter.read_text().split() == ["one"]


def test_an_approval_by_a_member_deactivated_since_does_not_count(people: dict[str, Any], ops: Group,
                                                                 counter: Path) -> None:
    bump_policy(people, ops, quorum=2)
    call = bumping()
    call.approve(by=people["olga"])
    people["olga"].is_active = False
    people["olga"].save()
    assert isinstance(call.approve(by=people["otto"]), Approval)
    nothing_ran(call, counter)


def test_an_approver_who_then_changes_the_policy_no_longer_counts(people: dict[str, Any], ops: Group,
                                                                  counter: Path) -> None:
    found = bump_policy(people, ops, quorum=2)
    call = bumping()
    call.approve(by=people["olga"])
    found.order, found.changed_by = 5, people["olga"]  # now one of its authors
    found.save()
    assert isinstance(call.approve(by=people["otto"]), Approval)
    nothing_ran(call, counter)


def test_the_same_person_from_two_browsers_counts_once(people: dict[str, Any], ops: Group, counter: Path) -> None:
    bump_policy(people, ops, quorum=2)
    call = bumping()
    first, second = client_for(people["olga"]), client_for(people["olga"])
    forms = [page_form(first, decision_url(call)), page_form(second, decision_url(call))]
    csrf_post(first, decision_url(call), forms[0])
    response = csrf_post(second, decision_url(call), forms[1])
    page = second.get(response["Location"]).content.decode()
    assert "olga already approved bump call" in page and "it needs 1 more approval by others" in page
    assert Approval.objects.count() == 1
    nothing_ran(call, counter)


def test_the_same_person_on_slack_then_the_admin_counts_once(people: dict[str, Any], ops: Group, settings: Any,
                                                             counter: Path) -> None:
    from tests.channels.test_slack import click
    from tests.durable.every_path import approver, every_channel

    channels = every_channel(settings)
    slack, _hook = next(channels)
    try:
        ann = approver()  # Slack's U1
        ann.groups.add(ops)
        bump_policy(people, ops, quorum=2)
        call = bumping()
        assert click(call, slack).status_code == 200
        assert Approval.objects.get().channel_user.startswith("slack:")
        client = client_for(ann)
        response = csrf_post(client, decision_url(call), page_form(client, decision_url(call)))
        assert "ann already approved bump call" in client.get(response["Location"]).content.decode()
        assert Approval.objects.count() == 1
        nothing_ran(call, counter)
    finally:
        channels.close()


def test_a_denial_racing_the_last_approval_gives_one_outcome(people: dict[str, Any], ops: Group,
                                                            counter: Path) -> None:
    bump_policy(people, ops, quorum=2)
    call_pk = bumping().pk
    ToolCall.objects.get(pk=call_pk).approve(by=people["olga"])
    barrier = threading.Barrier(2)
    got: list[str] = ["", ""]

    def decide(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            found = ToolCall.objects.select_related("run").get(pk=call_pk)
            made = found.approve(by=people["otto"]) if i == 0 else found.deny(by=people["uma"], note="no")
            got[i] = f"{type(made).__name__}:{made.verdict}"
        except AlreadyDecided:
            got[i] = "already decided"
        except OperationalError as exc:  # SQLite: a writer that waited past its timeout
            got[i] = f"busy: {exc}"
        finally:
            connections.close_all()

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    [decision] = Decision.objects.filter(tool_call_id=call_pk)
    assert got.count("already decided") == 1, got
    ran = counter.read_text().split() if counter.exists() else []
    assert ran == (["one"] if decision.verdict == "approved" else []), (got, ran)
    assert RunEvent.objects.filter(type="decision").count() == 1


def test_a_stale_digest_or_edited_arguments_record_no_approval(people: dict[str, Any], ops: Group,
                                                              counter: Path) -> None:
    bump_policy(people, ops, quorum=2)
    call = bumping()
    call.approve(by=people["olga"])
    with pytest.raises(InvalidEditedArguments):
        call.approve(by=people["otto"], args={"label": "two"})
    with pytest.raises(StaleDecision):
        call.approve(by=people["otto"], digest="0" * 64)
    assert Approval.objects.count() == 1
    nothing_ran(call, counter)


def test_an_approval_after_expiry_is_refused(people: dict[str, Any], ops: Group, settings: Any,
                                            counter: Path) -> None:
    settings.NEXO = {"APPROVAL_TIMEOUT": 3600}
    bump_policy(people, ops, quorum=2)
    call = bumping()
    call.approve(by=people["olga"])
    ToolCall.objects.filter(pk=call.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    call.refresh_from_db()
    with pytest.raises(ApprovalExpired, match="without a decision; it can no longer be decided"):
        call.approve(by=people["otto"])
    assert Approval.objects.count() == 1
    nothing_ran(call, counter)


def test_a_quorum_larger_than_the_group_after_members_leave_waits_and_a_denial_still_ends_it(
        people: dict[str, Any], ops: Group, counter: Path) -> None:
    bump_policy(people, ops, quorum=3)
    call = bumping()
    people["uma"].groups.remove(ops)
    call.approve(by=people["olga"])
    call.approve(by=people["otto"])
    with pytest.raises(PolicyRefusal, match="^uma is not in ops"):
        call.approve(by=people["uma"])
    nothing_ran(call, counter)
    call.deny(by=people["otto"], note="nobody else is left")
    assert ToolCall.objects.get(pk=call.pk).status == CallStatus.DENIED
    assert not counter.exists()


# --- escalation ----------------------------------------------------------------------------------


@pytest.fixture
def leads() -> Group:
    return Group.objects.create(name="leads")


def test_a_delay_shortened_while_the_call_waits_does_not_let_the_escalation_group_in_early(
        people: dict[str, Any], ops: Group, leads: Group, counter: Path) -> None:
    lena = member("lena", leads)
    found = bump_policy(people, ops, escalate_after=DELAY, escalation=[leads])
    call = bumping()
    found.escalate_after, found.changed_by = timedelta(seconds=1), people["carol"]
    found.save()
    reconcile(now=timezone.now() + timedelta(minutes=5))
    call.refresh_from_db()
    assert call.escalated_at is None
    with pytest.raises(PolicyRefusal, match="^lena is not in ops"):
        call.approve(by=lena)
    nothing_ran(call, counter)


def test_the_clock_going_backwards_escalates_and_expires_nothing(people: dict[str, Any], ops: Group, leads: Group,
                                                               counter: Path) -> None:
    lena = member("lena", leads)
    bump_policy(people, ops, escalate_after=DELAY, escalation=[leads])
    call = bumping()
    reconcile(now=timezone.now() - timedelta(days=400))
    call.refresh_from_db()
    assert call.escalated_at is None and call.status == CallStatus.PENDING_APPROVAL
    with pytest.raises(PolicyRefusal, match="^lena is not in ops"):
        call.approve(by=lena)
    nothing_ran(call, counter)


# --- the policy admin ----------------------------------------------------------------------------


def _policy_form(ops: Group, **fields: Any) -> dict[str, Any]:
    data = {"name": "Forged", "order": "1", "enabled": "on", "agent": "", "capability": "", "tool": "bump",
            "target": "", "approvers": [str(ops.pk)], "quorum": "1", "escalate_after": "", "reviewer": ""}
    data.update(fields)
    return data


def test_forged_posts_without_the_decide_permission_change_no_policy(people: dict[str, Any], ops: Group) -> None:
    found = bump_policy(people, ops)
    before = matching.said(found)
    client = client_for(make_user("vic"))  # staff, may look, may not decide
    assert csrf_post(client, f"{POLICIES}add/", _policy_form(ops)).status_code == 403
    assert csrf_post(client, f"{POLICIES}{found.pk}/change/", _policy_form(ops, name="Notes")).status_code == 403
    assert csrf_post(client, f"{POLICIES}{found.pk}/delete/", {"post": "yes"}).status_code == 403
    assert ApprovalPolicy.objects.count() == 1
    assert matching.said(ApprovalPolicy.objects.get()) == before


@pytest.mark.parametrize(("target", "words"), [
    ("/" + "a" * 1200, "Ensure this value has at most 1000 characters"),
    ("/deploy/../etc/*", "so this pattern could never match"),
    ("/deploy/\x00*", "Null characters are not allowed."),
    ("deploy/*", "Paths are matched /-rooted"),
])
def test_hostile_patterns_are_refused_by_the_form(people: dict[str, Any], ops: Group, target: str,
                                                  words: str) -> None:
    client = client_for(people["bob"])
    response = csrf_post(client, f"{POLICIES}add/", _policy_form(ops, capability="write", tool="", target=target))
    assert response.status_code == 200 and words in response.content.decode()
    assert not ApprovalPolicy.objects.exists()


def test_a_quorum_only_members_without_the_permission_could_meet_is_refused(people: dict[str, Any],
                                                                           ops: Group) -> None:
    """A member without the decide permission is refused when deciding, so the form does not count
    them among the people who could approve (nor an inactive member)."""
    for name in ("stan", "sven"):
        make_user(name).groups.add(ops)  # in ops, may not decide
    people["uma"].is_active = False
    people["uma"].save()
    client = client_for(people["bob"])
    response = csrf_post(client, f"{POLICIES}add/", _policy_form(ops, quorum="3"))
    assert response.status_code == 200
    assert "The quorum is 3 but ops has 2 active members who could approve" in response.content.decode()
    assert not ApprovalPolicy.objects.exists()


@pytest.mark.parametrize("path", ["os.system", "subprocess.Popen", "nexo_django.models.ApprovalPolicy"])
def test_a_reviewer_that_is_not_an_agent_class_is_refused_by_the_form(people: dict[str, Any], ops: Group,
                                                                     path: str) -> None:
    response = csrf_post(client_for(people["bob"]), f"{POLICIES}add/", _policy_form(ops, reviewer=path))
    assert response.status_code == 200
    assert f"The reviewer {path} is not an Agent class" in response.content.decode()
    assert not ApprovalPolicy.objects.exists()


def test_a_glob_bomb_pattern_matches_in_bounded_time(people: dict[str, Any], ops: Group) -> None:
    bomb = matching.said(policy(people["carol"], approvers=[ops], target="/" + "*a" * 480 + "b"))
    call = ToolCall(name="write", capability="write", args={"path": "a" * 4000, "content": ""})
    started = time.monotonic()
    assert matching.choose([bomb], call, "x") is None
    assert time.monotonic() - started < 1.0


def test_policies_of_one_order_route_by_id_and_a_disabled_one_never(people: dict[str, Any], ops: Group,
                                                                   leads: Group) -> None:
    member("lena", leads)
    policy(people["carol"], approvers=[leads], name="Off", order=1, capability="", tool="bump", target="",
           enabled=False)
    policy(people["carol"], approvers=[ops], name="First", order=5, capability="", tool="bump", target="")
    policy(people["carol"], approvers=[leads], name="Second", order=5, capability="", tool="bump", target="")
    call = bumping()
    with pytest.raises(PolicyRefusal, match="approvers of policy “First”"):
        call.approve(by=Group.objects.get(name="leads").user_set.get())
    assert isinstance(call.approve(by=people["olga"]), Decision)


def test_a_policy_edited_so_its_approvers_lose_access_leaves_waiting_calls_to_them(
        people: dict[str, Any], ops: Group, leads: Group, counter: Path) -> None:
    lena = member("lena", leads)
    found = bump_policy(people, ops)
    call = bumping()
    found.changed_by = people["carol"]
    found.approvers.set([leads])
    with pytest.raises(PolicyRefusal, match="^lena is not in ops"):
        call.approve(by=lena)
    nothing_ran(call, counter)
    assert isinstance(call.approve(by=people["olga"]), Decision)
    assert AgentRun.objects.get(pk=call.run_id).status == RunStatus.DONE


# --- the reviewer agent (scripted models) -------------------------------------------------------


def reviewed(people: dict[str, Any], ops: Group, name: str, **fields: Any) -> None:
    policy(people["carol"], approvers=[ops], reviewer=f"tests.durable.attack_reviewers.{name}", **fields)


def test_a_reviewer_reason_with_a_nul_byte_and_markup_is_recorded_and_shown_escaped_scripted(
        people: dict[str, Any], ops: Group, tmp_path: Path) -> None:
    reviewed(people, ops, "NulReason", reviewer_may_deny=True)
    call = waiting_call(tmp_path)
    reconcile(now=timezone.now())
    call.refresh_from_db()
    assert call.risk == "high" and call.reviewer_denied_at is not None, (call.risk, call.risk_reason)
    assert call.risk_reason.startswith("nul\u27e6U+0000\u27e7here")
    page = client_for(people["olga"]).get(decision_url(call)).content.decode()
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    nothing_decided(call)


@pytest.mark.parametrize("name", ["NaNRisk", "UnknownRisk", "Malformed", "NotAnObject"])
def test_a_reviewer_answer_it_cannot_read_is_no_advice_and_denies_nothing_scripted(
        people: dict[str, Any], ops: Group, tmp_path: Path, name: str) -> None:
    reviewed(people, ops, name, reviewer_may_deny=True)
    call = waiting_call(tmp_path)
    reconcile(now=timezone.now())
    call.refresh_from_db()
    assert (call.risk, call.reviewer_denied_at) == ("unknown", None)
    assert call.risk_reason.startswith("the reviewer's answer could not be read (")
    nothing_decided(call)


def test_a_reviewer_1_mb_reason_is_cut_scripted(people: dict[str, Any], ops: Group, tmp_path: Path) -> None:
    reviewed(people, ops, "HugeReason")
    call = waiting_call(tmp_path)
    reconcile(now=timezone.now())
    call.refresh_from_db()
    assert call.risk == "medium" and 0 < len(call.risk_reason) <= 2000
    nothing_decided(call)


def test_hostile_arguments_and_a_reviewer_that_calls_tools_change_nothing_scripted(
        people: dict[str, Any], ops: Group, tmp_path: Path) -> None:
    from tests.durable import attack_reviewers

    reviewed(people, ops, "ToolCaller", reviewer_may_deny=True)
    call = waiting_call(tmp_path, agent=attack_reviewers.HostileWriter)
    reconcile(now=timezone.now())
    call.refresh_from_db()
    assert call.risk in ("low", "unknown") and call.reviewer_denied_at is None
    assert not list(tmp_path.rglob("pwned.txt")) and not (tmp_path / "notes.txt").exists()
    nothing_decided(call)
    [sent] = attack_reviewers.ToolCaller.model.requests[:1]
    prompt = next(m["content"] for m in sent["messages"] if m["role"] == "user")
    assert len(prompt) < 4 * reviewer.PART_CHARS  # the 200 kB of arguments were cut
    assert prompt.count("<<<DATA") == 4 and prompt.count("DATA>>>") == 4  # its forged markers broken up
    # No tool but read and glob, over an empty in-memory sandbox: the write it asked for did not exist.
    assert set(sent.get("tools") or []) <= {"read", "glob"}


def test_a_hanging_reviewer_is_bounded_scripted(people: dict[str, Any], ops: Group, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reviewer, "TIMEOUT_SECONDS", 0.5)
    reviewed(people, ops, "Hanging", reviewer_may_deny=True)
    call = waiting_call(tmp_path)
    started = time.monotonic()
    reconcile(now=timezone.now())
    assert time.monotonic() - started < 5
    call.refresh_from_db()
    assert call.risk == "unknown" and "did not answer within 0.5 s" in call.risk_reason
    nothing_decided(call)


def test_a_review_whose_process_died_is_recorded_as_no_advice_not_left_reviewing_scripted(
        people: dict[str, Any], ops: Group, leads: Group, tmp_path: Path) -> None:
    reviewed(people, ops, "NaNRisk", escalate_after=DELAY, escalation=[leads])
    call = waiting_call(tmp_path)
    reconcile(now=timezone.now() + DELAY * 2)  # escalated (and reviewed): the probe's first reason is gone
    stale = timezone.now() - timedelta(minutes=5)
    ToolCall.objects.filter(pk=call.pk).update(risk=reviewer.REVIEWING, updated_at=stale)  # a claim, then a crash
    reconcile(now=timezone.now())
    call.refresh_from_db()
    assert call.risk == "unknown" and "the review did not finish" in call.risk_reason
    nothing_decided(call)


# --- a run a schedule started -------------------------------------------------------------------


def test_a_scheduled_runs_call_a_policy_routes_is_decided_only_by_its_group(people: dict[str, Any],
                                                                           ops: Group) -> None:
    from datetime import UTC, datetime

    from nexo_django.durable import schedules
    from tests.schedules.helpers import make

    policy(people["carol"], approvers=[ops], name="Reports", capability="write", target="/report*")
    make(target="tests.schedule_agents.Asks", cron="0 * * * *")
    assert schedules.tick(datetime(2026, 6, 1, 7, 0, 5, tzinfo=UTC)).started
    run = AgentRun.objects.get()
    [call] = ToolCall.objects.select_related("run").filter(run=run, status=CallStatus.PENDING_APPROVAL)
    assert run.options["_schedule"]["name"] == "nightly" and run.created_by_id is None
    for outsider in (people["bob"], people["carol"]):
        with pytest.raises(PolicyRefusal, match="approval policy “Reports”|the approvers of policy “Reports”"):
            call.approve(by=outsider)
    with pytest.raises(PolicyRefusal, match="pass by=<that person>"):
        call.approve()
    nothing_decided(call)
    assert isinstance(call.approve(by=people["olga"]), Decision)
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.DONE
