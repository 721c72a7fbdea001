"""An approval binds the file version that was shown to people: the one at suspension, which
every notice carried, unless the deciding path passes a later version it displayed (issue 45,
item 1). A run suspends on a scripted ``write`` over ``notes.txt`` ("old"); a person edits the
file; the call is approved by each path. Before, every path without a version bound the file as
it was at decision time, and the model's content replaced the person's edit. Now the write is
refused when it would run, with the reason (on the call, in the audit, to the model), and the
edit survives. Scripted agents, inline queue; Slack and the webhook receiver are loopback servers."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.admin import helpers
from django.test import Client

from nexo_django.core.sandboxes.local import LocalSandbox
from nexo_django.models import ApprovalRule, CallStatus, Decision, RunStatus, ToolCall
from nexo_django.signals import run_status_changed
from tests.admin.support import (
    DECISIONS,
    INBOX,
    client_for,
    csrf_post,
    decision_url,
)
from tests.channel_servers import SlackServer, WebhookReceiver
from tests.channels.test_slack import click, message_of, text_of
from tests.channels.test_webhook import decision_body, post
from tests.durable.every_path import SITE, approver, every_channel, page_form
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

EDIT = "a person's edit\n"


@pytest.fixture(autouse=True)
def _urls(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.durable.every_path"


@pytest.fixture
def ann() -> Any:
    return approver()


@pytest.fixture
def channels(settings: Any, tmp_path: Path) -> Iterator[tuple[SlackServer, WebhookReceiver]]:
    yield from every_channel(settings, INCLUDE_ARGS=True)


def _edit(target: Path) -> None:
    target.write_text(EDIT)


# Each path: approve ``call`` as ``user``; ``edit()`` makes the person's edit at the moment the
# path allows it (before a path that shows nothing, after the page was shown for the pages).


def by_admin_page(call: ToolCall, user: Any, edit: Callable[[], None], ctx: dict[str, Any]) -> None:
    client = client_for(user)
    form = page_form(client, decision_url(call))  # the page showed "old"
    edit()
    assert csrf_post(client, decision_url(call), form).status_code == 302


def by_bulk_action(call: ToolCall, user: Any, edit: Callable[[], None], ctx: dict[str, Any]) -> None:
    edit()  # the inbox shows no diff: the bulk approval binds the version at suspension
    client = client_for(user)
    html = client.get(INBOX).content.decode()
    digests = dict(re.findall(r'name="(digest_\d+)" value="([0-9a-f]{64})"', html))
    data = {"action": "approve_selected", "index": "0", helpers.ACTION_CHECKBOX_NAME: [call.pk], **digests}
    assert csrf_post(client, INBOX, data).status_code == 302


def by_json(call: ToolCall, user: Any, edit: Callable[[], None], ctx: dict[str, Any]) -> None:
    edit()
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get(f"/runs/{call.run_id}/status/")  # the CSRF cookie
    body = {"verdict": "approve", "digest": call.digest}  # no file_version: bound to the suspension's
    response = client.post(f"/runs/{call.run_id}/calls/{call.pk}/decide/", json.dumps(body),
                           content_type="application/json", headers={"X-CSRFToken": client.cookies["csrftoken"].value})
    assert response.status_code == 200, response.content


def by_python(call: ToolCall, user: Any, edit: Callable[[], None], ctx: dict[str, Any]) -> None:
    edit()
    call.approve(by=user, digest=call.digest)


def by_python_async(call: ToolCall, user: Any, edit: Callable[[], None], ctx: dict[str, Any]) -> None:
    edit()
    async_to_sync(call.aapprove)(by=user, digest=call.digest)


def by_resume(call: ToolCall, user: Any, edit: Callable[[], None], ctx: dict[str, Any]) -> None:
    edit()
    call.run.resume(approved=True, by=user)


def by_email_link(call: ToolCall, user: Any, edit: Callable[[], None], ctx: dict[str, Any]) -> None:
    [message] = ctx["mailbox"]
    assert "as it was when the call asked" in message.body  # the version the email was computed from
    link = next(line.split("Decide: ", 1)[1] for line in message.body.splitlines() if "Decide: " in line)
    page = link.removeprefix(SITE)
    client = client_for(user)
    form = page_form(client, page)
    edit()
    assert csrf_post(client, page, form).status_code == 302


def by_slack(call: ToolCall, user: Any, edit: Callable[[], None], ctx: dict[str, Any]) -> None:
    slack: SlackServer = ctx["slack"]
    assert "as it was when the call asked" in text_of(message_of(slack, call))
    edit()
    assert click(call, slack).status_code == 200


def by_webhook(call: ToolCall, user: Any, edit: Callable[[], None], ctx: dict[str, Any]) -> None:
    hook: WebhookReceiver = ctx["hook"]
    [notice] = [e for e in hook.posts if e["type"] == "approval.requested"]
    assert notice["call"]["file_version"] == ctx["seen"]  # the version the notice was computed from
    edit()
    assert post(decision_body(call, user="ann")).status_code == 200


PATHS: dict[str, Callable[[ToolCall, Any, Callable[[], None], dict[str, Any]], None]] = {
    "admin": by_admin_page, "bulk": by_bulk_action, "json": by_json, "python": by_python,
    "async": by_python_async, "resume": by_resume, "email": by_email_link, "slack": by_slack,
    "webhook": by_webhook,
}


def _audit(user: Any) -> list[dict[str, str]]:
    response = client_for(user).get(f"{DECISIONS}export/csv/")
    assert response.status_code == 200
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


def _refused_and_kept(target: Path, call: ToolCall, seen: str | None, user: Any) -> None:
    """The person's edit is the file; the call says why it did not write; so do the audit and
    the model's transcript."""
    assert target.read_text() == EDIT  # nothing a person wrote is overwritten
    call.refresh_from_db()
    run = call.run
    run.refresh_from_db()
    assert call.status == CallStatus.FAILED, call.result
    assert "changed after the approver saw it" in call.result["error"] and "nothing was written" in call.result["error"]
    assert Decision.objects.get().file_version == seen  # what the notices showed
    assert run.status == RunStatus.DONE  # the model was told and answered (the scripted reply)
    told = [m.data for m in run.messages.all() if m.data.get("role") == "tool"]
    assert any("changed after the approver saw it" in json.dumps(m.get("content")) for m in told)
    [row] = _audit(user)
    assert (row["verdict"], row["outcome"]) == ("approved", "error")
    assert "changed after the approver saw it" in row["outcome_detail"]


