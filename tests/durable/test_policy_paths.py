"""A call an approval policy routes is refused to a non-member on every deciding path, in one
sentence, with nothing decided; its notices go to its group only (scripted agents, both databases)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.admin import helpers
from django.contrib.auth.models import Group
from django.test import Client

from nexo_django.durable.policy.check import PolicyRefusal
from nexo_django.models import Approval, CallStatus, Decision, ToolCall
from tests.admin.support import INBOX, client_for, csrf_post, decision_url
from tests.channel_servers import SlackServer, WebhookReceiver
from tests.channels.test_slack import click, message_of, text_of
from tests.channels.test_webhook import decision_body, post
from tests.durable.every_path import SITE, approver, every_channel, page_form
from tests.durable.policy_support import member, nothing_decided, policy, waiting_call
from tests.durable_agents import Bumper

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

#: What every path says to ann, who is not in ops.
REFUSAL = "ann is not in ops, the approvers of policy “Notes” that routes this call; ask a member of ops"


@pytest.fixture(autouse=True)
def _urls(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.durable.every_path"


@pytest.fixture
def channels(settings: Any) -> Iterator[tuple[SlackServer, WebhookReceiver]]:
    yield from every_channel(settings)


@pytest.fixture
def ann() -> Any:
    return approver()  # may decide calls, is not in ops; Slack's U1, the webhook's "ann"


@pytest.fixture
def routed(tmp_path: Path, channels: Any, ann: Any) -> ToolCall:
    ops = Group.objects.create(name="ops")
    member("olga", ops)
    policy(member("carol"), approvers=[ops])
    return waiting_call(tmp_path)


def _messages(client: Client, url: str) -> str:
    return client.get(url).content.decode()


def by_admin_page(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    client = client_for(user)
    form = page_form(client, decision_url(call))
    response = csrf_post(client, decision_url(call), form)
    assert response.status_code == 302
    assert f"Nothing changed: {REFUSAL}." in _messages(client, response["Location"])


def by_bulk_action(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    client = client_for(user)
    html = client.get(INBOX).content.decode()
    digests = dict(re.findall(r'name="(digest_\d+)" value="([0-9a-f]{64})"', html))
    data = {"action": "approve_selected", "index": "0", helpers.ACTION_CHECKBOX_NAME: [call.pk], **digests}
    response = csrf_post(client, INBOX, data)
    assert response.status_code == 302
    assert f"Nothing was decided: {REFUSAL}." in _messages(client, response["Location"])


def by_json(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    client = client_for(user)
    client.get(f"/runs/{call.run_id}/status/")  # the CSRF cookie
    response = client.post(f"/runs/{call.run_id}/calls/{call.pk}/decide/",
                           json.dumps({"verdict": "approve", "digest": call.digest}), content_type="application/json",
                           headers={"X-CSRFToken": client.cookies["csrftoken"].value})
    assert (response.status_code, response.json()) == (403, {"error": REFUSAL})


def by_python(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    with pytest.raises(PolicyRefusal, match=f"^{re.escape(REFUSAL)}$"):
        call.approve(by=user, digest=call.digest)


def by_python_deny(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    with pytest.raises(PolicyRefusal, match=f"^{re.escape(REFUSAL)}$"):
        call.deny(by=user, stop=True)


def by_python_async(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    with pytest.raises(PolicyRefusal, match=f"^{re.escape(REFUSAL)}$"):
        async_to_sync(call.aapprove)(by=user, digest=call.digest)


def by_resume(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    with pytest.raises(PolicyRefusal, match=f"^{re.escape(REFUSAL)}$"):
        call.run.resume(approved=True, by=user)


def by_email_link(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    # The notice went to the group only; the link, forwarded to ann, opens a page that refuses her.
    [message] = ctx["mailbox"]
    assert message.to == ["olga@example.com"]
    assert "Decided by ops (approval policy “Notes”)" in message.body
    link = next(line.split("Decide: ", 1)[1] for line in message.body.splitlines() if "Decide: " in line)
    client = client_for(user)
    response = csrf_post(client, link.removeprefix(SITE), page_form(client, link.removeprefix(SITE)))
    assert f"Nothing changed: {REFUSAL}." in _messages(client, response["Location"])


def by_slack(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    slack: SlackServer = ctx["slack"]
    assert "Decided by ops (approval policy “Notes”)" in text_of(message_of(slack, call))
    assert click(call, slack).status_code == 200  # U1 is ann
    [told] = slack.calls("chat.postEphemeral")
    assert told["text"] == f"Nothing was decided: {REFUSAL}."


def by_webhook(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    hook: WebhookReceiver = ctx["hook"]
    [notice] = [e for e in hook.posts if e["type"] == "approval.requested"]
    assert notice["call"]["policy"]["approvers"] == ["ops"] and notice["call"]["policy"]["quorum"] == 1
    response = post(decision_body(call, user="ann"))
    assert (response.status_code, response.json()) == (403, {"error": REFUSAL})


PATHS: dict[str, Callable[[ToolCall, Any, dict[str, Any]], None]] = {
    "admin": by_admin_page, "bulk": by_bulk_action, "json": by_json, "python": by_python,
    "python-deny": by_python_deny, "async": by_python_async, "resume": by_resume, "email": by_email_link,
    "slack": by_slack, "webhook": by_webhook,
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_non_member_is_refused_on_every_path_scripted(
    path: str, routed: ToolCall, ann: Any, channels: tuple[SlackServer, WebhookReceiver], mailoutbox: list[Any],
) -> None:
    slack, hook = channels
    PATHS[path](routed, ann, {"mailbox": mailoutbox, "slack": slack, "hook": hook})
    nothing_decided(routed)
    assert routed.status == CallStatus.PENDING_APPROVAL


def test_a_quorum_is_reached_across_slack_the_webhook_and_the_json_endpoint_scripted(
    tmp_path: Path, channels: tuple[SlackServer, WebhookReceiver], ann: Any, counter: Path,
) -> None:
    """Three members, three paths: the first two approvals wait, the third runs the call once."""
    slack, hook = channels
    ops = Group.objects.create(name="ops")
    ann.groups.add(ops)  # Slack's U1
    member("olga", ops)  # the webhook's "olga"
    otto = member("otto", ops)
    policy(member("carol"), approvers=[ops], quorum=3, capability="", tool="bump", target="")
    run = Bumper.run("bump")
    call = ToolCall.objects.get(run=run)
    assert "Decided by ops (approval policy “Notes”); 0 of 3 approved" in text_of(message_of(slack, call))
    assert click(call, slack).status_code == 200
    # The message says so at once (an approval.progress notice); the webhook hears of it too.
    assert "Decided by ops (approval policy “Notes”); 1 of 3 approved, by ann" in text_of(message_of(slack, call))
    assert post(decision_body(call, user="olga")).status_code == 200
    assert "2 of 3 approved, by ann, olga" in text_of(message_of(slack, call))
    assert [e["call"]["policy"]["approvals"][-1]["by"] for e in hook.posts if e["type"] == "approval.progress"] == [
        "ann", "olga"]
    nothing_decided(call)
    assert sorted(Approval.objects.values_list("channel_user", flat=True)) == ["slack:T0001/U1", "webhook:olga"]
    by_json_approve = client_for(otto)
    by_json_approve.get(f"/runs/{run.pk}/status/")
    response = by_json_approve.post(f"/runs/{run.pk}/calls/{call.pk}/decide/",
                                    json.dumps({"verdict": "approve", "digest": call.digest}),
                                    content_type="application/json",
                                    headers={"X-CSRFToken": by_json_approve.cookies["csrftoken"].value})
    assert response.status_code == 200, response.content
    assert Decision.objects.get(tool_call=call).decided_by == otto
    assert counter.read_text().split() == ["one"]
    [row] = [e for e in hook.posts if e["type"] == "approval.decided"]
    assert [a["by"] for a in row["call"]["policy"]["approvals"]] == ["ann", "olga", "otto"]
