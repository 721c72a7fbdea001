"""The webhook channel's decisions: a signed POST from another system decides through the admin's
checks, only when DECIDE is on (scripted agents; its notices are in tests/durable/test_outbox.py)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.test import Client

from nexo_django.channels.signing import sign
from nexo_django.models import CallStatus, Decision, RunStatus, ToolCall
from tests.admin.support import make_user
from tests.channel_servers import SlackServer, WebhookReceiver
from tests.channels.test_slack import buttons, click, message_of, slack_channel, text_of
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SECRET = "whsec-decide"


@pytest.fixture
def receiver(settings: Any) -> Any:
    with WebhookReceiver(SECRET) as server:
        settings.NEXO = {"CHANNELS": {"hook": {"BACKEND": "webhook", "URL": server.url, "SECRET": SECRET,
                                               "ALLOW_PRIVATE": ["127.0.0.1"], "DECIDE": True}}}
        yield server


@pytest.fixture
def dora() -> Any:
    return make_user("dora", "nexo_django.decide_toolcall")


def post(body: dict[str, Any] | bytes, *, secret: str = SECRET, timestamp: int | None = None,
         header: str | None = None) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    signature = header if header is not None else sign(secret, raw, timestamp)
    return Client().post("/nexo/channels/hook/", raw, content_type="application/json",
                         headers={"X-Nexo-Signature": signature})


def decision_body(call: ToolCall, **change: Any) -> dict[str, Any]:
    return {"call": call.pk, "digest": call.digest, "verdict": "approve", "user": "dora", **change}


def suspend(tmp_path: Path, user: Any = None) -> ToolCall:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return Scribe.run("write", cwd=tmp_path, user=user).pending_calls().get()


def nothing_decided(call: ToolCall) -> None:
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()


def test_a_signed_approval_runs_the_call_once(receiver: WebhookReceiver, dora: Any, tmp_path: Path) -> None:
    call = suspend(tmp_path)
    response = post(decision_body(call, note="ok by ticket 42"))
    assert response.status_code == 200 and response.json()["source"] == "hook"
    decision = Decision.objects.get()
    assert (decision.decided_by, decision.channel_user, decision.note) == (dora, "webhook:dora", "ok by ticket 42")
    call.refresh_from_db()
    assert call.status == CallStatus.SUCCEEDED and call.run.status == RunStatus.DONE
    assert (tmp_path / "notes.txt").read_text() == "hi"
    again = post(decision_body(call))  # a second, freshly signed request: already decided
    assert again.status_code == 409 and Decision.objects.count() == 1


@pytest.mark.parametrize("how", ["forged", "old", "unsigned"])
def test_unverified_requests_are_refused_before_they_are_read(receiver: WebhookReceiver, dora: Any, tmp_path: Path,
                                                              how: str) -> None:
    call = suspend(tmp_path)
    body = decision_body(call)
    response = {"forged": lambda: post(body, secret="guess"),
                "old": lambda: post(body, timestamp=int(time.time()) - 301),
                "unsigned": lambda: post(body, header="")}[how]()
    assert response.status_code == 401
    nothing_decided(call)


def test_the_same_request_twice_is_a_replay(receiver: WebhookReceiver, dora: Any, tmp_path: Path) -> None:
    call = suspend(tmp_path)
    raw = json.dumps(decision_body(call, digest="0" * 64)).encode()  # refused, but accepted as a request
    header = sign(SECRET, raw)
    assert post(raw, header=header).status_code == 409
    assert post(raw, header=header).status_code == 401
    nothing_decided(call)


def test_no_permission_four_eyes_and_a_stale_digest_decide_nothing(receiver: WebhookReceiver, dora: Any,
                                                                   tmp_path: Path, settings: Any) -> None:
    make_user("vic", "nexo_django.view_pendingapproval")
    call = suspend(tmp_path)
    assert post(decision_body(call, user="vic")).status_code == 403
    assert post(decision_body(call, user="nobody")).status_code == 403
    assert post(decision_body(call, digest="0" * 64)).status_code == 409
    nothing_decided(call)
    settings.NEXO = {**settings.NEXO, "SELF_APPROVAL": False}
    mine = suspend(tmp_path / "mine", user=dora)
    response = post(decision_body(mine))
    assert response.status_code == 403 and "SELF_APPROVAL" in response.json()["error"]
    assert not Decision.objects.exists()


def test_without_decide_the_channel_takes_no_decisions(receiver: WebhookReceiver, dora: Any, tmp_path: Path,
                                                       settings: Any) -> None:
    settings.NEXO = {"CHANNELS": {"hook": {**settings.NEXO["CHANNELS"]["hook"], "DECIDE": False}}}
    call = suspend(tmp_path)
    assert post(decision_body(call)).status_code == 401
    nothing_decided(call)


def test_slack_and_a_webhook_racing_one_decision_the_slack_message_updated(
    receiver: WebhookReceiver, dora: Any, tmp_path: Path, settings: Any,
) -> None:
    dora.email = "dora@example.com"
    dora.save()
    with SlackServer() as slack:
        slack.users["U1"] = {"id": "U1", "is_email_confirmed": True, "profile": {"email": "dora@example.com"}}
        settings.NEXO = {"CHANNELS": {**settings.NEXO["CHANNELS"], "ops": slack_channel(slack)}}
        call = suspend(tmp_path)
        barrier = threading.Barrier(2)
        codes: dict[str, int] = {}

        def press(where: str) -> None:
            try:
                barrier.wait(timeout=10)
                codes[where] = (click(call, slack) if where == "slack" else post(decision_body(call, verdict="deny"))).status_code
            finally:
                connections.close_all()

        threads = [threading.Thread(target=press, args=(w,)) for w in ("slack", "hook")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        decision = Decision.objects.get()
        assert codes["slack"] == 200 and codes["hook"] == (200 if decision.source == "hook" else 409)
        message = message_of(slack, call)
        verdict = "Approved" if decision.verdict == "approved" else "Denied"
        assert buttons(message) == [] and f"{verdict} by dora" in text_of(message) and decision.source in text_of(message)
    types = [e["type"] for e in receiver.posts]
    assert types.count("approval.decided") == 1 and receiver.posts[types.index("approval.decided")]["decision"][
        "source"] == decision.source
