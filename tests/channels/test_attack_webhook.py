"""Attacks on the webhook channel (issue 45 item 4). Deciding: altered, future-dated, replayed and
malformed signed requests, people who may not decide, bodies too big or too deep; each checks that
nothing was decided (no ``Decision``, the call waiting, its file unwritten). Sending: receivers on
loopback, private and link-local addresses by any spelling or DNS answer, behind a redirect, or
failing for ever; each checks that a loopback listener received no connection, or that retries
are bounded. Scripted agents."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from nexo_django.channels.signing import sign
from nexo_django.core.tools import netguard
from nexo_django.durable.recovery import reconcile
from nexo_django.models import CallStatus, Decision, Notice, NoticeStatus, RunStatus, ToolCall
from tests.admin.support import make_user
from tests.channel_servers import RawListener, WebhookReceiver
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SECRET = "whsec-attack"


@pytest.fixture
def deciding(settings: Any) -> Any:
    with WebhookReceiver(SECRET) as server:
        settings.NEXO = {"CHANNELS": {"hook": {"BACKEND": "webhook", "URL": server.url, "SECRET": SECRET,
                                               "ALLOW_PRIVATE": ["127.0.0.1"], "DECIDE": True}}}
        yield server


@pytest.fixture
def dora() -> Any:
    return make_user("dora", "nexo_django.decide_toolcall")


def post(raw: bytes, header: str | None) -> Any:
    headers = {"X-Nexo-Signature": header} if header is not None else {}
    return Client().post("/nexo/channels/hook/", raw, content_type="application/json", headers=headers)


def body(target: ToolCall, **change: Any) -> bytes:
    fields = {"call": target.pk, "digest": target.digest, "verdict": "approve", "user": "dora"}
    return json.dumps({**fields, **change}).encode()


def suspend(tmp_path: Path, user: Any = None) -> ToolCall:
    tmp_path.mkdir(parents=True, exist_ok=True)
    run = Scribe.run("write", cwd=tmp_path, user=user)
    assert run.status == RunStatus.SUSPENDED
    return run.pending_calls().get()


def untouched(call: ToolCall, tmp_path: Path) -> None:
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()
    assert call.run.status == RunStatus.SUSPENDED and not (tmp_path / "notes.txt").exists()


# --- deciding from a webhook ----------------------------------------------------------------

def test_a_signature_over_another_body_decides_nothing(deciding: WebhookReceiver, dora: Any, tmp_path: Path) -> None:
    call = suspend(tmp_path)
    signed = body(call, verdict="deny")
    altered = body(call)
    assert post(altered, sign(SECRET, signed)).status_code == 401
    assert post(signed + b" ", sign(SECRET, signed)).status_code == 401  # one byte added
    untouched(call, tmp_path)


@pytest.mark.parametrize("offset", [301, 86400 * 365, -86400])
def test_future_dated_and_late_requests_decide_nothing(deciding: WebhookReceiver, dora: Any, tmp_path: Path,
                                                       offset: int) -> None:
    call = suspend(tmp_path)
    raw = body(call)
    assert post(raw, sign(SECRET, raw, int(time.time()) + offset)).status_code == 401
    untouched(call, tmp_path)


@pytest.mark.parametrize("header", [None, "", "t=,v1=", "v1=abc", "t=1", "t=abc,v1=00", "garbage",
                                    "t=99999999999999999999999999,v1=00", "t=1e9,v1=00"])
def test_missing_and_malformed_signatures_are_refused_cleanly(deciding: WebhookReceiver, dora: Any, tmp_path: Path,
                                                              header: str | None) -> None:
    call = suspend(tmp_path)
    assert post(body(call), header).status_code == 401
    untouched(call, tmp_path)


def test_a_replay_of_an_accepted_approval_is_refused(deciding: WebhookReceiver, dora: Any, tmp_path: Path) -> None:
    call = suspend(tmp_path)
    raw = body(call)
    header = sign(SECRET, raw)
    assert post(raw, header).status_code == 200
    assert post(raw, header).status_code == 401
    assert Decision.objects.count() == 1


def test_an_inactive_user_decides_nothing(deciding: WebhookReceiver, dora: Any, tmp_path: Path) -> None:
    dora.is_active = False
    dora.save()
    call = suspend(tmp_path)
    raw = body(call)
    assert post(raw, sign(SECRET, raw)).status_code == 403
    untouched(call, tmp_path)


def test_the_requester_decides_nothing_under_four_eyes(deciding: WebhookReceiver, dora: Any, tmp_path: Path,
                                                        settings: Any) -> None:
    settings.NEXO = {**settings.NEXO, "SELF_APPROVAL": False}
    call = suspend(tmp_path, user=dora)
    for verdict in ("approve", "deny"):
        raw = body(call, verdict=verdict)
        assert post(raw, sign(SECRET, raw)).status_code == 403
    untouched(call, tmp_path)


def test_an_expired_call_and_a_decided_one_decide_nothing_more(deciding: WebhookReceiver, dora: Any,
                                                                tmp_path: Path) -> None:
    call = suspend(tmp_path)
    ToolCall.objects.filter(pk=call.pk).update(expires_at=timezone.now())
    raw = body(call)
    assert post(raw, sign(SECRET, raw)).status_code == 409
    untouched(call, tmp_path)


@pytest.mark.parametrize("change", [
    {"call": "1 OR 1=1"}, {"call": None}, {"call": 10**30}, {"call": [1]}, {"call": 1.5}, {"verdict": "maybe"},
    {"verdict": None}, {"digest": None}, {"digest": 5}, {"user": None}, {"user": {"username": "dora"}},
    {"user": "x" * 100_000}, {"user": "dora\x00"}, {"digest": "\x00"},
])
def test_a_signed_body_of_the_wrong_shape_is_refused_cleanly(deciding: WebhookReceiver, dora: Any, tmp_path: Path,
                                                              change: dict[str, Any]) -> None:
    call = suspend(tmp_path)
    raw = body(call, **change)
    response = post(raw, sign(SECRET, raw))
    assert response.status_code in (400, 403, 404, 409), (response.status_code, response.content[:300])
    untouched(call, tmp_path)


@pytest.mark.parametrize("note", ["\x00 a NUL", "\ud800 a lone surrogate", "\u202e reversed", "x" * 5000],
                         ids=["nul", "surrogate", "bidi", "long"])
def test_a_hostile_note_is_stored_faithfully_or_refused_never_a_raw_error(deciding: WebhookReceiver, dora: Any,
                                                                         tmp_path: Path, note: str) -> None:
    call = suspend(tmp_path)
    raw = body(call, note=note)
    response = post(raw, sign(SECRET, raw))
    if response.status_code == 200:
        assert Decision.objects.get().note == note[:2000]
    else:
        assert response.status_code == 400, (response.status_code, response.content[:300])
        untouched(call, tmp_path)


@pytest.mark.parametrize("what", ["not json", "a list", "too deep", "too big", "bad utf-8", "lone surrogate"])
def test_a_signed_body_that_is_not_a_readable_object_is_refused_cleanly(deciding: WebhookReceiver, dora: Any,
                                                                         tmp_path: Path, what: str) -> None:
    call = suspend(tmp_path)
    raw = {"not json": b"{nope", "a list": b"[1, 2]", "too deep": b"[" * 100_000 + b"]" * 100_000,
           "too big": json.dumps({"call": call.pk, "note": "x" * 2_000_000}).encode(), "bad utf-8": b'{"a": "\xff"}',
           "lone surrogate": b'{"call": 1, "user": "\\ud800"}'}[what]
    response = post(raw, sign(SECRET, raw))
    assert response.status_code in (400, 403, 413), (response.status_code, response.content[:300])
    untouched(call, tmp_path)


# --- sending: where the app may connect -------------------------------------------------------

def hook_to(settings: Any, url: str, **options: Any) -> None:
    settings.NEXO = {"CHANNELS": {"audit": {"BACKEND": "webhook", "URL": url, "SECRET": SECRET, **options}}}


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1", "0x7f.1", "0x7f000001", "2130706433", "0177.0.0.1",
                                  "localhost", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "0.0.0.0", "127.0.0.1.",
                                  "LOCALHOST"])
def test_a_receiver_on_loopback_by_any_spelling_is_not_reached(settings: Any, tmp_path: Path, host: str) -> None:
    with RawListener(b"HTTP/1.1 204 No Content\r\n\r\n") as listener:
        hook_to(settings, listener.url(host))
        Scribe.run("write", cwd=tmp_path)
        notice = Notice.objects.get()
        assert notice.status == NoticeStatus.PENDING and notice.last_error, notice.last_error
        reconcile(now=timezone.now() + timedelta(hours=2), log_warnings=False)
        assert listener.connections == 0


@pytest.mark.parametrize("answers", [["127.0.0.1"], ["93.184.215.14", "127.0.0.1"], ["::ffff:127.0.0.1"],
                                     ["169.254.169.254"], ["10.0.0.1"], ["fe80::1"], ["::1"], ["0.0.0.0"]])
def test_a_name_that_resolves_to_a_private_address_is_not_reached(settings: Any, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 answers: list[str]) -> None:
    """The resolver seam answers as a hostile DNS server would (a rebinding name, mixed answers)."""
    asked: list[str] = []

    def hostile(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers

    monkeypatch.setattr(netguard, "resolver", hostile)
    with RawListener(b"HTTP/1.1 204 No Content\r\n\r\n") as listener:
        # Listed by its address, the loopback listener would be allowed; the name is not listed.
        hook_to(settings, listener.url("hooks.example.com"), ALLOW_PRIVATE=["127.0.0.1"])
        Scribe.run("write", cwd=tmp_path)
        notice = Notice.objects.get()
        assert notice.status == NoticeStatus.PENDING and "hooks.example.com" in notice.last_error, notice.last_error
        assert listener.connections == 0
    assert asked  # the name was looked up through the seam, at connection time


def test_link_local_is_never_reached_even_when_named(settings: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netguard, "resolver", lambda host, port: ["169.254.169.254"])
    hook_to(settings, "http://metadata.internal/latest/", ALLOW_PRIVATE=["metadata.internal", "169.254.169.254"])
    Scribe.run("write", cwd=tmp_path)
    notice = Notice.objects.get()
    assert notice.status == NoticeStatus.PENDING and "169.254.169.254" in notice.last_error, notice.last_error


@pytest.mark.parametrize("target", ["second listener", "metadata", "metadata by name"])
def test_a_redirect_is_not_followed(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    target: str) -> None:
    """An allowed receiver answers 302 to another address: the app does not go there (the second
    loopback listener, on the same allowed host, receives no connection) and the notice is not
    delivered."""
    monkeypatch.setattr(netguard, "resolver", lambda host, port: ["169.254.169.254"])
    with RawListener() as second:
        location = {"second listener": second.url(), "metadata": "http://169.254.169.254/latest/meta-data/",
                    "metadata by name": "http://metadata.internal/latest/"}[target]
        redirect = f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode()
        with RawListener(redirect) as first:
            hook_to(settings, first.url(), ALLOW_PRIVATE=["127.0.0.1"])
            Scribe.run("write", cwd=tmp_path)
            notice = Notice.objects.get()
            assert first.connections == 1
            assert notice.status == NoticeStatus.PENDING and "302" in notice.last_error, notice.last_error
        assert second.connections == 0


def test_a_receiver_failing_for_ever_is_tried_max_attempts_times_then_failed(settings: Any, tmp_path: Path) -> None:
    with RawListener(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope") as dead:
        hook_to(settings, dead.url(), ALLOW_PRIVATE=["127.0.0.1"])  # MAX_ATTEMPTS: the default, 12
        Scribe.run("write", cwd=tmp_path)
        start = timezone.now()
        for day in range(1, 20):  # far more rounds than attempts, each past the longest backoff
            reconcile(now=start + timedelta(hours=2 * day), log_warnings=False)
        notice = Notice.objects.get()
        assert notice.status == NoticeStatus.FAILED and notice.attempts == 12
        assert "HTTP 500" in notice.last_error, notice.last_error
        assert dead.connections == 12


@pytest.mark.parametrize("variant", ["extra v1", "spaces", "reordered", "leading zero", "plus sign", "extra field"])
def test_a_replay_with_its_signature_header_respelled_is_refused(deciding: WebhookReceiver, dora: Any,
                                                                 tmp_path: Path, variant: str) -> None:
    """The same signed body and timestamp, its header written another way that still verifies: a
    replay all the same (the first request was refused, so a second that got through would decide)."""
    call = suspend(tmp_path)
    raw = body(call, user="nobody")  # accepted as a request; decides nothing (no such person)
    header = sign(SECRET, raw)
    t, v1 = header.split(",")
    assert post(raw, header).status_code == 403
    respelled = {"extra v1": f"{header},v1={'0' * 64}", "spaces": f" {t} , {v1} ", "reordered": f"{v1},{t}",
                 "leading zero": f"t=0{t[2:]},{v1}", "plus sign": f"t=+{t[2:]},{v1}",
                 "extra field": f"{header},v0=x"}[variant]
    make_user("nobody", "nexo_django.decide_toolcall")  # had the replay been taken, it would now decide
    response = post(raw, respelled)
    assert response.status_code == 401 and b"replay" in response.content, response.content
    untouched(call, tmp_path)
