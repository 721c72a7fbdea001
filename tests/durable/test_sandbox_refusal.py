"""A call the sandbox refuses at decision time ends its run (issue 45, item 2). A run suspends on
a scripted ``write``; while it waits, its target is made to leave the workspace (a link planted to
a file or a folder outside, to ``/etc/passwd``, through ``/proc/self/root``, a chain of links; the
workspace's own ``cwd`` link retargeted; or a ``../`` path the sandbox always refused). Approving
it used to raise ``ApprovalRefused`` and leave the run ``suspended`` for ever, its call undecidable.
Now the approval is recorded, the call and the run fail with ``SecurityError`` and the reason
(``run.error``), the page, the notices (``run.failed`` through the outbox) and the audit say so,
and nothing outside the workspace is touched. Every approving path; two approvers at once make one
outcome. Scripted agents, inline queue; Slack and the webhook receiver are loopback servers."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.admin import helpers
from django.test import Client

from nexo_django.core.errors import AlreadyDecided, ApprovalRefused
from nexo_django.durable.binding import SandboxRefusal
from nexo_django.models import (
    AgentRun,
    ApprovalRule,
    CallStatus,
    Decision,
    Notice,
    RunEvent,
    RunStatus,
    ToolCall,
)
from nexo_django.signals import run_status_changed
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.admin.support import (
    DECISIONS,
    INBOX,
    client_for,
    csrf_post,
    decision_url,
    make_user,
)
from tests.channel_servers import SlackServer, WebhookReceiver
from tests.channels.test_slack import click, message_of, text_of
from tests.channels.test_webhook import SECRET, decision_body, post
from tests.durable.every_path import SITE, approver, every_channel, page_form
from tests.durable.test_concurrency import race
from tests.durable_agents import ParallelScribe, Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

@pytest.fixture(autouse=True)
def _urls(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.durable.every_path"


@pytest.fixture
def ann() -> Any:
    return approver()


@pytest.fixture
def channels(settings: Any) -> Iterator[tuple[SlackServer, WebhookReceiver]]:
    yield from every_channel(settings)


class Place:
    """A workspace and a folder outside it (with a file the attack aims at), under ``tmp_path``."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.ws = tmp_path / "ws"
        self.outside = tmp_path / "outside"
        self.ws.mkdir()
        self.outside.mkdir()
        (self.outside / "key").write_text("secret\n")
        self.cwd = self.ws

    def outside_state(self) -> dict[str, bytes]:
        found = {str(p.relative_to(self.root)): p.read_bytes() for p in self.outside.rglob("*") if p.is_file()}
        found["/etc/passwd"] = Path("/etc/passwd").read_bytes()
        return found


def _flip(link: Path, target: Path) -> None:
    """Point ``link`` at ``target`` in one rename, as a deploy script flips a "current" link."""
    new = link.with_name(link.name + ".new")
    new.symlink_to(target)
    new.replace(link)


# Each target: (the path the model writes, set up before the run, planted while the call waits,
# the words of the sandbox's refusal).
def _file_link(p: Place) -> None:
    (p.ws / "notes.txt").symlink_to(p.outside / "key")


def _etc_passwd(p: Place) -> None:
    (p.ws / "notes.txt").symlink_to("/etc/passwd")


def _folder_link(p: Place) -> None:
    (p.ws / "docs").symlink_to(p.outside)


def _proc_self_root(p: Place) -> None:
    (p.ws / "notes.txt").symlink_to(f"/proc/self/root{p.outside / 'key'}")


def _chain(p: Place) -> None:
    (p.ws / "b").symlink_to(p.outside / "key")
    (p.ws / "a").symlink_to(p.ws / "b")
    (p.ws / "notes.txt").symlink_to("a")


def _cwd_setup(p: Place) -> None:
    staging = p.root / "staging"
    staging.mkdir()
    p.cwd = p.root / "current"
    p.cwd.symlink_to(staging)


def _cwd_flip(p: Place) -> None:
    _flip(p.cwd, p.outside)


def _nothing(p: Place) -> None:
    return None


