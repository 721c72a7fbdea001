"""A policy's quorum: N distinct approvals, each recorded; the call runs exactly once, when the Nth
lands (threads and two real processes at once); any denial ends it; four eyes across all N
(scripted agents, both databases)."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import OperationalError, connection, connections

from nexo_django.core.errors import AlreadyDecided, InvalidEditedArguments
from nexo_django.durable.policy import quorum
from nexo_django.durable.policy.check import PolicyRefusal
from nexo_django.models import (
    AgentRun,
    Approval,
    CallStatus,
    Decision,
    RunEvent,
    RunStatus,
    ToolCall,
)
from tests.admin.support import DECISIONS, client_for, csrf_post, decision_url
from tests.durable.every_path import page_form
from tests.durable.policy_support import member, nothing_decided, policy
from tests.durable_agents import Bumper

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ops() -> Group:
    return Group.objects.create(name="ops")


@pytest.fixture
def people(ops: Group) -> dict[str, Any]:
    found = {name: member(name, ops) for name in ("olga", "otto", "uma")}
    found["bob"] = member("bob")
    policy(member("carol"), approvers=[ops], quorum=2, capability="", tool="bump", target="")
    return found


def bumping(user: Any = None) -> ToolCall:
    run = Bumper.run("bump", user=user)
    return ToolCall.objects.select_related("run").get(run=run, status=CallStatus.PENDING_APPROVAL)


def test_the_call_runs_when_the_second_approval_lands(people: dict[str, Any], counter: Path) -> None:
    call = bumping()
    first = call.approve(by=people["olga"], note="looks fine")
    assert isinstance(first, Approval) and first.approved_by == people["olga"]
    nothing_decided(call)
    assert quorum.progress(call) == "1 of 2 approved, by olga"
    assert not counter.exists()
    decision = call.approve(by=people["otto"])
    assert isinstance(decision, Decision) and decision.decided_by == people["otto"]
    assert AgentRun.objects.get(pk=call.run_id).status == RunStatus.DONE
    assert counter.read_text().split() == ["one"]
    assert [(a.approved_by.username, a.source) for a in quorum.approvals(call)] == [("olga", "api"), ("otto", "api")]
    assert quorum.progress(call) == "2 of 2 approved, by olga, otto"


def test_one_person_approving_twice_counts_once(people: dict[str, Any]) -> None:
    call = bumping()
    call.approve(by=people["olga"])
    with pytest.raises(AlreadyDecided, match="^olga already approved bump call .*; it needs 1 more approval by others$"):
        call.approve(by=people["olga"])
    nothing_decided(call)
    assert Approval.objects.count() == 1


def test_any_denial_ends_it(people: dict[str, Any], counter: Path) -> None:
    call = bumping()
    call.approve(by=people["olga"])
    call.deny(by=people["otto"], note="no")
    call.refresh_from_db()
    assert call.status == CallStatus.DENIED
    assert Decision.objects.get(tool_call=call).decided_by == people["otto"]
    with pytest.raises(AlreadyDecided):
        call.approve(by=people["uma"])
    assert not counter.exists()


def test_a_non_member_approval_does_not_count(people: dict[str, Any]) -> None:
    call = bumping()
    with pytest.raises(PolicyRefusal, match="bob is not in ops"):
        call.approve(by=people["bob"])
    assert not Approval.objects.exists()


def test_four_eyes_holds_across_all_the_approvals(people: dict[str, Any], settings: Any) -> None:
    settings.NEXO = {"SELF_APPROVAL": False}
    call = bumping(user=people["olga"])  # olga, in ops, started the run
    call.approve(by=people["otto"])
    with pytest.raises(Exception, match="olga started this run and cannot decide its calls"):
        call.approve(by=people["olga"])
    nothing_decided(call)
    assert Approval.objects.count() == 1


def test_edited_arguments_are_refused_under_a_quorum(people: dict[str, Any]) -> None:
    call = bumping()
    with pytest.raises(InvalidEditedArguments, match="needs 2 approvals of the same arguments"):
        call.approve(by=people["olga"], args={"label": "two"})
    assert not Approval.objects.exists()


def test_a_stale_digest_records_no_approval(people: dict[str, Any]) -> None:
    call = bumping()
    with pytest.raises(Exception, match="are not the ones you saw"):
        call.approve(by=people["olga"], digest="0" * 64)
    assert not Approval.objects.exists()


def test_approvals_at_once_from_threads_run_the_call_once(people: dict[str, Any], counter: Path) -> None:
    call_pk = bumping().pk
    names = ["olga", "otto", "uma"]
    barrier = threading.Barrier(len(names))
    got: list[str] = [""] * len(names)

    def approve(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            found = ToolCall.objects.select_related("run").get(pk=call_pk).approve(by=people[names[i]])
            got[i] = type(found).__name__
        except AlreadyDecided:
            got[i] = "already decided"
        except OperationalError as exc:  # SQLite: a writer that waited past its timeout
            got[i] = f"busy: {exc}"
        finally:
            connections.close_all()

    threads = [threading.Thread(target=approve, args=(i,)) for i in range(len(names))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert got.count("Decision") == 1, got
    assert sorted(got) in (["Approval", "Decision", "already decided"], ["Approval", "Approval", "Decision"]), got
    assert counter.read_text().split() == ["one"]
    assert Decision.objects.filter(tool_call_id=call_pk).count() == 1
    assert RunEvent.objects.filter(type="decision").count() == 1


def test_approvals_at_once_from_two_processes_run_the_call_once(people: dict[str, Any], counter: Path,
                                                               tmp_path: Path) -> None:
    call = bumping()
    name = str(connection.settings_dict["NAME"])
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings",
           "NEXO_TEST_DB_NAME": name, "NEXO_TEST_COUNTER": str(counter)}
    if connection.vendor == "postgresql":
        env["DATABASE_URL"] = os.environ["DATABASE_URL"]
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-m", "tests.durable.policy_approve", str(call.pk), who, str(go)],
                              cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for who in ("olga", "otto")]
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-3000:] for _, e in outs]
    assert sorted(o.strip() for o, _ in outs) == ["approval", "decision"], outs
    assert counter.read_text().split() == ["one"]
    assert Decision.objects.filter(tool_call=call).count() == 1
    assert Approval.objects.filter(tool_call=call).count() == 2
    assert AgentRun.objects.get(pk=call.run_id).status == RunStatus.DONE


def test_the_page_shows_the_approvals_so_far_and_the_audit_lists_each(people: dict[str, Any]) -> None:
    call = bumping()
    client = client_for(people["olga"])
    form = page_form(client, decision_url(call))
    response = csrf_post(client, decision_url(call), form)
    assert response.status_code == 302
    page = html.unescape(client.get(response["Location"]).content.decode())
    assert "Your approval of bump (" in page and "is recorded: 1 of 2 approved, by olga." in page
    assert "Decided by ops (approval policy “Notes”); 1 of 2 approved, by olga" in page
    nothing_decided(call)
    otto = client_for(people["otto"])
    assert csrf_post(otto, decision_url(call), page_form(otto, decision_url(call))).status_code == 302
    exported = b"".join(otto.get(f"{DECISIONS}export/json/").streaming_content)
    [row] = json.loads(exported)
    assert [(a["by"], a["source"]) for a in row["approvals"]] == [("olga", "admin"), ("otto", "admin")]
    assert row["policy"]["name"] == "Notes" and row["policy"]["quorum"] == 2 and row["decided_by"] == "otto"


def test_a_quorum_reached_before_a_crash_is_decided_by_the_next_approval(people: dict[str, Any],
                                                                        counter: Path) -> None:
    """The Nth approval committed, then its process died before the decision: the next try
    (theirs again) finds the count reached and decides, once."""
    call = bumping()
    call.approve(by=people["olga"])
    Approval.objects.create(tool_call=call, approved_by=people["otto"], digest=call.digest)  # then the crash
    nothing_decided(call)
    decision = call.approve(by=people["otto"])
    assert isinstance(decision, Decision)
    assert counter.read_text().split() == ["one"]
    assert Approval.objects.filter(tool_call=call).count() == 2
