"""A delivery that dies between its send and its record (scripted agents, loopback receivers):
the reconciler sends it again, and the receiver sees it once — a webhook by the same
idempotency key, a Slack post found by its message metadata instead of posted twice."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from nexo_django.channels import slack as slack_channel
from nexo_django.durable import outbox
from nexo_django.models import Notice, NoticeStatus, RunStatus
from tests.channel_servers import SlackServer, WebhookReceiver
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SECRET = "whsec-test"


class Crash(BaseException):
    """The process dies here (nothing of the app catches it, as nothing survives a SIGKILL)."""


def crash(*args: Any) -> None:
    raise Crash


def slack_options(server: SlackServer) -> dict[str, Any]:
    return {"BACKEND": "slack", "TOKEN": server.token, "SIGNING_SECRET": "s", "CHANNEL": "C0001",
            "BASE_URL": server.base_url, "ALLOW_PRIVATE": ["127.0.0.1"], "EVENTS": ["approval.requested"]}


def suspend_with_receiver_down(tmp_path: Path) -> Notice:
    """A run suspends while nothing listens at the receiver's port: its request notice waits."""
    run = Scribe.run("write a note", cwd=tmp_path)
    assert run.status == RunStatus.SUSPENDED
    notice = Notice.objects.get(kind="approval.requested")
    assert notice.status == NoticeStatus.PENDING and notice.attempts == 1
    return notice


def deliver_and_crash(monkeypatch: pytest.MonkeyPatch, at: Any) -> None:
    """The reconciler at ``at`` sends the notice and dies before recording it."""
    with monkeypatch.context() as patched:
        patched.setattr(outbox, "record_delivered", crash)
        with pytest.raises(Crash):
            outbox.deliver_due(now=at)
    notice = Notice.objects.get(kind="approval.requested")
    assert notice.status == NoticeStatus.PENDING  # the send is not recorded: it will be sent again


def test_a_webhook_receiver_gets_the_same_key_when_a_crash_lost_the_record(
        settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = WebhookReceiver(SECRET)
    settings.NEXO = {"CHANNELS": {"audit": {"BACKEND": "webhook", "URL": receiver.url, "SECRET": SECRET,
                                            "ALLOW_PRIVATE": ["127.0.0.1"], "EVENTS": ["approval.requested"]}}}
    notice = suspend_with_receiver_down(tmp_path)
    later = timezone.now() + timedelta(minutes=5)
    with receiver:
        deliver_and_crash(monkeypatch, later)
        assert [e["id"] for e in receiver.posts] == [notice.key]
        # Its claim expires; the reconciler sends it again.
        assert outbox.deliver_due(now=later + outbox.CLAIM + timedelta(seconds=1)) == {notice.key: "delivered"}
    assert [e["id"] for e in receiver.posts] == [notice.key, notice.key]  # the same key both times
    assert list(receiver.received) == [notice.key]  # so a receiver that honours it saw one event
    notice.refresh_from_db()
    assert notice.status == NoticeStatus.DELIVERED


def test_a_slack_post_whose_record_a_crash_lost_is_found_by_its_metadata_not_posted_twice(
        settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = SlackServer()
    settings.NEXO = {"CHANNELS": {"ops": slack_options(server)}}
    notice = suspend_with_receiver_down(tmp_path)
    later = timezone.now() + timedelta(minutes=5)
    with server:
        deliver_and_crash(monkeypatch, later)
        assert len(server.messages) == 1
        assert outbox.deliver_due(now=later + outbox.CLAIM + timedelta(seconds=1)) == {notice.key: "delivered"}
        [(where, message)] = server.messages.items()  # posted once
        assert len(server.calls("chat.postMessage")) == 1
        lookup = server.calls("conversations.history")[-1]  # the redelivery's (the first attempt's intent made one too)
        assert lookup["channel"] == "C0001" and lookup["include_all_metadata"] == "true"
    assert message["metadata"] == {"event_type": "nexo_notice", "event_payload": {"key": notice.key}}
    notice.refresh_from_db()
    assert notice.status == NoticeStatus.DELIVERED and notice.receipt == {"channel": where[0], "ts": where[1]}


def test_the_look_up_pages_through_later_messages_and_posts_when_the_post_never_arrived(
        settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The intent was recorded but the post never reached Slack (the receiver was down): the
    look-up reads every page of the window (others posted meanwhile), finds nothing, and posts."""
    monkeypatch.setattr(slack_channel, "LOOKUP_LIMIT", 2)
    server = SlackServer()
    settings.NEXO = {"CHANNELS": {"ops": slack_options(server)}}
    notice = suspend_with_receiver_down(tmp_path)
    assert isinstance((notice.receipt or {}).get("intent"), float)  # recorded before the attempt
    with server:
        for n in range(5):  # other messages in the channel since
            server.messages[("C0001", f"{notice.receipt["intent"] - n - 1:.6f}")] = {"text": f"other {n}"}
        assert outbox.deliver_due(now=timezone.now() + timedelta(minutes=5)) == {notice.key: "delivered"}
        pages = server.calls("conversations.history")
        assert [p.get("cursor") for p in pages] == [None, "next_ts:2", "next_ts:4"]
        assert len(server.calls("chat.postMessage")) == 1


def test_without_the_history_scope_a_notice_with_an_intent_waits_rather_than_posting_twice(
        settings: Any, tmp_path: Path) -> None:
    server = SlackServer()
    server.missing_scope = {"conversations.history"}
    settings.NEXO = {"CHANNELS": {"ops": slack_options(server)}}
    notice = suspend_with_receiver_down(tmp_path)
    with server:
        assert outbox.deliver_due(now=timezone.now() + timedelta(minutes=5)) == {notice.key: "retry"}
        assert server.calls("chat.postMessage") == []
    notice.refresh_from_db()
    assert notice.status == NoticeStatus.PENDING
    assert "missing_scope" in notice.last_error and "channels:history" in notice.last_error


def test_a_post_slack_refused_leaves_no_intent_to_look_up(settings: Any, tmp_path: Path) -> None:
    """Slack answered (a 429 here): nothing was posted, so the next attempt posts without a look-up."""
    with SlackServer() as server:
        server.rate_limited = 1
        settings.NEXO = {"CHANNELS": {"ops": slack_options(server)}}
        run = Scribe.run("write a note", cwd=tmp_path)
        notice = Notice.objects.get(run=run, kind="approval.requested")
        assert notice.status == NoticeStatus.PENDING and notice.receipt is None
        assert outbox.deliver_due(now=timezone.now() + timedelta(minutes=5)) == {notice.key: "delivered"}
        assert server.calls("conversations.history") == [] and len(server.messages) == 1
