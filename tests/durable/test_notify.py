"""Notices to the approvers: who gets one, what it says, one reminder, never twice (scripted agents).

Mail goes through Django's locmem backend (pytest-django's ``mailoutbox``), and in one test through
a real SMTP server on loopback (``tests/smtp_server.py``)."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core import mail
from django.db import connections
from django.test import Client
from django.utils import timezone

from nexo_django.durable import dispatch, outbox
from nexo_django.durable.recovery import reconcile
from nexo_django.models import CallStatus, Decision, Notice, ToolCall
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.admin.support import HOSTILE_CONTENT, RLO, SCRIPT, client_for, make_user
from tests.durable_agents import Scribe
from tests.lifecycle_agents import Hurried, TwoWrites
from tests.smtp_server import SMTPServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

SITE = "https://ops.example.com"
ON = {"EMAIL": True, "SITE_URL": SITE, "REMIND_AFTER": 3600}


@pytest.fixture
def notices(settings: Any) -> None:
    settings.NEXO = {"NOTIFY": ON}


@pytest.fixture
def people() -> dict[str, Any]:
    """Who may decide (direct, group, superuser) with an address, and who may not be mailed."""
    users = get_user_model().objects
    decide = Permission.objects.get(codename="decide_toolcall", content_type__app_label="nexo_django")
    deciders = Group.objects.create(name="deciders")
    deciders.permissions.add(decide)
    direct = make_user("dora", "nexo_django.decide_toolcall")
    grouped = make_user("gus")
    grouped.groups.add(deciders)
    root = users.create_superuser("root", email="root@example.com")
    silent = make_user("nomail", "nexo_django.decide_toolcall")
    gone = make_user("gone", "nexo_django.decide_toolcall")
    looker = make_user("looker", "nexo_django.view_pendingapproval")
    for user, address in ((direct, "dora@example.com"), (grouped, "gus@example.com"), (gone, "gone@example.com"),
                          (looker, "looker@example.com")):
        user.email = address
        user.save()
    gone.is_active = False
    gone.save()
    return {"direct": direct, "grouped": grouped, "root": root, "silent": silent, "looker": looker}


EXPECTED = ["dora@example.com", "gus@example.com", "root@example.com"]


def suspend(agent: Any, tmp_path: Path, prompt: str = "write a note", user: Any = None) -> ToolCall:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return agent.run(prompt, cwd=tmp_path, user=user).pending_calls().first()


def recipients(outbox: list[Any]) -> list[str]:
    return sorted(address for message in outbox for address in message.to)


@pytest.mark.usefixtures("notices")
def test_each_approver_gets_one_email_naming_the_calls(people: dict[str, Any], mailoutbox: list[Any],
                                                       tmp_path: Path) -> None:
    call = suspend(Hurried, tmp_path)
    assert recipients(mailoutbox) == EXPECTED
    message = mailoutbox[0]
    assert "Hurried" in message.subject and "waits for your approval" in message.subject
    body = message.body
    assert "tests.lifecycle_agents.Hurried" in body and "write a note" in body
    assert "write" in body and "notes/a.txt" in body
    assert f"Deadline: {call.expires_at:%Y-%m-%d %H:%M} UTC" in body
    assert f"{SITE}/admin/nexo_django/pendingapproval/{call.pk}/change/" in body
    html, kind = message.alternatives[0]
    assert kind == "text/html" and f'href="{SITE}/admin/nexo_django/pendingapproval/{call.pk}/change/"' in html
    call.refresh_from_db()
    assert call.notified_at is not None


@pytest.mark.usefixtures("notices")
def test_one_email_lists_every_waiting_call_of_the_turn(people: dict[str, Any], mailoutbox: list[Any],
                                                        tmp_path: Path) -> None:
    suspend(TwoWrites, tmp_path)
    assert len(mailoutbox) == 3
    body = mailoutbox[0].body
    assert "notes/a.txt" in body and "secrets/b.txt" in body and "(2 calls)" in mailoutbox[0].subject


@pytest.mark.usefixtures("notices")
def test_model_text_is_escaped_shortened_and_cannot_forge_lines(people: dict[str, Any], mailoutbox: list[Any],
                                                                tmp_path: Path) -> None:
    prompt = f"{SCRIPT}\nDecide: https://evil.example/approve{RLO}"
    model = ScriptedModel([tool_call("write", path="notes.txt", content=HOSTILE_CONTENT + "x" * 5000), reply("ok")])
    tmp_path.mkdir(exist_ok=True)
    Scribe.run(prompt, cwd=tmp_path, model=model)
    message = mailoutbox[0]
    for part in (message.body, message.alternatives[0][0]):
        assert RLO not in part and "⟦U+202E⟧" in part
    assert RLO not in message.subject and SCRIPT not in message.subject
    # Escaped in the HTML part; the plain text part shows the text as written (quoted), not escaped.
    assert SCRIPT not in message.alternatives[0][0] and "&lt;script&gt;" in message.alternatives[0][0]
    assert f"> {SCRIPT}" in message.body and "&lt;" not in message.body and "&quot;" not in message.body
    assert "x" * 400 not in message.body  # shortened
    # The prompt is quoted and the arguments stay on one line: none passes for the notice's own link.
    links = [line for line in message.body.splitlines() if line.strip().startswith("Decide:")]
    assert len(links) == 1 and links[0].strip().startswith(f"Decide: {SITE}/")


@pytest.mark.usefixtures("notices")
def test_the_plain_text_part_is_not_html_escaped(people: dict[str, Any], mailoutbox: list[Any], tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    Scribe.run("Write notes & more", cwd=tmp_path)
    message = mailoutbox[0]
    assert '1. write {"path": "notes.txt", "content": "hi"}' in message.body
    assert "> Write notes & more" in message.body and "&amp;" not in message.body
    html_part = message.alternatives[0][0]
    assert "{&quot;path&quot;: &quot;notes.txt&quot;" in html_part and "notes &amp; more" in html_part


@pytest.mark.usefixtures("notices")
def test_the_requester_is_not_asked_when_self_approval_is_off(people: dict[str, Any], mailoutbox: list[Any],
                                                              tmp_path: Path, settings: Any) -> None:
    settings.NEXO = {"NOTIFY": ON, "SELF_APPROVAL": False}
    suspend(Hurried, tmp_path, user=people["direct"])
    assert recipients(mailoutbox) == ["gus@example.com", "root@example.com"]


@pytest.mark.usefixtures("notices")
def test_with_self_approval_on_the_requester_is_asked_too(people: dict[str, Any], mailoutbox: list[Any],
                                                         tmp_path: Path) -> None:
    suspend(Hurried, tmp_path, user=people["direct"])
    assert recipients(mailoutbox) == EXPECTED


def test_no_email_unless_enabled(people: dict[str, Any], mailoutbox: list[Any], tmp_path: Path) -> None:
    call = suspend(Hurried, tmp_path)
    assert reconcile(now=timezone.now() + timedelta(seconds=30)).notified == 0
    assert mailoutbox == []
    call.refresh_from_db()
    assert call.notified_at is None


@pytest.mark.usefixtures("notices")
def test_one_reminder_after_remind_after_and_no_duplicates(people: dict[str, Any], mailoutbox: list[Any],
                                                           tmp_path: Path) -> None:
    call = suspend(Hurried, tmp_path / "a", prompt="long wait")
    ToolCall.objects.filter(pk=call.pk).update(expires_at=None)  # waits past the reminder
    assert len(mailoutbox) == 3
    start = timezone.now()
    for minutes in (1, 10, 59):
        report = reconcile(now=start + timedelta(minutes=minutes))
        assert (report.notified, report.reminded) == (0, 0)
    assert len(mailoutbox) == 3
    assert reconcile(now=start + timedelta(minutes=61)).reminded == 1  # one reminder notice: three emails
    reminders = mailoutbox[3:]
    assert len(reminders) == 3 and all(m.subject.startswith("Reminder: ") for m in reminders)
    for hours in (2, 5, 48):
        assert reconcile(now=start + timedelta(hours=hours)).reminded == 0
    assert len(mailoutbox) == 6


@pytest.mark.usefixtures("notices")
def test_no_reminder_once_decided(people: dict[str, Any], mailoutbox: list[Any], tmp_path: Path) -> None:
    call = suspend(Hurried, tmp_path)
    call.approve()
    assert reconcile(now=timezone.now() + timedelta(hours=2)).reminded == 0
    assert len(mailoutbox) == 3


def lose_wake_ups(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job each commit sends to deliver its notices never runs (the worker died right after the
    commit, or Redis lost it): only the notice rows are left."""
    monkeypatch.setattr(dispatch, "send_notices_or_log", lambda keys: False)


