"""What people see matches what is enforced (issue 32, items 4 to 6): from its deadline on a call
reads *expired* everywhere, reconciled or not, with no Approve/Deny; the inbox row names what a
call acts on first; the outcome is shown beside every decision. Scripted agents, inline queue."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import transaction
from django.test import Client
from django.utils import timezone

from nexo_django.durable.expiry import expire_overdue
from nexo_django.models import (
    AgentRun,
    CallStatus,
    Decision,
    RunMessage,
    RunStatus,
    ToolCall,
    args_digest,
)
from tests.admin.support import (
    DECISIONS,
    INBOX,
    approver,
    client_for,
    csrf_post,
    decision_url,
    page_digest,
    run_url,
)
from tests.durable_agents import Scribe
from tests.lifecycle_agents import Hurried

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


@pytest.fixture(autouse=True)
def _urls(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.urls_runs"


def _overdue(tmp_path: Path, user: Any = None) -> ToolCall:
    run = Hurried.run("write", cwd=tmp_path, user=user)
    [call] = run.pending_calls()
    ToolCall.objects.filter(pk=call.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    call.refresh_from_db()
    return call


# --- item 4: expired from the deadline on ---------------------------------------------------------


def test_past_its_deadline_every_page_says_expired_before_the_reconciler_runs_scripted(tmp_path: Path) -> None:
    ann = approver()
    ann.user_permissions.add(Permission.objects.get(codename="view_agentrun"))
    call = _overdue(tmp_path, user=ann)
    client = client_for(ann)
    inbox = client.get(INBOX).content.decode()
    assert "expired: it can no longer be decided" in inbox and "overdue" not in inbox
    page = client.get(decision_url(call)).content.decode()
    assert 'id="expired"' in page and "expired at" in page and "without a decision" in page
    assert 'value="approve"' not in page and 'value="deny"' not in page and 'id="approve-always"' not in page
    assert "then it expires" not in page  # no deadline in the future tense
    assert client.get(f"{decision_url(call)[:-len('change/')]}edit/")["Location"].endswith(decision_url(call))
    run_page = client.get(run_url(call.run)).content.decode()
    assert 'class="nexo-expired"' in run_page and "decide…" not in run_page
    public = client.get(f"/runs/{call.run_id}/").content.decode()
    assert "Expired" in public and "Decide it in the approval inbox" not in public
    [pending] = client.get(f"/runs/{call.run_id}/status/").json()["pending"]
    assert pending["expired"] is True and pending["expires_at"]


def test_a_polling_page_sees_the_deadline_pass_scripted(tmp_path: Path) -> None:
    ann = approver()
    run = Hurried.run("write", cwd=tmp_path, user=ann)
    client = client_for(ann)
    before = client.get(f"/runs/{run.pk}/status/").json()
    ToolCall.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))
    after = client.get(f"/runs/{run.pk}/status/").json()
    assert [p["expired"] for p in (before["pending"] + after["pending"])] == [False, True]
    assert before["version"] != after["version"]  # the page reloads and shows it expired


def test_pressing_approve_past_the_deadline_says_it_expired_in_one_sentence_scripted(tmp_path: Path) -> None:
    ann = approver()
    run = Hurried.run("write", cwd=tmp_path)
    [call] = run.pending_calls()
    client = client_for(ann)
    html = client.get(decision_url(call)).content.decode()  # opened before the deadline
    ToolCall.objects.filter(pk=call.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = csrf_post(client, decision_url(call), {"action": "approve", "digest": page_digest(html)}, follow=True)
    text = response.content.decode()
    assert "expired at" in text and "without a decision: it can no longer be approved or denied." in text
    assert "its run ended first" not in text and not Decision.objects.exists()
    token = client.cookies["csrftoken"].value
    answer = client.post(f"/runs/{call.run_id}/calls/{call.pk}/decide/",
                         json.dumps({"verdict": "approve", "digest": call.digest}),
                         content_type="application/json", headers={"X-CSRFToken": token})
    assert answer.status_code == 409 and answer.json()["expired"] is True
    assert answer.json()["error"].endswith("it can no longer be approved or denied.")


# --- item 5: the inbox row names the target first --------------------------------------------------


def _row(name: str, capability: str, args: dict[str, Any], server: str = "") -> ToolCall:
    run = AgentRun.objects.create(agent="tests.durable_agents.Scribe", prompt="p", status=RunStatus.SUSPENDED)
    RunMessage.objects.create(run=run, seq=0, role="user", data={"role": "user", "content": "p"})
    return ToolCall.objects.create(run=run, agent=run.agent, tool_call_id=f"c_{name}", name=name, capability=capability,
                                   args=args, digest=args_digest(args), status=CallStatus.PENDING_APPROVAL, server=server)


def test_each_inbox_row_leads_with_what_the_call_acts_on() -> None:
    filler = "x" * 500
    _row("write", "write", {"content": filler, "path": "deploy/prod.env"})
    _row("shell", "shell", {"command": "rm -rf build"})
    _row("fetch", "fetch", {"url": "https://api.example.com/v1/things?q=1"})
    _row("create_issue", "mcp", {"title": "t"}, server="github")
    _row("linear__create", "mcp", {"title": "t"})
    html = client_for(approver()).get(INBOX).content.decode()
    targets = re.findall(r'<span class="nexo-target" title="([^"]*)"><small>[^<]*</small> <code>([^<]*)</code></span><br>'
                         r'<span class="nexo-preview">', html)
    assert sorted(targets) == sorted([("file", "deploy/prod.env"), ("command", "rm -rf build"),
                                      ("host", "api.example.com"), ("mcp", "github: create_issue"),
                                      ("mcp", "linear: create")])


# --- item 6: the outcome is part of the record ------------------------------------------------------


def test_the_outcome_is_shown_beside_each_decision_scripted(tmp_path: Path) -> None:
    ann = approver()
    ann.user_permissions.add(Permission.objects.get(codename="view_agentrun"))
    (tmp_path / "ok").mkdir()
    ran = Scribe.run("write hi", cwd=tmp_path / "ok")
    ran.pending_calls().get().approve(by=ann)
    (tmp_path / "err").mkdir()
    failed = Scribe.run("write hi", cwd=tmp_path / "err")
    with transaction.atomic():  # the file appears after the approval: the write is refused when it runs
        failed.pending_calls().get().approve(by=ann)
        (tmp_path / "err" / "notes.txt").write_text("someone else's")
    (tmp_path / "no").mkdir()
    denied = Scribe.run("write hi", cwd=tmp_path / "no")
    denied.pending_calls().get().deny(by=ann, note="no")
    (tmp_path / "late").mkdir()
    expired = _overdue(tmp_path / "late")
    expire_overdue(timezone.now())
    (tmp_path / "gone").mkdir()
    cancelled = Scribe.run("write hi", cwd=tmp_path / "gone")
    with transaction.atomic():  # approved, then its run cancelled before it ran
        cancelled.pending_calls().get().approve(by=ann)
        cancelled.cancel(by=ann)
    assert (tmp_path / "ok" / "notes.txt").read_text() == "hi"
    assert (tmp_path / "err" / "notes.txt").read_text() == "someone else's"
    assert not (tmp_path / "gone" / "notes.txt").exists()
    client = client_for(ann)
    by_run = {str(r["run"]): r for r in json.loads(b"".join(client.get(f"{DECISIONS}export/json/").streaming_content))}
    assert by_run[str(ran.pk)]["outcome"] == "ran_ok"
    assert by_run[str(failed.pk)]["outcome"] == "error"
    assert "created after the approver saw it" in by_run[str(failed.pk)]["outcome_detail"]
    assert by_run[str(denied.pk)]["outcome"] == "denied"
    assert by_run[str(expired.run_id)]["outcome"] == "expired"
    assert by_run[str(cancelled.pk)]["outcome"] == "cancelled"
    assert "was cancelled" in by_run[str(cancelled.pk)]["outcome_detail"]
    log = client.get(DECISIONS).content.decode()
    for words in ("ran as approved", "did not succeed: write:", "denied; it did not run",
                  "expired: nobody decided in time", "not run: its run was cancelled first"):
        assert words in log
    assert "Outcome: did not succeed: write:" in client.get(run_url(failed)).content.decode()
    assert "Outcome: not run: its run was cancelled first" in client.get(run_url(cancelled)).content.decode()


def test_a_decision_body_nested_100000_deep_is_a_400_that_changes_nothing(tmp_path: Path) -> None:
    """Item 7 on the JSON endpoint: a body nested 100,000 deep is a 400 with a reason, and
    changes nothing."""
    ann = approver()
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    client = Client(enforce_csrf_checks=True)
    client.force_login(ann)
    client.get(f"/runs/{run.pk}/status/")
    body = "[" * 100_000 + "]" * 100_000
    answer = client.post(f"/runs/{run.pk}/calls/{call.pk}/decide/", body, content_type="application/json",
                         headers={"X-CSRFToken": client.cookies["csrftoken"].value})
    assert answer.status_code == 400 and "nests arrays and objects 100,000 deep" in answer.json()["error"]
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()
    huge = json.dumps({"verdict": "approve", "digest": call.digest, "note": "x" * 2_000_000})
    answer = client.post(f"/runs/{run.pk}/calls/{call.pk}/decide/", huge, content_type="application/json",
                         headers={"X-CSRFToken": client.cookies["csrftoken"].value})
    assert answer.status_code == 400 and "at most 1,000,000 are read" in answer.json()["error"]
    assert not Decision.objects.exists()


def test_deeply_nested_edited_arguments_are_refused_on_the_page() -> None:
    call = _row("write", "write", {"path": "a.txt", "content": "x"})
    client = client_for(approver())
    edited = '{"path": "a.txt", "content": ' + "[" * 50_000 + "]" * 50_000 + "}"
    review = csrf_post(client, decision_url(call), {"action": "review_edit", "digest": call.digest, "edited_args": edited})
    assert review.status_code == 200 and "nests arrays and objects 50,001 deep" in review.content.decode()
    back = csrf_post(client, decision_url(call), {"action": "back", "digest": call.digest, "edited_args": edited})
    assert back.status_code == 200
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()
