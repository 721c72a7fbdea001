"""Every approving path ends with the approved call running as approved, or refuses at decision
time with the reason and records nothing (issue 32, items 1 and 6), or, when the sandbox refuses
its target, ends its run with ``SecurityError`` (issue 45). The call is a ``write`` over a
file the model never read: before, only the admin's Approve button bound the file's version, and
every other path recorded *approved* for a write the run then refused. Scripted agents, inline
queue; the audit export's outcome column is checked against the file on disk."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.admin import helpers
from django.db import transaction
from django.test import Client

from nexo_django import Agent
from nexo_django.core.errors import ApprovalRefused
from nexo_django.core.sandboxes.local import LocalSandbox
from nexo_django.models import ApprovalRule, CallStatus, Decision, RunStatus, ToolCall, Verdict
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.admin.support import (
    DECISIONS,
    INBOX,
    client_for,
    csrf_post,
    decision_url,
    make_user,
    page_digest,
)
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SITE = "https://ops.example.com"


@pytest.fixture(autouse=True)
def _urls(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.urls_runs"


def _approver() -> Any:
    user = make_user("ann", "nexo_django.decide_toolcall")
    user.email = "ann@example.com"
    user.save()
    return user


def _page_form(client: Client, url: str) -> dict[str, str]:
    html = client.get(url).content.decode()
    version = re.search(r'name="file_version" value="([^"]*)"', html)
    return {"action": "approve", "digest": page_digest(html), "file_version": version.group(1) if version else ""}


def by_admin_page(call: ToolCall, user: Any, mailbox: list[Any]) -> None:
    client = client_for(user)
    assert csrf_post(client, decision_url(call), _page_form(client, decision_url(call))).status_code == 302


def by_bulk_action(call: ToolCall, user: Any, mailbox: list[Any]) -> None:
    client = client_for(user)
    html = client.get(INBOX).content.decode()
    digests = dict(re.findall(r'name="(digest_\d+)" value="([0-9a-f]{64})"', html))
    data = {"action": "approve_selected", "index": "0", helpers.ACTION_CHECKBOX_NAME: [call.pk], **digests}
    assert csrf_post(client, INBOX, data).status_code == 302


def by_json(call: ToolCall, user: Any, mailbox: list[Any]) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    status = client.get(f"/runs/{call.run_id}/status/").json()
    [pending] = status["pending"]
    body = {"verdict": "approve", "digest": pending["digest"]}  # no file_version: bound at decision time
    response = client.post(f"/runs/{call.run_id}/calls/{call.pk}/decide/", json.dumps(body),
                           content_type="application/json", headers={"X-CSRFToken": client.cookies["csrftoken"].value})
    if response.status_code != 200:
        raise ApprovalRefused(response.json()["error"])


def by_python(call: ToolCall, user: Any, mailbox: list[Any]) -> None:
    call.approve(by=user)


def by_python_async(call: ToolCall, user: Any, mailbox: list[Any]) -> None:
    async_to_sync(call.aapprove)(by=user)


def by_resume(call: ToolCall, user: Any, mailbox: list[Any]) -> None:
    call.run.resume(approved=True, by=user)


def by_email_link(call: ToolCall, user: Any, mailbox: list[Any]) -> None:
    [message] = mailbox
    link = next(line.split("Decide: ", 1)[1] for line in message.body.splitlines() if "Decide: " in line)
    page = link.removeprefix(SITE)
    client = client_for(user)
    assert csrf_post(client, page, _page_form(client, page)).status_code == 302


PATHS: dict[str, Callable[[ToolCall, Any, list[Any]], None]] = {
    "admin": by_admin_page, "bulk": by_bulk_action, "json": by_json, "python": by_python,
    "async": by_python_async, "resume": by_resume, "email": by_email_link,
}


def _audit(user: Any) -> list[dict[str, str]]:
    response = client_for(user).get(f"{DECISIONS}export/csv/")
    assert response.status_code == 200
    text = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.parametrize("path", sorted(PATHS))
def test_an_unread_file_write_approved_by_any_path_runs_as_approved_scripted(
    path: str, tmp_path: Path, settings: Any, mailoutbox: list[Any],
) -> None:
    settings.NEXO = {"NOTIFY": {"EMAIL": True, "SITE_URL": SITE}}
    (tmp_path / "notes.txt").write_text("old notes\n")  # the model never read it
    ann = _approver()
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    seen = LocalSandbox(tmp_path).version("notes.txt")
    PATHS[path](call, ann, mailoutbox)
    run.refresh_from_db()
    call.refresh_from_db()
    assert (tmp_path / "notes.txt").read_text() == "hi", call.result
    assert run.status == RunStatus.DONE and call.status == CallStatus.SUCCEEDED
    assert call.decision.file_version == seen  # the file as the approver could have looked at it
    [row] = _audit(ann)
    assert (row["verdict"], row["outcome"]) == ("approved", "ran_ok")


def test_a_rule_binds_the_file_when_it_decides_scripted(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("old notes\n")
    ann = _approver()
    ApprovalRule.objects.create(tool="write", path="/notes.txt", created_by=ann)
    run = Scribe.run("write hi", cwd=tmp_path)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE and (tmp_path / "notes.txt").read_text() == "hi"
    decision = Decision.objects.get()
    assert decision.source == "rule" and decision.file_version
    [row] = _audit(ann)
    assert (row["source"], row["outcome"]) == ("rule", "ran_ok")


def test_a_file_changed_after_the_approval_is_refused_and_the_audit_says_so_scripted(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("old notes\n")
    ann = _approver()
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    with transaction.atomic():  # changed after the decision, before the run goes on
        call.approve(by=ann)
        target.write_text("someone else's edit\n")
    assert target.read_text() == "someone else's edit\n"
    [row] = _audit(ann)
    assert row["verdict"] == "approved" and row["outcome"] == "error"
    assert "changed after the approver saw it" in row["outcome_detail"]


class Sneaky(Agent):
    """Scripted: a write whose path the sandbox refuses (``..``), then an answer."""

    model = ScriptedModel([tool_call("write", path="x/../secret/key", content="owned"), reply("Done.")])
    sandbox = "local"
    permissions = "approve"


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_write_that_could_never_run_ends_its_run_by_any_path_scripted(
    path: str, tmp_path: Path, settings: Any, mailoutbox: list[Any],
) -> None:
    # Issue 45: it used to be refused (ApprovalRefused) and leave the run suspended for ever.
    settings.NEXO = {"NOTIFY": {"EMAIL": True, "SITE_URL": SITE}}
    (tmp_path / "secret").mkdir()
    ann = _approver()
    run = Sneaky.run("write", cwd=tmp_path)
    [call] = run.pending_calls()
    PATHS[path](call, ann, mailoutbox)
    call.refresh_from_db()
    run.refresh_from_db()
    assert call.status == CallStatus.FAILED and Decision.objects.get().verdict == Verdict.APPROVED
    assert run.status == RunStatus.FAILED and "SecurityError" in run.error and "contains '..'" in run.error
    assert not (tmp_path / "secret" / "key").exists()
    [row] = _audit(ann)
    assert row["outcome"] == "error" and "SecurityError" in row["outcome_detail"]


def test_the_admin_page_names_the_reason_of_a_refusal_scripted(tmp_path: Path) -> None:
    ann = _approver()
    run = Sneaky.run("write", cwd=tmp_path)
    [call] = run.pending_calls()
    client = client_for(ann)
    response = csrf_post(client, decision_url(call), _page_form(client, decision_url(call)), follow=True)
    page = response.content.decode()
    assert "Approved, but the sandbox refused" in page and "the run failed" in page and "contains &#x27;..&#x27;" in page


def test_edited_arguments_are_bound_to_the_file_they_name_scripted(tmp_path: Path) -> None:
    (tmp_path / "other.txt").write_text("old\n")
    ann = _approver()
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    call.approve(by=ann, args={"path": "other.txt", "content": "edited"})
    run.refresh_from_db()
    assert run.status == RunStatus.DONE and (tmp_path / "other.txt").read_text() == "edited"
    assert Decision.objects.get().verdict == Verdict.APPROVED


def test_a_write_through_a_link_out_of_the_workspace_ends_its_run_at_decision_time_scripted(tmp_path: Path) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "key").write_text("secret")
    (workspace / "docs").symlink_to(outside)
    model = ScriptedModel([tool_call("write", path="docs/key", content="owned"), reply("Done.")])
    run = Scribe.run("write", cwd=workspace, model=model)
    [call] = run.pending_calls()
    call.approve(by=_approver())
    run.refresh_from_db()
    assert (outside / "key").read_text() == "secret" and run.status == RunStatus.FAILED
    assert "SecurityError" in run.error and "'docs'" in run.error
