"""Attacks on Slack's interactivity endpoint (issue 45 item 4), each checking that nothing was
decided: no ``Decision``, the call still waiting, its file not written, nobody looked up for a
request that was not verified. A loopback server speaks Slack's Web API; the agents are scripted."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.db import connections
from django.test import Client

from nexo_django.channels.signing import slack_signature
from nexo_django.models import CallStatus, Decision, RunEvent, RunStatus, ToolCall, args_digest
from tests.admin.support import make_user
from tests.channel_servers import SlackServer
from tests.channels.test_slack import (
    SIGNING,
    TEAM,
    buttons,
    click,
    message_of,
    slack_channel,
    suspend,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


@pytest.fixture
def slack(settings: Any) -> Any:
    with SlackServer() as server:
        settings.NEXO = {"CHANNELS": {"ops": slack_channel(server)}, "NOTIFY": {"SITE_URL": "https://ops.example.com"}}
        yield server


def person(slack: SlackServer, name: str, slack_id: str, *perms: str, confirmed: bool = True) -> Any:
    user = make_user(name, *perms)
    user.email = f"{name}@example.com"
    user.save()
    slack.users[slack_id] = {"id": slack_id, "is_email_confirmed": confirmed, "profile": {"email": user.email}}
    return user


@pytest.fixture
def dora(slack: SlackServer) -> Any:
    return person(slack, "dora", "U1", "nexo_django.decide_toolcall")


def untouched(call: ToolCall, tmp_path: Path) -> None:
    """Nothing decided, written or resumed."""
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()
    assert call.run.status == RunStatus.SUSPENDED
    assert not (tmp_path / "notes.txt").exists()


def signed_post(body: bytes, headers: dict[str, str]) -> Any:
    return Client().post("/nexo/channels/ops/", body, content_type="application/x-www-form-urlencoded",
                         headers=headers)


def payload_body(call: ToolCall, value: str | None = None, user: str = "U1") -> bytes:
    payload = {"type": "block_actions", "user": {"id": user, "team_id": TEAM}, "team": {"id": TEAM},
               "actions": [{"action_id": "nexo_approve", "type": "button",
                            "value": value if value is not None else f"{call.pk}:{call.digest}",
                            "action_ts": f"{time.time():.6f}"}]}
    return urlencode({"payload": json.dumps(payload)}).encode()


def test_a_signature_over_another_body_decides_nothing(slack: SlackServer, dora: Any, tmp_path: Path) -> None:
    call = suspend(tmp_path)
    ts = str(int(time.time()))
    signed_for = payload_body(call, value=f"{call.pk}:{'0' * 64}")  # a body the attacker could get signed
    sent = payload_body(call)
    response = signed_post(sent, {"X-Slack-Request-Timestamp": ts,
                                  "X-Slack-Signature": slack_signature(SIGNING, ts, signed_for)})
    assert response.status_code == 401
    untouched(call, tmp_path)
    assert slack.calls("users.info") == []


@pytest.mark.parametrize("missing", ["X-Slack-Signature", "X-Slack-Request-Timestamp", "both"])
def test_missing_headers_decide_nothing(slack: SlackServer, dora: Any, tmp_path: Path, missing: str) -> None:
    call = suspend(tmp_path)
    ts = str(int(time.time()))
    body = payload_body(call)
    headers = {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": slack_signature(SIGNING, ts, body)}
    for name in (["X-Slack-Signature", "X-Slack-Request-Timestamp"] if missing == "both" else [missing]):
        del headers[name]
    assert signed_post(body, headers).status_code == 401
    untouched(call, tmp_path)
    assert slack.calls("users.info") == []


@pytest.mark.parametrize("timestamp", ["not a number", "", "1e3", "-1", "99999999999999999999999"])
def test_a_malformed_timestamp_is_refused_cleanly(slack: SlackServer, dora: Any, tmp_path: Path, timestamp: str) -> None:
    call = suspend(tmp_path)
    body = payload_body(call)
    response = signed_post(body, {"X-Slack-Request-Timestamp": timestamp,
                                  "X-Slack-Signature": slack_signature(SIGNING, timestamp, body)})
    assert response.status_code == 401
    untouched(call, tmp_path)


@pytest.mark.parametrize("offset", [-301, 301, 86400 * 365])
def test_late_and_future_dated_requests_decide_nothing(slack: SlackServer, dora: Any, tmp_path: Path,
                                                       offset: int) -> None:
    call = suspend(tmp_path)
    response = click(call, slack, timestamp=int(time.time()) + offset)
    assert response.status_code == 401 and b"timestamp" in response.content
    untouched(call, tmp_path)
    assert slack.calls("users.info") == []


def test_a_replay_of_an_accepted_approval_decides_nothing_more(slack: SlackServer, dora: Any, tmp_path: Path) -> None:
    """The same signed bytes again: refused as a replay before the body is read (nobody looked up)."""
    call = suspend(tmp_path)
    ts = int(time.time())
    assert click(call, slack, timestamp=ts, action_ts="5.5").status_code == 200
    assert Decision.objects.count() == 1
    looked_up = len(slack.calls("users.info"))
    replay = click(call, slack, timestamp=ts, action_ts="5.5")
    assert replay.status_code == 401 and b"replay" in replay.content
    assert Decision.objects.count() == 1 and len(slack.calls("users.info")) == looked_up


def test_an_inactive_user_decides_nothing(slack: SlackServer, dora: Any, tmp_path: Path) -> None:
    dora.is_active = False
    dora.save()
    call = suspend(tmp_path)
    assert click(call, slack).status_code == 200
    untouched(call, tmp_path)
    [told] = slack.ephemeral
    assert told["user"] == "U1" and "no active account" in told["text"]
    assert buttons(message_of(slack, call))


def test_an_email_nobody_has_or_two_people_share_decides_nothing(slack: SlackServer, dora: Any, tmp_path: Path) -> None:
    slack.users["U9"] = {"id": "U9", "is_email_confirmed": True, "profile": {"email": "stranger@example.com"}}
    twin = make_user("dora2", "nexo_django.decide_toolcall")
    twin.email = "DORA@example.com"  # the same address, another case: nobody
    twin.save()
    call = suspend(tmp_path)
    assert click(call, slack, user="U9").status_code == 200
    assert click(call, slack, user="U1").status_code == 200
    assert click(call, slack, user="U404").status_code == 200  # Slack says user_not_found
    untouched(call, tmp_path)
    assert len(slack.ephemeral) == 3 and all("nothing was decided" in e["text"].lower() for e in slack.ephemeral)


def test_a_user_whose_slack_profile_has_no_email_decides_nothing(slack: SlackServer, dora: Any, tmp_path: Path) -> None:
    slack.users["U1"] = {"id": "U1", "is_email_confirmed": True, "profile": {}}
    call = suspend(tmp_path)
    assert click(call, slack).status_code == 200
    untouched(call, tmp_path)


@pytest.mark.parametrize("value", ["", "garbage", "notanint:abc", "999999:" + "0" * 64, "1:2:3",
                                   "99999999999999999999999999:x"])
def test_a_button_value_that_names_no_call_is_refused_cleanly(slack: SlackServer, dora: Any, tmp_path: Path,
                                                              value: str) -> None:
    call = suspend(tmp_path)
    response = click(call, slack, body=payload_body(call, value=value))
    assert response.status_code in (200, 400), response.content
    untouched(call, tmp_path)


@pytest.mark.parametrize("body", [b"payload=%7Bnot+json", b"payload=%5B%5D", b"payload=null", b"nothing=here",
                                  b"payload=" + b"%5B" * 5000 + b"%5D" * 5000, b"\xff\xfe"])
def test_a_verified_but_malformed_payload_is_refused_cleanly(slack: SlackServer, dora: Any, tmp_path: Path,
                                                              body: bytes) -> None:
    call = suspend(tmp_path)
    response = click(call, slack, body=body)
    assert response.status_code == 400, (response.status_code, response.content[:200])
    untouched(call, tmp_path)


def test_a_stale_digest_after_the_arguments_changed_decides_nothing(slack: SlackServer, dora: Any,
                                                                     tmp_path: Path) -> None:
    """The message showed "hi"; the stored arguments now say something else: the button's digest is
    that of what was shown, so the click is refused and the new content is never written."""
    call = suspend(tmp_path)
    shown = call.digest
    changed = {"path": "notes.txt", "content": "not what you saw"}
    ToolCall.objects.filter(pk=call.pk).update(args=changed, digest=args_digest(changed))
    call.refresh_from_db()
    assert click(call, slack, digest=shown).status_code == 200
    untouched(call, tmp_path)
    assert "not the ones you saw" in slack.ephemeral[0]["text"]


def test_a_button_after_another_decision_with_edited_arguments_decides_nothing(
    slack: SlackServer, dora: Any, tmp_path: Path,
) -> None:
    call = suspend(tmp_path)
    shown = call.digest
    ann = make_user("ann", "nexo_django.decide_toolcall")
    call.approve(by=ann, args={"path": "notes.txt", "content": "edited by ann"})
    assert click(call, slack, approve=False, digest=shown).status_code == 200
    decision = Decision.objects.get()
    assert (decision.decided_by, decision.verdict) == (ann, "approved")
    assert (tmp_path / "notes.txt").read_text() == "edited by ann"
    assert ToolCall.objects.get(pk=call.pk).status == CallStatus.SUCCEEDED


def test_two_clicks_racing_in_one_channel_one_decision_one_resume(slack: SlackServer, dora: Any, tmp_path: Path) -> None:
    person(slack, "eve", "U2", "nexo_django.decide_toolcall")
    call = suspend(tmp_path)
    barrier = threading.Barrier(2)
    codes: list[int] = []

    def press(user: str, approve: bool) -> None:
        try:
            barrier.wait(timeout=10)
            codes.append(click(call, slack, user=user, approve=approve).status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=press, args=("U1", True)), threading.Thread(target=press, args=("U2", True))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert codes == [200, 200]
    assert Decision.objects.count() == 1
    call.refresh_from_db()
    assert call.status == CallStatus.SUCCEEDED and call.run.status == RunStatus.DONE
    events = list(RunEvent.objects.filter(run=call.run).values_list("type", flat=True))
    assert events.count("decision") == 1 and events.count("done") == 1, events
    assert (tmp_path / "notes.txt").read_text() == "hi"


@pytest.mark.parametrize("where", ["digest", "team", "user"])
def test_a_nul_in_a_signed_payload_is_refused_cleanly(slack: SlackServer, dora: Any, tmp_path: Path, where: str) -> None:
    """PostgreSQL's text refuses NUL: a NUL in what the payload names (the digest, the team or the
    user) must be refused as a bad request, never reach a query as a raw database error."""
    call = suspend(tmp_path)
    team, user, digest = TEAM, "U1", call.digest
    if where == "digest":
        digest = "\x00" + digest[1:]
    elif where == "team":
        team = "T\x00"
    else:
        user = "U1\x00"
        slack.users[user] = slack.users["U1"]
    payload = {"type": "block_actions", "user": {"id": user, "team_id": team}, "team": {"id": team},
               "actions": [{"action_id": "nexo_approve", "type": "button", "value": f"{call.pk}:{digest}",
                            "action_ts": f"{time.time():.6f}"}]}
    response = click(call, slack, body=urlencode({"payload": json.dumps(payload)}).encode())
    assert response.status_code in (200, 400), (response.status_code, response.content[:300])
    untouched(call, tmp_path)


@pytest.mark.parametrize("respell", ["leading zero", "plus sign", "spaces"])
def test_a_replay_with_its_timestamp_respelled_is_refused(slack: SlackServer, dora: Any, tmp_path: Path,
                                                         respell: str) -> None:
    call = suspend(tmp_path)
    slack.users.clear()  # the first request is accepted and decides nothing (an unknown person)
    body = payload_body(call)
    ts = str(int(time.time()))
    signature = slack_signature(SIGNING, ts, body)
    assert signed_post(body, {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": signature}).status_code == 200
    person(slack, "dora2", "U1", "nexo_django.decide_toolcall")
    dora.email = "someone-else@example.com"
    dora.save()
    other = {"leading zero": "0" + ts, "plus sign": "+" + ts, "spaces": f" {ts} "}[respell]
    response = signed_post(body, {"X-Slack-Request-Timestamp": other, "X-Slack-Signature": signature})
    assert response.status_code == 401
    untouched(call, tmp_path)


def test_the_same_request_twice_at_once_is_taken_once(slack: SlackServer, dora: Any, tmp_path: Path) -> None:
    call = suspend(tmp_path)
    body = payload_body(call)
    ts = str(int(time.time()))
    headers = {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": slack_signature(SIGNING, ts, body)}
    barrier = threading.Barrier(2)
    codes: list[int] = []

    def send() -> None:
        try:
            barrier.wait(timeout=10)
            codes.append(signed_post(body, headers).status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(codes) == [200, 401] and Decision.objects.count() == 1
