"""The Slack channel against a loopback server speaking Slack's Web API (scripted agents): the
message, the signed interactivity endpoint, and deciding through the admin's checks."""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.db import connections
from django.test import Client
from django.utils import timezone

from nexo_django.channels.signing import slack_signature
from nexo_django.durable.recovery import reconcile
from nexo_django.models import CallStatus, Decision, Notice, NoticeStatus, RunStatus, ToolCall
from tests.admin.support import make_user
from tests.channel_servers import SlackServer
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SIGNING = "slack-signing-secret"
TEAM = "T0001"
CLICKS = itertools.count(1)  # each click its own action_ts, as Slack's are


def slack_channel(server: SlackServer, channel: str = "C0001", **options: Any) -> dict[str, Any]:
    return {"BACKEND": "slack", "TOKEN": server.token, "SIGNING_SECRET": SIGNING, "CHANNEL": channel,
            "BASE_URL": server.base_url, "ALLOW_PRIVATE": ["127.0.0.1"], **options}


@pytest.fixture
def slack(settings: Any) -> Any:
    with SlackServer() as server:
        settings.NEXO = {"CHANNELS": {"ops": slack_channel(server)}, "NOTIFY": {"SITE_URL": "https://ops.example.com"}}
        yield server


@pytest.fixture
def dora(slack: SlackServer) -> Any:
    """May decide; Slack knows her confirmed email."""
    user = make_user("dora", "nexo_django.decide_toolcall")
    user.email = "dora@example.com"
    user.save()
    slack.users["U1"] = {"id": "U1", "is_email_confirmed": True, "profile": {"email": "Dora@Example.com"}}
    return user


def message_of(slack: SlackServer, call: ToolCall, name: str = "ops") -> dict[str, Any]:
    receipt = Notice.objects.get(channel=name, kind="approval.requested", tool_call_id=call.tool_call_id).receipt
    return slack.messages[(receipt["channel"], receipt["ts"])]


def buttons(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]]


def click(call: ToolCall, slack: SlackServer, *, user: str = "U1", approve: bool = True, digest: str | None = None,
          name: str = "ops", timestamp: int | None = None, secret: str = SIGNING, body: bytes | None = None,
          client: Client | None = None, action_ts: str | None = None) -> Any:
    receipt = Notice.objects.get(channel=name, kind="approval.requested", tool_call_id=call.tool_call_id).receipt
    ts = str(timestamp if timestamp is not None else int(time.time()))
    payload = {
        "type": "block_actions", "user": {"id": user, "team_id": TEAM}, "team": {"id": TEAM},
        "container": {"type": "message", "channel_id": receipt["channel"], "message_ts": receipt["ts"]},
        "actions": [{"action_id": "nexo_approve" if approve else "nexo_deny", "type": "button",
                     "value": f"{call.pk}:{digest or call.digest}", "action_ts": action_ts or f"{ts}.{next(CLICKS):06d}"}],
        "response_url": "https://hooks.slack.invalid/actions/x",
    }
    body = body if body is not None else urlencode({"payload": json.dumps(payload)}).encode()
    return (client or Client()).post(
        f"/nexo/channels/{name}/", body, content_type="application/x-www-form-urlencoded",
        headers={"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": slack_signature(secret, ts, body)},
    )


def suspend(tmp_path: Path, user: Any = None) -> ToolCall:
    run = Scribe.run("write a note", cwd=tmp_path, user=user)
    assert run.status == RunStatus.SUSPENDED
    return run.pending_calls().get()


def text_of(message: dict[str, Any]) -> str:
    return json.dumps(message["blocks"], ensure_ascii=False)


