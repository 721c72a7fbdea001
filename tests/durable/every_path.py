"""What the tests that approve a call by every path share (test_suspension_binding.py,
test_sandbox_refusal.py): the URLconf with the admin, the run pages and the channels' endpoint,
the approver, every channel a notice goes to, and the decision page's form as a browser posts it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from django.contrib import admin
from django.test import Client
from django.urls import include, path

from tests.admin.support import make_user, page_digest
from tests.channel_servers import SlackServer, WebhookReceiver
from tests.channels.test_slack import slack_channel
from tests.channels.test_webhook import SECRET

SITE = "https://ops.example.com"

#: The admin, the run pages and the channels' endpoint (``ROOT_URLCONF = "tests.durable.every_path"``).
urlpatterns = [
    path("admin/", admin.site.urls),
    path("runs/", include("nexo_django.urls")),
    path("nexo/channels/", include("nexo_django.channel_urls")),
]


def approver() -> Any:
    """ann, who may decide, with the email Slack's user U1 is mapped by."""
    user = make_user("ann", "nexo_django.decide_toolcall")
    user.email = "ann@example.com"
    user.save()
    return user


def every_channel(settings: Any, **hook: Any) -> Iterator[tuple[SlackServer, WebhookReceiver]]:
    """Email, a Slack channel and a webhook that decides (``hook``: more of its settings): every
    notice of a run, to loopback servers. A fixture's body (``yield from``)."""
    with SlackServer() as slack, WebhookReceiver(SECRET) as receiver:
        slack.users["U1"] = {"id": "U1", "is_email_confirmed": True, "profile": {"email": "ann@example.com"}}
        settings.NEXO = {
            "NOTIFY": {"EMAIL": True, "SITE_URL": SITE},
            "CHANNELS": {"ops": slack_channel(slack),
                         "hook": {"BACKEND": "webhook", "URL": receiver.url, "SECRET": SECRET,
                                  "ALLOW_PRIVATE": ["127.0.0.1"], "DECIDE": True, **hook}},
        }
        yield slack, receiver


def page_form(client: Client, url: str) -> dict[str, str]:
    """The decision page's Approve form as loaded: its digest and the file version it shows."""
    html = client.get(url).content.decode()
    version = re.search(r'name="file_version" value="([^"]*)"', html)
    return {"action": "approve", "digest": page_digest(html), "file_version": version.group(1) if version else ""}
