"""Approval requests end: deadlines, expiry by the reconciler, and what the model hears (scripted agents)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from nexo_django.core.errors import AlreadyDecided, ApprovalExpired
from nexo_django.durable.recovery import reconcile
from nexo_django.models import AgentRun, CallStatus, Decision, RunEvent, RunStatus, ToolCall
from tests.admin.support import DECISIONS, INBOX, approver, client_for, decision_url
from tests.durable_agents import Scribe
from tests.lifecycle_agents import Hurried, HurriedStop, Patient

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def waiting(agent: Any, tmp_path: Path) -> tuple[AgentRun, ToolCall]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    run = agent.run("write a note", cwd=tmp_path)
    assert run.status == RunStatus.SUSPENDED
    return run, run.pending_calls().get()


def test_a_waiting_call_gets_the_agents_deadline(tmp_path: Path) -> None:
    _, call = waiting(Hurried, tmp_path)
    assert call.expires_at is not None
    assert timedelta(seconds=59) <= call.expires_at - call.created_at <= timedelta(seconds=61)


def test_the_default_deadline_is_a_week(tmp_path: Path) -> None:
    _, call = waiting(Scribe, tmp_path)
    assert call.expires_at is not None
    assert abs((call.expires_at - call.created_at) - timedelta(days=7)) < timedelta(seconds=2)


def test_the_setting_gives_the_default(tmp_path: Path, settings: Any) -> None:
    settings.NEXO = {"APPROVAL_TIMEOUT": 3600}
    _, call = waiting(Scribe, tmp_path)
    assert call.expires_at is not None
    assert abs((call.expires_at - call.created_at) - timedelta(hours=1)) < timedelta(seconds=2)


def test_setting_none_and_agent_none_wait_forever(tmp_path: Path, settings: Any) -> None:
    _, call = waiting(Patient, tmp_path)
    assert call.expires_at is None
    assert reconcile(now=timezone.now() + timedelta(days=3650)).expired == []
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL
    settings.NEXO = {"APPROVAL_TIMEOUT": None}
    _, other = waiting(Scribe, tmp_path / "other")
    assert other.expires_at is None


def test_nothing_expires_before_the_deadline(tmp_path: Path) -> None:
    _, call = waiting(Hurried, tmp_path)
    assert reconcile(now=call.expires_at - timedelta(seconds=1)).expired == []
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL
    assert not Decision.objects.exists()


def test_expiry_denies_as_nobody_and_the_model_hears_it_expired(tmp_path: Path) -> None:
    run, call = waiting(Hurried, tmp_path)
    report = reconcile(now=call.expires_at + timedelta(seconds=1))
    assert report.expired == [str(run.pk)]
    decision = Decision.objects.get(tool_call=call)
    assert (decision.verdict, decision.source, decision.decided_by) == ("denied", "expiry", None)
    assert "expired" in decision.note and "1 minute" in decision.note
    call.refresh_from_db()
    assert call.status == CallStatus.EXPIRED
    run.refresh_from_db()
    assert run.status == RunStatus.DONE and run.result == "Noted."
    told = [m["content"]["error"] for m in run.transcript() if m["role"] == "tool"]
    assert len(told) == 1
    assert "expired without a decision" in told[0] and "denied by the approver" not in told[0]
    assert not (tmp_path / "notes" / "a.txt").exists()
    event = RunEvent.objects.get(run=run, type="expired")
    assert event.data["source"] == "expiry" and event.data["call"] == call.tool_call_id
    assert not RunEvent.objects.filter(run=run, type="decision").exists()


def test_on_timeout_stop_cancels_the_run(tmp_path: Path) -> None:
    run, call = waiting(HurriedStop, tmp_path)
    reconcile(now=call.expires_at + timedelta(seconds=1))
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert "expired" in run.error
    decision = Decision.objects.get(tool_call=call)
    assert decision.stop and decision.source == "expiry"
    assert not (tmp_path / "notes" / "a.txt").exists()


def test_an_expired_call_can_no_longer_be_approved(tmp_path: Path) -> None:
    run, call = waiting(Hurried, tmp_path)
    reconcile(now=call.expires_at + timedelta(seconds=1))
    with pytest.raises(ApprovalExpired):
        call.approve(by=approver())
    assert Decision.objects.filter(tool_call=call).count() == 1
    assert not (tmp_path / "notes" / "a.txt").exists()


def test_past_the_deadline_a_person_cannot_approve_before_the_reconciler_runs(tmp_path: Path) -> None:
    run, call = waiting(Hurried, tmp_path)
    ToolCall.objects.filter(pk=call.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    call.refresh_from_db()
    with pytest.raises(ApprovalExpired):
        call.approve(by=approver())
    assert not Decision.objects.exists()
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL  # left for the reconciler to expire, audited


def test_expiry_happens_once_and_leaves_a_persons_decision_alone(tmp_path: Path) -> None:
    run, call = waiting(Hurried, tmp_path)
    later = call.expires_at + timedelta(seconds=1)
    assert reconcile(now=later).expired == [str(run.pk)]
    assert reconcile(now=later).expired == []
    assert Decision.objects.filter(tool_call=call).count() == 1
    _, decided = waiting(Hurried, tmp_path / "second")
    decided.approve(by=approver())
    assert reconcile(now=decided.expires_at + timedelta(days=1)).expired == []
    assert Decision.objects.get(tool_call=decided).source == "api"
    with pytest.raises(AlreadyDecided):
        decided.deny()


def test_manage_py_nexo_reconcile_expires_overdue_calls(tmp_path: Path) -> None:
    run, call = waiting(Hurried, tmp_path)
    ToolCall.objects.filter(pk=call.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    out = StringIO()
    call_command("nexo_reconcile", stdout=out)
    assert "expired=1" in out.getvalue()
    call.refresh_from_db()
    assert call.status == CallStatus.EXPIRED


def test_the_inbox_and_the_decision_page_show_the_deadline(tmp_path: Path) -> None:
    _, call = waiting(Hurried, tmp_path)
    client = client_for(approver())
    inbox = client.get(INBOX).content.decode()
    assert 'class="nexo-deadline"' in inbox and call.expires_at.isoformat(" ", "seconds") in inbox
    page = client.get(decision_url(call)).content.decode()
    assert 'id="deadline"' in page and "then it expires" in page


def test_expiries_are_counted_apart_from_denials_in_the_decision_log(tmp_path: Path) -> None:
    _, expiring = waiting(Hurried, tmp_path / "a")
    _, denied = waiting(Hurried, tmp_path / "b")
    ann = approver()
    denied.deny(by=ann, note="no")
    reconcile(now=expiring.expires_at + timedelta(seconds=1))
    client = client_for(ann)
    page = client.get(DECISIONS).content.decode()
    assert "expired without a decision (1)" in page and "denied by a person (1)" in page
    only_expired = client.get(DECISIONS + "?outcome=expired").content.decode()
    assert "expiry" in only_expired and "1 decision" in only_expired
    only_denied = client.get(DECISIONS + "?outcome=denied").content.decode()
    assert "1 decision" in only_denied