def test_a_waiting_call_is_posted_with_its_target_arguments_deadline_and_buttons(slack: SlackServer, tmp_path: Path) -> None:
    call = suspend(tmp_path)
    [posted] = slack.calls("chat.postMessage")
    assert posted["channel"] == "C0001" and posted["metadata"]["event_payload"]["key"].startswith("approval.requested:")
    message = message_of(slack, call)
    shown = text_of(message)
    assert "Scribe wants to run write on notes.txt" in shown and '\\"content\\": \\"hi\\"' in shown
    assert "Deadline: " in shown and f"https://ops.example.com/admin/nexo_django/pendingapproval/{call.pk}/change/" in shown
    assert [(b["action_id"], b["value"]) for b in buttons(message)] == [
        ("nexo_approve", f"{call.pk}:{call.digest}"), ("nexo_deny", f"{call.pk}:{call.digest}")]


def test_an_approval_from_slack_runs_the_call_once_and_updates_the_message(
    slack: SlackServer, dora: Any, tmp_path: Path,
) -> None:
    call = suspend(tmp_path)
    assert click(call, slack).status_code == 200
    decision = Decision.objects.get()
    assert (decision.verdict, decision.source, decision.decided_by, decision.channel_user) == (
        "approved", "ops", dora, f"slack:{TEAM}/U1")
    call.refresh_from_db()
    assert call.status == CallStatus.SUCCEEDED and call.run.status == RunStatus.DONE
    assert (tmp_path / "notes.txt").read_text() == "hi"
    message = message_of(slack, call)
    assert buttons(message) == []
    shown = text_of(message)
    assert f"Approved by dora (slack:{TEAM}/U1) via ops" in shown and "Outcome: it ran." in shown
    assert "The run is done." in shown
    # A second click decides nothing and updates the message with what already happened.
    updates = len(slack.calls("chat.update"))
    assert click(call, slack).status_code == 200
    assert Decision.objects.count() == 1 and len(slack.calls("chat.update")) == updates + 1
    assert "Approved by dora" in text_of(message_of(slack, call))
    assert ToolCall.objects.get(pk=call.pk).status == CallStatus.SUCCEEDED  # ran once


def nothing_decided(call: ToolCall) -> None:
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()
    assert call.run.status == RunStatus.SUSPENDED


def test_a_forged_signature_is_refused_before_anything_is_read(slack: SlackServer, dora: Any, tmp_path: Path) -> None:
    call = suspend(tmp_path)
    assert click(call, slack, secret="not the secret").status_code == 401
    nothing_decided(call)
    assert slack.calls("users.info") == []  # nobody was looked up for the forged one


def test_an_old_timestamp_is_refused(slack: SlackServer, dora: Any, tmp_path: Path) -> None:
    call = suspend(tmp_path)
    response = click(call, slack, timestamp=int(time.time()) - 301)
    assert response.status_code == 401 and b"timestamp" in response.content
    nothing_decided(call)
    assert slack.calls("users.info") == []


def test_the_same_request_twice_is_a_replay(slack: SlackServer, dora: Any, tmp_path: Path) -> None:
    call = suspend(tmp_path)
    slack.users.clear()  # the first request is accepted but decides nothing (an unknown person)
    ts = int(time.time())
    assert click(call, slack, timestamp=ts, action_ts="1.1").status_code == 200
    slack.users["U1"] = {"id": "U1", "is_email_confirmed": True, "profile": {"email": "dora@example.com"}}
    looked_up = len(slack.calls("users.info"))
    replay = click(call, slack, timestamp=ts, action_ts="1.1")  # the very same bytes, signature and timestamp
    assert replay.status_code == 401 and b"replay" in replay.content
    nothing_decided(call)
    assert len(slack.calls("users.info")) == looked_up


def test_a_slack_user_without_the_permission_decides_nothing(slack: SlackServer, tmp_path: Path) -> None:
    looker = make_user("looker", "nexo_django.view_pendingapproval")
    looker.email = "looker@example.com"
    looker.save()
    slack.users["U2"] = {"id": "U2", "is_email_confirmed": True, "profile": {"email": "looker@example.com"}}
    call = suspend(tmp_path)
    assert click(call, slack, user="U2").status_code == 200
    nothing_decided(call)
    [told] = slack.ephemeral
    assert told["user"] == "U2" and "decide_toolcall" in told["text"]
    assert buttons(message_of(slack, call))  # the message still offers the decision


