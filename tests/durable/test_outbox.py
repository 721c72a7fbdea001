"""The transactional outbox (scripted agents): notices written with the change that causes them,
delivered after the receiver (a loopback webhook receiver) or Redis was down, exactly once."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from nexo_django.durable import outbox
from nexo_django.durable.recovery import reconcile
from nexo_django.models import Notice, NoticeStatus, RunStatus, ToolCall
from tests.channel_servers import WebhookReceiver, wait_for
from tests.durable_agents import Scribe
from tests.servers import free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SECRET = "whsec-test"


def hook(receiver: WebhookReceiver, **options: Any) -> dict[str, Any]:
    return {"CHANNELS": {"audit": {"BACKEND": "webhook", "URL": receiver.url, "SECRET": SECRET,
                                   "ALLOW_PRIVATE": ["127.0.0.1"], **options}}}


def dead_redis(settings: Any) -> None:
    """A queue whose Redis is not there: every job sent is lost (logged), as when Redis is down."""
    settings.RQ_QUEUES = {"default": {"URL": f"redis://127.0.0.1:{free_port()}/0", "SOCKET_TIMEOUT": 0.5}}


def test_the_request_notice_is_committed_with_the_suspension_and_delivered_once_the_receiver_is_back(
    settings: Any, tmp_path: Path,
) -> None:
    receiver = WebhookReceiver(SECRET)  # not started: nothing listens on its port yet
    settings.NEXO = hook(receiver, BACKOFF=10)
    run = Scribe.run("write", cwd=tmp_path)
    assert run.status == RunStatus.SUSPENDED
    call = run.pending_calls().get()
    notice = Notice.objects.get()
    # Written in the suspending commit: the run's call and its notice, one key per channel and call.
    assert (notice.kind, notice.run_id, notice.tool_call_id) == ("approval.requested", run.pk, call.tool_call_id)
    assert notice.key == f"approval.requested:{run.pk}:{call.tool_call_id}:audit"
    # Tried at commit, refused (the receiver is down): pending, with why and when again.
    assert notice.status == NoticeStatus.PENDING and notice.attempts == 1 and "Connect" in notice.last_error
    start = timezone.now()
    for seconds in (30, 120, 600):  # the receiver stays down for ten minutes: retried, backing off
        reconcile(now=start + timedelta(seconds=seconds))
    notice.refresh_from_db()
    assert notice.status == NoticeStatus.PENDING and notice.attempts == 4
    assert notice.next_attempt_at > start + timedelta(seconds=600)
    with receiver:
        assert reconcile(now=start + timedelta(seconds=601)).delivered == 0  # not due yet: backoff
        assert reconcile(now=start + timedelta(hours=2)).delivered == 1
        assert reconcile(now=start + timedelta(hours=3)).delivered == 0
    notice.refresh_from_db()
    assert notice.status == NoticeStatus.DELIVERED and notice.attempts == 5
    assert [e["id"] for e in receiver.posts] == [notice.key]  # exactly once
    event = receiver.posts[0]
    assert event["type"] == "approval.requested" and event["run"]["id"] == str(run.pk)
    assert event["call"]["digest"] == call.digest and event["call"]["admin_url"].endswith(f"/{call.pk}/change/")
    assert "args" not in event["call"]  # never the arguments unless configured


def test_notices_survive_redis_down_and_the_reconciler_delivers_them(settings: Any, tmp_path: Path) -> None:
    with WebhookReceiver(SECRET) as receiver:
        settings.NEXO = hook(receiver)
        run = Scribe.run("write", cwd=tmp_path)
        dead_redis(settings)  # the decision's job and its notice's job are both lost with Redis
        run.pending_calls().get().approve()
        assert Notice.objects.filter(kind="approval.decided", status=NoticeStatus.PENDING).count() == 1
        assert [e["type"] for e in receiver.posts] == ["approval.requested"]
        reconcile(log_warnings=False)
        assert [e["type"] for e in receiver.posts] == ["approval.requested", "approval.decided"]
        assert receiver.posts[1]["decision"]["verdict"] == "approved"


def test_a_receiver_that_keeps_failing_ends_failed_with_its_last_error(settings: Any, tmp_path: Path) -> None:
    receiver = WebhookReceiver("another secret")  # refuses every signature with 401
    settings.NEXO = hook(receiver, MAX_ATTEMPTS=3)
    with receiver:
        Scribe.run("write", cwd=tmp_path)
        start = timezone.now()
        for hours in (1, 2, 3):
            reconcile(now=start + timedelta(hours=hours))
    notice = Notice.objects.get()
    assert notice.status == NoticeStatus.FAILED and notice.attempts == 3 and "HTTP 401" in notice.last_error
    assert len(receiver.refused) == 3 and receiver.posts == []
    receiver.secret = SECRET
    with receiver:
        assert outbox.retry([notice]) == 1  # the admin's action: sent again at once
    notice.refresh_from_db()
    assert notice.status == NoticeStatus.DELIVERED and len(receiver.posts) == 1


def test_arguments_only_when_configured(settings: Any, tmp_path: Path) -> None:
    with WebhookReceiver(SECRET) as receiver:
        settings.NEXO = hook(receiver, INCLUDE_ARGS=True)
        Scribe.run("write", cwd=tmp_path)
    assert receiver.posts[0]["call"]["args"] == {"path": "notes.txt", "content": "hi"}


def test_a_private_receiver_is_not_reached_unless_allowed_by_name(settings: Any, tmp_path: Path) -> None:
    with WebhookReceiver(SECRET) as receiver:
        settings.NEXO = hook(receiver, ALLOW_PRIVATE=[])
        Scribe.run("write", cwd=tmp_path)
        notice = Notice.objects.get()
        assert notice.status == NoticeStatus.PENDING and "loopback" in notice.last_error
        assert receiver.posts == [] and receiver.refused == []  # no request reached it


def test_the_run_end_is_a_notice_too(settings: Any, tmp_path: Path) -> None:
    with WebhookReceiver(SECRET) as receiver:
        settings.NEXO = hook(receiver)
        run = Scribe.run("write", cwd=tmp_path)
        run.pending_calls().get().approve()
    assert [e["type"] for e in receiver.posts] == ["approval.requested", "approval.decided", "run.done"]
    assert receiver.posts[2]["run"]["status"] == "done"


@pytest.mark.redis
def test_a_worker_delivers_the_notices_of_the_changes_it_commits(rq_worker: Any, settings: Any, tmp_path: Path) -> None:
    """A real rqworker: the run's suspension (in the worker), the decision (here) and the run's end
    (in the worker) each send the job that delivers their notice; the receiver gets each once."""
    with WebhookReceiver(SECRET) as receiver:
        settings.NEXO = {**settings.NEXO, **hook(receiver)}
        rq_worker(1)
        run = Scribe.run_later("write", cwd=tmp_path)
        wait_for(lambda: receiver.posts, timeout=60)
        run.refresh_from_db()
        assert run.status == RunStatus.SUSPENDED and receiver.posts[0]["type"] == "approval.requested"
        run.pending_calls().get().approve()
        wait_for(lambda: len(receiver.posts) >= 3, timeout=60)
    assert sorted(e["type"] for e in receiver.posts) == ["approval.decided", "approval.requested", "run.done"]
    assert len({e["id"] for e in receiver.posts}) == 3
    # The job records a delivery once the receiver has answered: the last may still be committing.
    wait_for(lambda: Notice.objects.filter(status=NoticeStatus.DELIVERED).count() == 3, timeout=30)
    assert Notice.objects.filter(status=NoticeStatus.DELIVERED).count() == 3


def test_one_reminder_then_the_expiry_each_once(settings: Any, tmp_path: Path) -> None:
    with WebhookReceiver(SECRET) as receiver:
        settings.NEXO = hook(receiver, REMIND_AFTER=60)
        run = Scribe.run("write", cwd=tmp_path)
        call = run.pending_calls().get()
        start = timezone.now()
        assert reconcile(now=start + timedelta(seconds=30)).reminded == 0
        assert reconcile(now=start + timedelta(minutes=2)).reminded == 1
        assert reconcile(now=start + timedelta(minutes=3)).reminded == 0
        ToolCall.objects.filter(pk=call.pk).update(expires_at=start)
        reconcile(now=start + timedelta(minutes=4))
        reconcile(now=start + timedelta(minutes=5))
    types = [e["type"] for e in receiver.posts]
    assert types[:3] == ["approval.requested", "approval.reminder", "approval.expired"]
    assert types.count("approval.reminder") == 1 and types.count("approval.expired") == 1
    expired = receiver.posts[2]
    assert expired["decision"]["source"] == "expiry" and expired["call"]["status"] == "expired"


def test_the_reconciler_purges_old_notices_of_finished_runs_only(settings: Any, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with WebhookReceiver(SECRET) as receiver:
        settings.NEXO = {**hook(receiver), "APPROVAL_TIMEOUT": None}  # nothing expires meanwhile
        done = Scribe.run("write", cwd=tmp_path / "a")
        done.pending_calls().get().approve()  # three notices, delivered; the run is done
        waiting = Scribe.run("write", cwd=tmp_path / "b")  # one, delivered; the run still waits
    assert Notice.objects.filter(status=NoticeStatus.DELIVERED).count() == 4
    failed = Notice.objects.filter(run_id=done.pk, kind="run.done").get()
    Notice.objects.filter(pk=failed.pk).update(status=NoticeStatus.FAILED)  # a person's to look at
    later = timezone.now() + timedelta(days=31)

    settings.NEXO = {**hook(receiver), "APPROVAL_TIMEOUT": None, "NOTICES_KEEP_DAYS": None}
    reconcile(now=later)
    assert Notice.objects.count() == 4  # None keeps them all
    settings.NEXO = {**hook(receiver), "APPROVAL_TIMEOUT": None, "NOTICES_KEEP_DAYS": 40}
    reconcile(now=later)
    assert Notice.objects.count() == 4  # not old enough
    settings.NEXO = {**hook(receiver), "APPROVAL_TIMEOUT": None}  # the default: 30 days
    reconcile(now=later)
    assert sorted(Notice.objects.values_list("run_id", "status")) == sorted(
        [(done.pk, NoticeStatus.FAILED), (waiting.pk, NoticeStatus.DELIVERED)])
