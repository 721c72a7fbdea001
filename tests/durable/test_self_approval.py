"""Four eyes: with NEXO["SELF_APPROVAL"] off the person who started a run decides none of its
calls, through the API or the admin (scripted agents)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied

from nexo_django.models import ApprovalRule, CallStatus, Decision, RunEvent, RunStatus, ToolCall
from tests.admin.support import (
    INBOX,
    client_for,
    csrf_post,
    decision_url,
    make_user,
    page_digest,
)
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


@pytest.fixture
def four_eyes(settings: Any) -> None:
    settings.NEXO = {"SELF_APPROVAL": False}


@pytest.fixture
def starter() -> Any:
    return make_user("sam", "nexo_django.decide_toolcall")


@pytest.fixture
def other() -> Any:
    return make_user("olga", "nexo_django.decide_toolcall")


def started_by(user: Any, tmp_path: Path) -> ToolCall:
    tmp_path.mkdir(parents=True, exist_ok=True)
    run = Scribe.run("write hi", cwd=tmp_path, user=user)
    return run.pending_calls().get()


def nothing_recorded(call: ToolCall) -> None:
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL
    assert not Decision.objects.filter(tool_call=call).exists()
    assert not RunEvent.objects.filter(run_id=call.run_id, type="decision").exists()


@pytest.mark.usefixtures("four_eyes")
@pytest.mark.parametrize("verb", ["approve", "deny"])
def test_the_starter_cannot_decide_through_the_api(verb: str, starter: Any, tmp_path: Path) -> None:
    call = started_by(starter, tmp_path)
    with pytest.raises(PermissionDenied, match="another person"):
        getattr(call, verb)(by=starter)
    nothing_recorded(call)
    assert not (tmp_path / "notes.txt").exists()


@pytest.mark.usefixtures("four_eyes")
def test_the_starter_cannot_resume_the_run_at_once(starter: Any, tmp_path: Path) -> None:
    call = started_by(starter, tmp_path)
    with pytest.raises(PermissionDenied):
        call.run.resume(approved=True, by=starter)
    nothing_recorded(call)


@pytest.mark.usefixtures("four_eyes")
def test_another_person_decides(starter: Any, other: Any, tmp_path: Path) -> None:
    call = started_by(starter, tmp_path)
    decision = call.approve(by=other)
    assert decision.decided_by == other
    call.run.refresh_from_db()
    assert call.run.status == RunStatus.DONE
    assert (tmp_path / "notes.txt").read_text() == "hi"


def test_by_default_the_starter_may_decide(starter: Any, tmp_path: Path) -> None:
    call = started_by(starter, tmp_path)
    assert call.approve(by=starter).decided_by == starter


@pytest.mark.usefixtures("four_eyes")
def test_the_admin_shows_the_starter_the_call_without_buttons(starter: Any, other: Any, tmp_path: Path) -> None:
    call = started_by(starter, tmp_path)
    own = client_for(starter).get(decision_url(call))
    html = own.content.decode()
    assert own.status_code == 200 and "notes.txt" in html
    assert 'value="approve"' not in html and 'value="deny"' not in html and "self-approval is off" in html
    theirs = client_for(other).get(decision_url(call)).content.decode()
    assert 'value="approve"' in theirs


@pytest.mark.usefixtures("four_eyes")
@pytest.mark.parametrize("action", ["approve", "deny", "deny_stop", "approve_always"])
def test_the_admin_refuses_the_starters_post(action: str, starter: Any, other: Any, tmp_path: Path) -> None:
    call = started_by(starter, tmp_path)
    digest = page_digest(client_for(other).get(decision_url(call)).content.decode())
    response = csrf_post(client_for(starter), decision_url(call), {"action": action, "digest": digest})
    assert response.status_code == 403
    nothing_recorded(call)
    assert not ApprovalRule.objects.exists()


@pytest.mark.usefixtures("four_eyes")
@pytest.mark.parametrize("action", ["approve_selected", "deny_selected"])
def test_the_admin_refuses_the_starters_bulk_actions(action: str, starter: Any, other: Any, tmp_path: Path) -> None:
    own = started_by(starter, tmp_path / "own")
    theirs = started_by(other, tmp_path / "theirs")
    client = client_for(starter)
    html = client.get(INBOX).content.decode()
    digests = dict(re.findall(r'name="(digest_\d+)" value="([0-9a-f]{64})"', html))
    response = csrf_post(client, INBOX, {"action": action, "index": "0", "confirm": "yes", "note": "n",
                                         ACTION_CHECKBOX_NAME: [own.pk, theirs.pk], **digests})
    assert response.status_code == 403
    nothing_recorded(own)
    nothing_recorded(theirs)  # all or nothing: the other run's call is not decided either


@pytest.mark.usefixtures("four_eyes")
def test_a_rule_does_not_approve_the_runs_of_its_own_creator(starter: Any, other: Any, tmp_path: Path) -> None:
    ApprovalRule.objects.create(agent=Scribe.path(), tool="write", created_by=starter)
    call = started_by(starter, tmp_path / "own")
    nothing_recorded(call)
    (tmp_path / "theirs").mkdir()
    run = Scribe.run("write hi", cwd=tmp_path / "theirs", user=other)
    assert run.status == RunStatus.DONE
    assert Decision.objects.get(tool_call__run=run).source == "rule"
