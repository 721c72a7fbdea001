"""What the approval policy tests share (no tests here): groups, people, a policy, a waiting call."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from django.contrib.auth.models import Group

from nexo_django.models import ApprovalPolicy, CallStatus, Decision, RunEvent, ToolCall
from tests.admin.support import make_user
from tests.durable_agents import Scribe

DECIDE = "nexo_django.decide_toolcall"


def member(name: str, *groups: Group) -> Any:
    """A person with the decide permission, in ``groups``, with an email address."""
    user = make_user(name, DECIDE)
    user.email = f"{name}@example.com"
    user.save()
    for group in groups:
        user.groups.add(group)
    return user


def policy(by: Any, *, approvers: list[Group], quorum: int = 1, escalate_after: timedelta | None = None,
           escalation: list[Group] | None = None, **fields: Any) -> ApprovalPolicy:
    """A policy written by ``by`` (one of its authors: never one who decides under it)."""
    found = ApprovalPolicy.objects.create(name=fields.pop("name", "Notes"), capability=fields.pop("capability", "write"),
                                          target=fields.pop("target", "/notes*"), quorum=quorum,
                                          escalate_after=escalate_after, created_by=by, changed_by=by, **fields)
    found.approvers.set(approvers)
    if escalation:
        found.escalation_groups.set(escalation)
    return found


def waiting_call(tmp_path: Path, user: Any = None, agent: type = Scribe) -> ToolCall:
    """A write of notes.txt waiting for a decision, read back as a front end reads it."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    run = agent.run("write hi", cwd=tmp_path, user=user)
    return ToolCall.objects.select_related("run").get(run=run, status=CallStatus.PENDING_APPROVAL)


def nothing_decided(call: ToolCall) -> None:
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL
    assert not Decision.objects.filter(tool_call=call).exists()
    assert not RunEvent.objects.filter(run_id=call.run_id, type="decision").exists()