TARGETS: dict[str, tuple[str, Callable[[Place], None], Callable[[Place], None], str]] = {
    "file_link": ("notes.txt", _nothing, _file_link, "is a symbolic link"),
    "etc_passwd": ("notes.txt", _nothing, _etc_passwd, "is a symbolic link"),
    "folder_link": ("docs/key", _nothing, _folder_link, "docs"),
    "dotdot": ("../outside/key", _nothing, _nothing, "contains '..'"),
    "proc_self_root": ("notes.txt", _nothing, _proc_self_root, "is a symbolic link"),
    "chain": ("notes.txt", _nothing, _chain, "is a symbolic link"),
    "cwd_retargeted": ("notes.txt", _cwd_setup, _cwd_flip, "different workspace"),
}


def _suspend(p: Place, target: str = "file_link", *, plant: bool = True) -> ToolCall:
    where, setup, planted, _ = TARGETS[target]
    setup(p)
    model = ScriptedModel([tool_call("write", path=where, content="owned\n"), reply("Done.")])
    run = Scribe.run("write", cwd=p.cwd, model=model)
    assert run.status == RunStatus.SUSPENDED, run.error
    if plant:
        planted(p)  # while the call waits
    return run.pending_calls().get()


def _audit(user: Any) -> list[dict[str, str]]:
    response = client_for(user).get(f"{DECISIONS}export/csv/")
    assert response.status_code == 200
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


def _ended_by_the_sandbox(call: ToolCall, p: Place, before: dict[str, bytes], reason: str, user: Any,
                          by: Any = "user") -> str:
    """Nothing outside was touched; the run failed with SecurityError and why; the call, the
    decision (by ``user`` unless ``by`` says), the events and the audit (read by ``user``) say
    so. The run's error, for more checks."""
    assert p.outside_state() == before  # nothing outside the workspace was written
    call.refresh_from_db()
    run = call.run
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED, (run.status, call.status, call.result)
    assert run.error.startswith("SecurityError: ") and reason in run.error, run.error
    assert "nothing was read or written" in run.error and run.finished_at is not None
    assert call.status == CallStatus.FAILED and call.result == {"error": run.error}
    decision = Decision.objects.get()
    assert decision.verdict == "approved" and decision.decided_by == (user if by == "user" else by) and decision.file_version is None
    assert RunEvent.objects.filter(run=run, type="security").count() == 1
    assert RunEvent.objects.filter(run=run, type="failed").count() == 1
    refused = RunEvent.objects.get(run=run, type="decision").data
    assert refused["refused"] == run.error
    [row] = _audit(user)
    assert (row["verdict"], row["outcome"]) == ("approved", "error")
    assert row["outcome_detail"].startswith("did not succeed: SecurityError: ")
    assert not ToolCall.objects.filter(status=CallStatus.PENDING_APPROVAL).exists()
    return run.error


# --- every target, approved from Python ------------------------------------------------------


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_an_approval_the_sandbox_refuses_ends_the_run_with_security_error_scripted(
    target: str, tmp_path: Path, ann: Any,
) -> None:
    p = Place(tmp_path)
    call = _suspend(p, target)
    before = p.outside_state()
    passwd = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
    call.approve(by=ann, digest=call.digest)  # recorded: no ApprovalRefused, no run left waiting
    _ended_by_the_sandbox(call, p, before, TARGETS[target][3], ann)
    assert hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest() == passwd
    if target == "cwd_retargeted":
        assert list((tmp_path / "staging").iterdir()) == []


def test_an_edited_path_through_a_link_ends_the_run_scripted(tmp_path: Path, ann: Any) -> None:
    p = Place(tmp_path)
    call = _suspend(p, plant=False)
    _folder_link(p)
    before = p.outside_state()
    call.approve(by=ann, args={"path": "docs/key", "content": "owned\n"})
    error = _ended_by_the_sandbox(call, p, before, "docs", ann)
    assert "docs" in error and Decision.objects.get().args == {"path": "docs/key", "content": "owned\n"}


def test_a_retry_of_the_failed_run_hands_the_model_the_refusal_and_runs_nothing_scripted(
    tmp_path: Path, ann: Any,
) -> None:
    p = Place(tmp_path)
    call = _suspend(p)
    before = p.outside_state()
    call.approve(by=ann)
    run = call.run
    assert run.retry(by=ann)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE and p.outside_state() == before
    told = [m.data for m in run.messages.all() if m.data.get("role") == "tool"]
    assert any("SecurityError" in json.dumps(m.get("content")) for m in told)


# --- every approving path ----------------------------------------------------------------------