@pytest.mark.parametrize("path", sorted(PATHS))
def test_an_approval_by_any_path_does_not_overwrite_an_edit_made_after_the_notices_scripted(
    path: str, tmp_path: Path, ann: Any, channels: tuple[SlackServer, WebhookReceiver], mailoutbox: list[Any],
) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("old\n")
    seen = LocalSandbox(tmp_path).version("notes.txt")
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    assert call.suspension_version == seen
    slack, hook = channels
    PATHS[path](call, ann, lambda: _edit(target), {"mailbox": mailoutbox, "slack": slack, "hook": hook, "seen": seen})
    _refused_and_kept(target, call, seen, ann)


def test_a_standing_rule_binds_the_version_at_suspension_scripted(tmp_path: Path, ann: Any) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("old\n")
    seen = LocalSandbox(tmp_path).version("notes.txt")
    ApprovalRule.objects.create(tool="write", path="/notes.txt", created_by=ann)

    def edit_when_suspended(sender: Any, run: Any, old: str, new: str, **kwargs: Any) -> None:
        if new == RunStatus.SUSPENDED:  # the person's edit lands before the rule decides
            _edit(target)

    run_status_changed.connect(edit_when_suspended)
    try:
        run = Scribe.run("write hi", cwd=tmp_path)
    finally:
        run_status_changed.disconnect(edit_when_suspended)
    call = ToolCall.objects.get(run=run)
    assert Decision.objects.get().source == "rule"
    _refused_and_kept(target, call, seen, ann)


def test_a_page_reloaded_after_the_edit_binds_the_version_it_displayed_scripted(tmp_path: Path, ann: Any) -> None:
    """The exception the rule names: the page showed the edited file (its diff), so its approval
    is of that version, and the write replaces it."""
    target = tmp_path / "notes.txt"
    target.write_text("old\n")
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    _edit(target)
    shown = LocalSandbox(tmp_path).version("notes.txt")
    client = client_for(ann)
    page = client.get(decision_url(call)).content.decode()
    assert "a person&#x27;s edit" in page or "a person's edit" in page  # the diff showed the edit
    assert 'id="changed-since-asked"' in page  # and the page says the notices showed another version
    assert csrf_post(client, decision_url(call), page_form(client, decision_url(call))).status_code == 302
    call.refresh_from_db()
    assert target.read_text() == "hi" and call.status == CallStatus.SUCCEEDED
    assert call.decision.file_version == shown != call.suspension_version


def test_an_unchanged_file_is_written_by_an_approval_without_a_version_scripted(tmp_path: Path, ann: Any) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("old\n")
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    assert 'id="changed-since-asked"' not in client_for(ann).get(decision_url(call)).content.decode()
    call.approve(by=ann)
    call.refresh_from_db()
    assert target.read_text() == "hi" and call.status == CallStatus.SUCCEEDED


def test_a_file_created_while_the_call_waited_is_not_replaced_scripted(tmp_path: Path, ann: Any) -> None:
    """The notices showed "no such file": a file a person created since is theirs."""
    target = tmp_path / "notes.txt"
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    assert call.suspension_version == ""
    _edit(target)
    call.approve(by=ann)
    call.refresh_from_db()
    assert target.read_text() == EDIT
    assert "was created after the approver saw it" in call.result["error"]
