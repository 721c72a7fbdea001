"""Attacks on the outbox's delivery (issue 45 item 4): a receiver that asks to be left alone for a
year (``Retry-After``), one that answers byte by byte, one that never answers. The notice must be
tried again within the documented hour, and no delivery may hold the process past the channel's
``TIMEOUT`` (measured here). Loopback listeners; scripted agents."""

from __future__ import annotations

import time
from datetime import timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from nexo_django.durable.recovery import reconcile
from nexo_django.models import Notice, NoticeStatus, RunStatus
from tests.channel_servers import RawListener, SlackServer
from tests.channels.test_slack import slack_channel
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SECRET = "whsec-outbox-attack"
HOUR = timedelta(hours=1)
YEAR = 365 * 86400


def hook(settings: Any, listener: RawListener, **options: Any) -> None:
    settings.NEXO = {"CHANNELS": {"audit": {"BACKEND": "webhook", "URL": listener.url(), "SECRET": SECRET,
                                            "ALLOW_PRIVATE": ["127.0.0.1"], **options}}}


def year_later() -> str:
    return format_datetime(timezone.now() + timedelta(days=365), usegmt=True)


@pytest.mark.parametrize("retry_after", [str(YEAR), "99999999999999999999", "1e400", "inf", "nan", "year", "-5"],
                         ids=["seconds", "huge", "over a float", "inf", "nan", "garbage", "negative"])
def test_a_retry_after_of_a_year_is_capped_at_the_hour(settings: Any, tmp_path: Path, retry_after: str) -> None:
    answer = f"HTTP/1.1 503 Service Unavailable\r\nRetry-After: {retry_after}\r\nContent-Length: 0\r\n\r\n".encode()
    with RawListener(answer) as listener:
        hook(settings, listener)
        before = timezone.now()
        Scribe.run("write", cwd=tmp_path)
        notice = Notice.objects.get()
        assert notice.status == NoticeStatus.PENDING and notice.attempts == 1 and "503" in notice.last_error
        assert notice.next_attempt_at <= timezone.now() + HOUR, notice.next_attempt_at - before
        # Tried again within the hour's reach, not a year later.
        reconcile(now=before + HOUR + timedelta(minutes=1), log_warnings=False)
        notice.refresh_from_db()
        assert notice.attempts == 2 and listener.connections == 2


def test_a_hostile_retry_after_fails_neither_the_caller_nor_the_other_channels(settings: Any, tmp_path: Path) -> None:
    """Retry-After: 1e20 once raised OverflowError out of the delivery: out of ``Scribe.run`` (the
    notices go at commit, in this process) and out of the reconciler's round, so no other notice
    of the round went out."""
    answer = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 99999999999999999999\r\nContent-Length: 0\r\n\r\n"
    good = b"HTTP/1.1 204 No Content\r\n\r\n"
    with RawListener(answer) as hostile, RawListener(good) as fine:
        channels = {name: {"BACKEND": "webhook", "URL": listener.url(), "SECRET": SECRET, "ALLOW_PRIVATE": ["127.0.0.1"]}
                    for name, listener in (("a-hostile", hostile), ("b-fine", fine))}
        settings.NEXO = {"CHANNELS": channels}
        run = Scribe.run("write", cwd=tmp_path)
        assert run.status == RunStatus.SUSPENDED
        assert Notice.objects.get(channel="b-fine").status == NoticeStatus.DELIVERED
        assert Notice.objects.get(channel="a-hostile").status == NoticeStatus.PENDING
        run.pending_calls().get().approve()  # two more notices each; the reconciler's round too
        reconcile(now=timezone.now() + HOUR + timedelta(minutes=1), log_warnings=False)
    assert set(Notice.objects.filter(channel="b-fine").values_list("status", flat=True)) == {NoticeStatus.DELIVERED}
    assert Notice.objects.filter(channel="b-fine").count() == 3


def test_a_retry_after_date_a_year_ahead_is_capped_at_the_hour(settings: Any, tmp_path: Path) -> None:
    answer = f"HTTP/1.1 429 Too Many Requests\r\nRetry-After: {year_later()}\r\nContent-Length: 0\r\n\r\n".encode()
    with RawListener(answer) as listener:
        hook(settings, listener)
        Scribe.run("write", cwd=tmp_path)
        notice = Notice.objects.get()
        assert notice.status == NoticeStatus.PENDING and notice.next_attempt_at <= timezone.now() + HOUR


def test_slacks_retry_after_of_a_year_is_capped_at_the_hour(settings: Any, tmp_path: Path) -> None:
    with SlackServer() as slack:
        settings.NEXO = {"CHANNELS": {"ops": slack_channel(slack)}}
        slack.rate_limited = 1
        original = slack.handle

        def year(handler: Any, body: bytes) -> Any:
            status, headers, answer = original(handler, body)
            return status, ({"Retry-After": str(YEAR)} if status == 429 else headers), answer

        slack.handle = year  # type: ignore[method-assign]
        Scribe.run("write", cwd=tmp_path)
        notice = Notice.objects.get()
        assert notice.status == NoticeStatus.PENDING and notice.next_attempt_at <= timezone.now() + HOUR


@pytest.mark.parametrize("how", ["byte by byte", "headers byte by byte", "never"])
def test_a_slow_receiver_does_not_hold_the_process_past_the_timeout(settings: Any, tmp_path: Path, how: str) -> None:
    """TIMEOUT is the total of one request: a receiver dripping one byte every 0.2 s (each read
    well within any per-read timeout) or never answering is cut off at it."""
    body = b"x" * 1000
    script = {"byte by byte": b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + body,
              "headers byte by byte": b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"y" * 500 + b"\r\n\r\n",
              "never": b""}[how]
    drip = None if how == "never" else 0.2
    with RawListener(script, drip=drip, hold=60) as listener:
        hook(settings, listener, TIMEOUT=2)
        started = time.monotonic()
        run = Scribe.run("write", cwd=tmp_path)  # delivers at commit, in this process
        held = time.monotonic() - started
        assert run.status == RunStatus.SUSPENDED
        notice = Notice.objects.get()
        assert notice.status == NoticeStatus.PENDING and notice.last_error, notice.last_error
        assert listener.connections == 1
        print(f"{how}: the suspending call returned after {held:.2f}s (TIMEOUT 2)")
        assert held < 2 + 2.5, f"held {held:.1f}s past a 2 s TIMEOUT"
        started = time.monotonic()
        reconcile(now=timezone.now() + HOUR, log_warnings=False)  # the reconciler's attempt: the same bound
        held = time.monotonic() - started
        print(f"{how}: the reconciler's attempt returned after {held:.2f}s")
        assert held < 2 + 2.5 and listener.connections == 2