def by_admin_page(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    client = client_for(user)
    response = csrf_post(client, decision_url(call), page_form(client, decision_url(call)), follow=True)
    page = response.content.decode()
    assert "Approved, but the sandbox refused" in page and "SecurityError" in page and "the run failed" in page


def by_bulk_action(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    client = client_for(user)
    html = client.get(INBOX).content.decode()
    digests = dict(re.findall(r'name="(digest_\d+)" value="([0-9a-f]{64})"', html))
    data = {"action": "approve_selected", "index": "0", helpers.ACTION_CHECKBOX_NAME: [call.pk], **digests}
    page = csrf_post(client, INBOX, data, follow=True).content.decode()
    assert "The sandbox refused" in page and "SecurityError" in page


def by_json(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get(f"/runs/{call.run_id}/status/")  # the CSRF cookie
    response = client.post(f"/runs/{call.run_id}/calls/{call.pk}/decide/",
                           json.dumps({"verdict": "approve", "digest": call.digest}), content_type="application/json",
                           headers={"X-CSRFToken": client.cookies["csrftoken"].value})
    answer = response.json()
    assert response.status_code == 200 and answer["refused"] is True and answer["run_status"] == "failed"
    assert answer["error"].startswith("SecurityError: ")


def by_python(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    call.approve(by=user, digest=call.digest)


def by_python_async(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    async_to_sync(call.aapprove)(by=user, digest=call.digest)


def by_resume(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    call.run.resume(approved=True, by=user)


def by_email_link(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    [message] = ctx["mailbox"]
    link = next(line.split("Decide: ", 1)[1] for line in message.body.splitlines() if "Decide: " in line)
    page = link.removeprefix(SITE)
    client = client_for(user)
    shown = csrf_post(client, page, page_form(client, page), follow=True).content.decode()
    assert "Approved, but the sandbox refused" in shown


def by_slack(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    slack: SlackServer = ctx["slack"]
    assert click(call, slack).status_code == 200
    [told] = slack.calls("chat.postEphemeral")
    assert "the sandbox refused it now" in told["text"] and "SecurityError" in told["text"]
    shown = text_of(message_of(slack, call))
    assert "Outcome: it failed." in shown and "SecurityError" in shown and "The run is failed." in shown


def by_webhook(call: ToolCall, user: Any, ctx: dict[str, Any]) -> None:
    response = post(decision_body(call, user="ann"))
    answer = response.json()
    assert response.status_code == 200 and answer["refused"] is True and answer["error"].startswith("SecurityError: ")


PATHS: dict[str, Callable[[ToolCall, Any, dict[str, Any]], None]] = {
    "admin": by_admin_page, "bulk": by_bulk_action, "json": by_json, "python": by_python,
    "async": by_python_async, "resume": by_resume, "email": by_email_link, "slack": by_slack,
    "webhook": by_webhook,
}


def _notices_said_so(hook: WebhookReceiver, run_id: Any) -> None:
    """The outbox: the decision (with the refusal) and the run's failure, delivered."""
    kinds = [e["type"] for e in hook.posts]
    assert kinds.count("run.failed") == 1 and kinds.count("approval.decided") == 1, kinds
    [failed] = [e for e in hook.posts if e["type"] == "run.failed"]
    assert failed["run"]["id"] == str(run_id) and failed["run"]["status"] == "failed"
    [decided] = [e for e in hook.posts if e["type"] == "approval.decided"]
    assert decided["call"]["status"] == "failed" and decided["call"]["refused"].startswith("SecurityError: ")
    assert Notice.objects.filter(kind="run.failed").count() == 2  # the webhook's and Slack's


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_approving_path_ends_a_refused_call_s_run_and_says_so_scripted(
    path: str, tmp_path: Path, ann: Any, channels: tuple[SlackServer, WebhookReceiver], mailoutbox: list[Any],
) -> None:
    p = Place(tmp_path)
    call = _suspend(p)
    before = p.outside_state()
    slack, hook = channels
    PATHS[path](call, ann, {"mailbox": mailoutbox, "slack": slack, "hook": hook})
    _ended_by_the_sandbox(call, p, before, "is a symbolic link", ann)
    assert Decision.objects.get().source == {"admin": "admin", "email": "admin", "bulk": "admin-bulk", "json": "json",
                                             "python": "api", "async": "api", "resume": "resume", "slack": "ops",
                                             "webhook": "hook"}[path]
    _notices_said_so(hook, call.run_id)


def test_a_standing_rule_that_approves_a_refused_call_ends_the_run_scripted(
    tmp_path: Path, ann: Any, channels: tuple[SlackServer, WebhookReceiver],
) -> None:
    p = Place(tmp_path)
    ApprovalRule.objects.create(tool="write", path="/notes.txt", created_by=ann)

    def plant_when_suspended(sender: Any, run: Any, old: str, new: str, **kwargs: Any) -> None:
        if new == RunStatus.SUSPENDED:  # planted before the rule decides
            _file_link(p)

    before = p.outside_state()
    run_status_changed.connect(plant_when_suspended)
    try:
        run = Scribe.run("write", cwd=p.ws)
    finally:
        run_status_changed.disconnect(plant_when_suspended)
    assert run.status == RunStatus.FAILED
    call = ToolCall.objects.get(run=run)
    _ended_by_the_sandbox(call, p, before, "is a symbolic link", ann, by=None)
    assert Decision.objects.get().source == "rule"
    _notices_said_so(channels[1], run.pk)


def test_resume_of_two_calls_ends_the_run_at_the_refused_one_and_runs_neither_scripted(tmp_path: Path, ann: Any) -> None:
    p = Place(tmp_path)
    run = ParallelScribe.run("two writes", cwd=p.ws)
    (p.ws / "a.txt").symlink_to(p.outside / "key")
    before = p.outside_state()
    run.resume(approved=True, by=ann)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "'a.txt' is a symbolic link" in run.error
    assert p.outside_state() == before and not (p.ws / "b.txt").exists()
    statuses = dict(ToolCall.objects.filter(run=run).values_list("args__path", "status"))
    assert statuses == {"a.txt": CallStatus.FAILED, "b.txt": CallStatus.EXPIRED}


def test_two_approvers_at_once_make_one_outcome_scripted(tmp_path: Path, ann: Any, settings: Any) -> None:
    with WebhookReceiver(SECRET) as hook:
        settings.NEXO = {"CHANNELS": {"hook": {"BACKEND": "webhook", "URL": hook.url, "SECRET": SECRET,
                                               "ALLOW_PRIVATE": ["127.0.0.1"]}}}
        p = Place(tmp_path)
        call = _suspend(p)
        before = p.outside_state()
        bob = make_user("bob", "nexo_django.decide_toolcall")
        people = [ann, bob]
        outcomes = race(2, lambda i: ToolCall.objects.get(pk=call.pk).approve(by=people[i], digest=call.digest))
        assert sorted(outcomes) == ["already decided", "ok"], outcomes
        decision = Decision.objects.get()
        _ended_by_the_sandbox(call, p, before, "is a symbolic link", decision.decided_by)
        _notices_said_so_once(hook, call.run_id)
        with pytest.raises(AlreadyDecided):
            ToolCall.objects.get(pk=call.pk).approve(by=ann)


def _notices_said_so_once(hook: WebhookReceiver, run_id: Any) -> None:
    kinds = [e["type"] for e in hook.posts]
    assert kinds.count("run.failed") == 1 and kinds.count("approval.decided") == 1, kinds
    assert Notice.objects.filter(kind="run.failed", run_id=run_id).count() == 1


def test_a_denial_of_a_refused_call_still_just_denies_it_scripted(tmp_path: Path, ann: Any) -> None:
    p = Place(tmp_path)
    call = _suspend(p)
    before = p.outside_state()
    call.deny(by=ann, note="no")
    call.run.refresh_from_db()
    assert call.run.status == RunStatus.DONE and p.outside_state() == before


def test_an_agent_that_cannot_be_rebuilt_is_refused_now_and_the_call_still_waits_scripted(
    tmp_path: Path, ann: Any,
) -> None:
    """Not the sandbox's refusal: the file cannot be looked at now (ApprovalRefused, nothing
    recorded); the run is not failed for it, and a person may decide again once it can."""
    p = Place(tmp_path)
    call = _suspend(p, plant=False)
    AgentRun.objects.filter(pk=call.run_id).update(agent="tests.no_such_module.Gone")
    call = ToolCall.objects.get(pk=call.pk)
    with pytest.raises(ApprovalRefused, match="cannot be rebuilt") as refused:
        call.approve(by=ann)
    assert not isinstance(refused.value, SandboxRefusal)
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()
    assert AgentRun.objects.get(pk=call.run_id).status == RunStatus.SUSPENDED