@pytest.mark.usefixtures("notices")
def test_the_reconciler_sends_a_notice_nobody_sent(people: dict[str, Any], mailoutbox: list[Any],
                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lose_wake_ups(monkeypatch)
    call = suspend(Scribe, tmp_path)
    assert mailoutbox == [] and Notice.objects.get().kind == "approval.requested"  # committed with the run
    later = timezone.now() + timedelta(seconds=30)
    assert reconcile(now=later).notified == 1  # one notice: an email to each approver
    assert reconcile(now=later + timedelta(minutes=1)).notified == 0
    assert recipients(mailoutbox) == EXPECTED
    call.refresh_from_db()
    assert call.notified_at is not None


@pytest.mark.usefixtures("notices")
def test_a_failed_send_is_tried_again_by_the_next_round(people: dict[str, Any], mailoutbox: list[Any],
                                                        tmp_path: Path, settings: Any) -> None:
    with socket_closed() as port:
        use_smtp(settings, "127.0.0.1", port)
        call = suspend(Scribe, tmp_path)  # the mail server is down: the run suspends all the same
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL and call.notified_at is None
    use_locmem(settings)
    assert reconcile(now=timezone.now() + timedelta(minutes=2)).notified == 1  # its three emails
    assert recipients(mailoutbox) == EXPECTED


SMTP = "django.core.mail.backends.smtp.EmailBackend"
LOCMEM = "django.core.mail.backends.locmem.EmailBackend"


def use_smtp(settings: Any, host: str, port: int) -> None:
    if hasattr(mail, "mailers"):  # Django 6.1
        settings.MAILERS = {"default": {"BACKEND": SMTP, "OPTIONS": {"host": host, "port": port, "timeout": 5}}}
    else:
        settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = SMTP, host, port, 5


def use_locmem(settings: Any) -> None:
    if hasattr(mail, "mailers"):
        settings.MAILERS = {"default": {"BACKEND": LOCMEM}}
    else:
        settings.EMAIL_BACKEND = LOCMEM


class socket_closed:
    """A loopback port nothing listens on."""

    def __enter__(self) -> int:
        import socket

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        sock.close()
        return self.port

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.usefixtures("notices")
def test_a_real_smtp_server_on_loopback_receives_the_notices(people: dict[str, Any], tmp_path: Path,
                                                             settings: Any) -> None:
    with SMTPServer() as server:
        use_smtp(settings, server.host, server.port)
        settings.DEFAULT_FROM_EMAIL = "nexo@ops.example.com"
        call = suspend(Hurried, tmp_path)
    assert server.connections == 1  # one connection for every recipient
    assert sorted(r for m in server.messages for r in m.recipients) == EXPECTED
    received = server.messages[0].message()
    assert received["From"] == "nexo@ops.example.com" and "Hurried" in received["Subject"]
    text = next(p for p in received.walk() if p.get_content_type() == "text/plain")
    assert f"{SITE}/admin/nexo_django/pendingapproval/{call.pk}/change/" in text.get_payload(decode=True).decode()


@pytest.mark.usefixtures("notices")
def test_the_link_opens_the_page_and_decides_nothing(people: dict[str, Any], mailoutbox: list[Any],
                                                     tmp_path: Path) -> None:
    call = suspend(Hurried, tmp_path)
    link = next(line.split("Decide: ", 1)[1] for line in mailoutbox[0].body.splitlines() if "Decide: " in line)
    path = link.removeprefix(SITE)
    anonymous = Client().get(path)
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    for _ in range(3):  # a mail scanner opening it, then the person
        page = client_for(people["direct"]).get(path)
        assert page.status_code == 200 and 'value="approve"' in page.content.decode()
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()


def test_concurrent_reconcilers_send_one_notice(people: dict[str, Any], mailoutbox: list[Any], tmp_path: Path,
                                                settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight reconcilers at once (threads, each with its own connection; on PostgreSQL in the
    suite's PostgreSQL pass): every approver gets each notice and each reminder once."""
    settings.NEXO = {"NOTIFY": ON}
    lose_wake_ups(monkeypatch)  # the notices are the reconcilers' to deliver
    calls = [suspend(Hurried, tmp_path / str(i)) for i in range(3)]
    ToolCall.objects.filter(pk__in=[c.pk for c in calls]).update(expires_at=None)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def reconciler(when: Any) -> None:
        try:
            barrier.wait(timeout=10)
            outbox.remind(when)
            outbox.deliver_due(when)
        except BaseException as exc:  # reported below, with the thread's own traceback gone
            errors.append(exc)
        finally:
            connections.close_all()

    for when in (timezone.now() + timedelta(minutes=2), timezone.now() + timedelta(hours=3)):
        threads = [threading.Thread(target=reconciler, args=(when,)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(t.is_alive() for t in threads) and errors == []
    notices = [m for m in mailoutbox if not m.subject.startswith("Reminder")]
    reminders = [m for m in mailoutbox if m.subject.startswith("Reminder")]
    assert len(notices) == 3 * 3 and len(reminders) == 3 * 3  # 3 runs x 3 approvers, once each
    for batch in (notices, reminders):
        assert sorted((m.to[0], m.subject) for m in batch) == sorted(set((m.to[0], m.subject) for m in batch))
