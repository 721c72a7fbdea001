"""Escalation: after the policy's delay with no decision, the reconciler (its clock advanced)
records it on the call and tells the escalation group, which may decide from then on; expiry
still ends it (scripted agents, both databases)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from nexo_django.durable.policy import escalation
from nexo_django.durable.policy.check import PolicyRefusal
from nexo_django.durable.recovery import reconcile
from nexo_django.models import CallStatus, Notice, RunEvent, ToolCall
from tests.channel_servers import SlackServer, WebhookReceiver
from tests.durable.every_path import every_channel
from tests.durable.policy_support import member, nothing_decided, policy, waiting_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

DELAY = timedelta(minutes=30)


@pytest.fixture
def channels(settings: Any) -> Iterator[tuple[SlackServer, WebhookReceiver]]:
    yield from every_channel(settings)


@pytest.fixture
def people() -> dict[str, Any]:
    ops, leads = Group.objects.create(name="ops"), Group.objects.create(name="leads")
    found = {"olga": member("olga", ops), "lena": member("lena", leads), "bob": member("bob")}
    policy(member("carol"), approvers=[ops], escalate_after=DELAY, escalation=[leads])
    return found


def test_the_escalation_group_cannot_decide_before_the_delay(people: dict[str, Any], tmp_path: Path,
                                                            channels: Any) -> None:
    call = waiting_call(tmp_path)
    assert reconcile(now=timezone.now() + DELAY - timedelta(seconds=5)) is not None
    call.refresh_from_db()
    assert call.escalated_at is None
    with pytest.raises(PolicyRefusal, match="lena is not in ops"):
        call.approve(by=people["lena"])
    nothing_decided(call)


def test_after_the_delay_the_escalation_group_is_told_and_may_decide(
    people: dict[str, Any], tmp_path: Path, channels: tuple[SlackServer, WebhookReceiver], mailoutbox: list[Any],
) -> None:
    slack, hook = channels
    call = waiting_call(tmp_path)
    assert [m.to for m in mailoutbox] == [["olga@example.com"]]  # the request: ops only
    later = timezone.now() + DELAY + timedelta(seconds=1)
    reconcile(now=later)
    call.refresh_from_db()
    leads = Group.objects.get(name="leads")
    assert call.escalated_at == later and f",{leads.pk}," in call.approver_groups
    assert RunEvent.objects.filter(run_id=call.run_id, type="escalated").count() == 1
    assert set(Notice.objects.filter(kind="approval.escalated").values_list("channel", flat=True)) == {
        "email", "ops", "hook"}
    escalated = [m for m in mailoutbox if m.subject.startswith("Escalated: ")]
    assert [m.to for m in escalated] == [["lena@example.com"]]
    assert [e["type"] for e in hook.posts].count("approval.escalated") == 1
    replies = [c for c in slack.calls("chat.postMessage") if "Escalated: nobody decided write in time; leads may "
               "decide it now" in c.get("text", "")]
    assert len(replies) == 1
    reconcile(now=later + timedelta(seconds=5))  # once
    assert Notice.objects.filter(kind="approval.escalated").count() == 3
    with pytest.raises(PolicyRefusal, match="bob is not in ops, leads"):
        call.approve(by=people["bob"])
    call.approve(by=people["lena"])
    assert ToolCall.objects.get(pk=call.pk).status != CallStatus.PENDING_APPROVAL


def test_expiry_still_ends_an_escalated_call(people: dict[str, Any], tmp_path: Path, settings: Any) -> None:
    settings.NEXO = {"APPROVAL_TIMEOUT": 3600}
    call = waiting_call(tmp_path)
    reconcile(now=timezone.now() + DELAY + timedelta(seconds=1))
    reconcile(now=timezone.now() + timedelta(hours=2))
    call.refresh_from_db()
    assert call.escalated_at is not None and call.status == CallStatus.EXPIRED


def test_a_decided_call_is_not_escalated(people: dict[str, Any], tmp_path: Path) -> None:
    call = waiting_call(tmp_path)
    call.approve(by=people["olga"])
    assert escalation.escalate_due(timezone.now() + DELAY * 2) == []
    call.refresh_from_db()
    assert call.escalated_at is None
