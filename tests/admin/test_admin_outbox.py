"""The outbox in the admin: failed notices with their last error, sent again by a decider only."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from nexo_django.models import Notice, NoticeStatus
from tests.admin.support import approver, make_user, viewer
from tests.channel_servers import WebhookReceiver

pytestmark = pytest.mark.django_db

LIST = "/admin/nexo_django/notice/"


def failed_notice(receiver: WebhookReceiver) -> Notice:
    return Notice.objects.create(channel="audit", kind="run.done", key="run.done:x::audit", status=NoticeStatus.FAILED,
                                 attempts=12, next_attempt_at=timezone.now(), created_at=timezone.now(),
                                 last_error="DeliveryFailed: POST http://127.0.0.1/hook: HTTP 500 <b>boom</b>")


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_failed_notices_are_listed_with_their_last_error_escaped(settings: Any) -> None:
    failed_notice(WebhookReceiver("s"))
    page = logged_in(viewer()).get(LIST + "?status=failed").content.decode()
    assert "run.done" in page and "HTTP 500 &lt;b&gt;boom&lt;/b&gt;" in page and "<b>boom" not in page


def test_a_decider_sends_a_failed_notice_again(settings: Any, django_capture_on_commit_callbacks: Any) -> None:
    with WebhookReceiver("s") as receiver:
        settings.NEXO = {"CHANNELS": {"audit": {"BACKEND": "webhook", "URL": receiver.url, "SECRET": "s",
                                                "ALLOW_PRIVATE": ["127.0.0.1"]}}}
        notice = failed_notice(receiver)
        with django_capture_on_commit_callbacks(execute=True):
            response = logged_in(approver()).post(LIST, {"action": "retry", "_selected_action": [notice.pk]})
        assert response.status_code == 302
    notice.refresh_from_db()
    assert notice.status == NoticeStatus.DELIVERED and [e["id"] for e in receiver.posts] == [notice.key]


def test_someone_who_may_not_decide_cannot_send_again(settings: Any) -> None:
    notice = failed_notice(WebhookReceiver("s"))
    staff = make_user("sam", "nexo_django.view_notice")
    logged_in(staff).post(LIST, {"action": "retry", "_selected_action": [notice.pk]})
    notice.refresh_from_db()
    assert notice.status == NoticeStatus.FAILED and notice.attempts == 12
