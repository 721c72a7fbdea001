"""A schedule paused (its runs failed in a row, or its class stopped importing) is announced through
the outbox on every channel: a Slack post (a loopback Slack Web API), a signed webhook event (a
loopback receiver), an email to the people who may change schedules (scripted agents)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from nexo_django.durable import schedules
from nexo_django.models import Notice
from nexo_django.schedule_models import Schedule
from tests.admin.support import SCRIPT, make_user
from tests.channel_servers import SlackServer, WebhookReceiver, wait_for
from tests.channels.test_slack import slack_channel
from tests.schedules.helpers import SLOT_OF, make

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SECRET = "whsec-schedules"


@pytest.fixture
def channels(settings: Any) -> Any:
    with SlackServer() as slack, WebhookReceiver(SECRET) as hook:
        settings.NEXO = {"CHANNELS": {
            "ops": slack_channel(slack),
            "hook": {"BACKEND": "webhook", "URL": hook.url, "SECRET": SECRET, "ALLOW_PRIVATE": ["127.0.0.1"]},
        }, "NOTIFY": {"EMAIL": True, "SITE_URL": "https://ops.example.com"}}
        yield slack, hook


def fail_twice() -> Schedule:
    schedule = make(target="tests.schedule_agents.Breaks", cron="0 * * * *", max_failures=2, name=f"triage {SCRIPT}")
    for hour in range(3):
        schedules.tick(SLOT_OF + timedelta(hours=hour, seconds=1))
    schedule.refresh_from_db()
    assert not schedule.enabled
    return schedule


def test_a_pause_reaches_slack_the_webhook_and_the_editors_email(channels: Any, mailoutbox: list[Any]) -> None:
    slack, hook = channels
    make_user("ed", "nexo_django.change_schedule").__class__.objects.filter(username="ed").update(email="ed@example.com")
    make_user("nobody").__class__.objects.filter(username="nobody").update(email="nobody@example.com")
    schedule = fail_twice()
    notices = Notice.objects.filter(kind="schedule.paused")
    assert sorted(notices.values_list("channel", "status")) == [
        ("email", "delivered"), ("hook", "delivered"), ("ops", "delivered")]
    [posted] = [c for c in slack.calls("chat.postMessage")]
    assert posted["channel"] == "C0001"
    assert f"Schedule triage {SCRIPT} was paused" in posted["text"]
    assert "2 runs in a row failed" in str(posted["blocks"])
    [event] = [e for e in hook.received.values() if e["type"] == "schedule.paused"]
    assert event["schedule"]["name"] == schedule.name and event["schedule"]["reason"].startswith("2 runs in a row")
    assert event["schedule"]["admin_url"] == f"https://ops.example.com/admin/nexo_django/schedule/{schedule.pk}/change/"
    assert event["run"]["status"] == "failed"
    [mail] = mailoutbox
    assert mail.to == ["ed@example.com"] and "was paused" in mail.subject
    assert SCRIPT not in mail.alternatives[0][0]  # the HTML part escapes the name


def test_a_class_that_stops_importing_is_announced_without_a_run(channels: Any) -> None:
    slack, hook = channels
    schedule = make()
    Schedule.objects.filter(pk=schedule.pk).update(target="tests.schedule_agents.Renamed")
    schedules.tick(SLOT_OF)
    wait_for(lambda: any(e["type"] == "schedule.paused" for e in hook.received.values()))
    [event] = [e for e in hook.received.values() if e["type"] == "schedule.paused"]
    assert "does not import" in event["schedule"]["reason"] and "run" not in event
    assert any("does not import" in c["text"] or "does not import" in str(c["blocks"])
               for c in slack.calls("chat.postMessage"))