def test_an_unconfirmed_email_maps_to_nobody(slack: SlackServer, dora: Any, tmp_path: Path) -> None:
    slack.users["U1"]["is_email_confirmed"] = False
    call = suspend(tmp_path)
    click(call, slack)
    nothing_decided(call)
    assert "no active account" in slack.ephemeral[0]["text"]


def test_the_requester_decides_nothing_under_four_eyes(slack: SlackServer, dora: Any, tmp_path: Path,
                                                      settings: Any) -> None:
    settings.NEXO = {**settings.NEXO, "SELF_APPROVAL": False}
    call = suspend(tmp_path, user=dora)
    assert click(call, slack).status_code == 200
    nothing_decided(call)
    assert "SELF_APPROVAL" in slack.ephemeral[0]["text"]


def test_a_stale_digest_decides_nothing(slack: SlackServer, dora: Any, tmp_path: Path) -> None:
    call = suspend(tmp_path)
    click(call, slack, digest="0" * 64)
    nothing_decided(call)
    assert "not the ones you saw" in slack.ephemeral[0]["text"]


def test_a_click_after_expiry_decides_nothing_and_says_so(slack: SlackServer, dora: Any, tmp_path: Path) -> None:
    call = suspend(tmp_path)
    ToolCall.objects.filter(pk=call.pk).update(expires_at=timezone.now())
    click(call, slack)
    nothing_decided(call)
    message = message_of(slack, call)
    assert buttons(message) == [] and "Expired at" in text_of(message)
    reconcile(log_warnings=False)  # the reconciler records the expiry: the message says so
    assert "Expired: nobody decided in time." in text_of(message_of(slack, call))


def test_two_channels_racing_one_decision_both_messages_updated(settings: Any, slack: SlackServer, dora: Any,
                                                               tmp_path: Path) -> None:
    settings.NEXO = {**settings.NEXO, "CHANNELS": {"ops": slack_channel(slack, "C0001"),
                                                    "sec": slack_channel(slack, "C0002")}}
    call = suspend(tmp_path)
    assert {m["channel"] for m in slack.calls("chat.postMessage")} == {"C0001", "C0002"}
    barrier = threading.Barrier(2)
    statuses: list[int] = []

    def press(name: str, approve: bool) -> None:
        try:
            barrier.wait(timeout=10)
            statuses.append(click(call, slack, name=name, approve=approve).status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=press, args=("ops", True)), threading.Thread(target=press, args=("sec", False))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert statuses == [200, 200]
    decision = Decision.objects.get()
    verdict = "Approved" if decision.verdict == "approved" else "Denied"
    for name in ("ops", "sec"):
        message = message_of(slack, call, name)
        assert buttons(message) == [] and f"{verdict} by dora (slack:{TEAM}/U1) via {decision.source}" in text_of(message)
    assert Notice.objects.filter(kind="approval.decided").count() == 2  # one per channel
    assert (tmp_path / "notes.txt").exists() == (decision.verdict == "approved")


def test_rate_limited_posts_are_retried_after_slacks_retry_after(slack: SlackServer, tmp_path: Path) -> None:
    slack.rate_limited = 1
    call = suspend(tmp_path)
    notice = Notice.objects.get()
    assert notice.status == NoticeStatus.PENDING and "rate limited" in notice.last_error
    assert reconcile(now=timezone.now() + timedelta_seconds(30), log_warnings=False).delivered == 1
    assert buttons(message_of(slack, call))


def timedelta_seconds(seconds: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=seconds)


def test_a_cancelled_run_takes_the_buttons_away(slack: SlackServer, dora: Any, tmp_path: Path) -> None:
    call = suspend(tmp_path)
    call.run.cancel()
    notice = Notice.objects.get(kind="run.cancelled")
    assert notice.status == NoticeStatus.DELIVERED
    message = message_of(slack, call)
    assert buttons(message) == [] and "Not decided: the run is cancelled." in text_of(message)
    click(call, slack)  # a click after that decides nothing
    assert not Decision.objects.exists()
