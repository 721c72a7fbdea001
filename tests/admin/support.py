"""Helpers for the admin tests (no tests here): users, scripted agents, hostile text, rows in bulk."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils.crypto import get_random_string

from nexo_django import Agent
from nexo_django.models import AgentRun, CallStatus, RunMessage, RunStatus, ToolCall, args_digest
from nexo_django.testing import ScriptedModel, reply, tool_call

INBOX = "/admin/nexo_django/pendingapproval/"
RUNS = "/admin/nexo_django/agentrun/"
DECISIONS = "/admin/nexo_django/decision/"

#: Hostile text a model could produce: markup, a javascript: URL, bidi overrides, zero-width
#: characters. The admin must show all of it literally and run none of it.
SCRIPT = "<script>alert('pwned')</script>"
JS_LINK = '<a href="javascript:alert(1)">click me</a>'
RLO = "\u202e"  # right-to-left override
LRI = "\u2066"  # left-to-right isolate
PDI = "\u2069"  # pop directional isolate
ZWSP = "\u200b"  # zero-width space
ZWJ = "\u200d"
BOM = "\ufeff"
HOSTILE_PATH = f"report{RLO}txt.exe"
HOSTILE_CONTENT = f"{SCRIPT}\n{JS_LINK}\nrm{ZWSP} -rf{ZWJ} /{BOM} {LRI}x{PDI}"
HIDDEN = (RLO, LRI, PDI, ZWSP, ZWJ, BOM)


class HostileScribe(Agent):
    """Scripted: says and writes hostile text (markup, javascript: URL, bidi, zero-width)."""

    model = ScriptedModel(
        [
            [reply(f"Sure {SCRIPT} {JS_LINK} {RLO}evil"), tool_call("write", path=HOSTILE_PATH, content=HOSTILE_CONTENT)],
            reply(f"Done {SCRIPT}"),
        ]
    )
    sandbox = "local"
    permissions = "approve"


def make_user(username: str, *perms: str, staff: bool = True, password: str | None = None) -> Any:
    # No password unless a test logs in through a form: hashing one costs a second per user.
    user = get_user_model().objects.create_user(username, password=password, is_staff=staff)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return user


def approver() -> Any:
    return make_user("ann", "nexo_django.decide_toolcall")


def viewer() -> Any:
    """Staff who may look at the inbox and runs but not decide."""
    return make_user("vic", "nexo_django.view_pendingapproval", "nexo_django.view_agentrun")


def client_for(user: Any) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def csrf_post(client: Client, url: str, data: dict[str, Any], **extra: Any) -> Any:
    """POST with the CSRF token a browser would send (from the cookie set by a GET)."""
    if "csrftoken" not in client.cookies:
        client.get(url)  # a GET never decides; it sets the cookie as a browser's visit would
    if "csrftoken" not in client.cookies:  # an error page or a redirect set none
        client.cookies["csrftoken"] = get_random_string(32)
    token = client.cookies["csrftoken"].value
    return client.post(url, {**data, "csrfmiddlewaretoken": token}, **extra)


def decision_url(call: ToolCall) -> str:
    return f"{INBOX}{call.pk}/change/"


def run_url(run: AgentRun) -> str:
    return f"{RUNS}{run.pk}/change/"


def page_digest(html: str) -> str:
    match = re.search(r'name="digest" value="([0-9a-f]{64})"', html)
    assert match, "the decision page shows no digest field"
    return match.group(1)


def pending_rows(n: int, *, agents: int = 5, user: Any = None) -> list[ToolCall]:
    """``n`` pending calls over a few suspended runs, inserted with bulk_create (no agent runs)."""
    runs = AgentRun.objects.bulk_create(
        AgentRun(agent=f"tests.durable_agents.Agent{i}", prompt="p", status=RunStatus.SUSPENDED, created_by=user)
        for i in range(agents)
    )
    calls = []
    for i in range(n):
        args = {"path": f"f{i}.txt", "content": "x" * (i % 7)}
        calls.append(ToolCall(
            run=runs[i % agents], agent=runs[i % agents].agent, tool_call_id=f"call_{i}",
            name="write" if i % 2 else "shell",
            capability="write" if i % 2 else "shell", args=args, digest=args_digest(args),
            status=CallStatus.PENDING_APPROVAL,
        ))
    created = ToolCall.objects.bulk_create(calls)
    RunMessage.objects.bulk_create(RunMessage(run=r, seq=0, role="user", data={"role": "user", "content": "p"}) for r in runs)
    return created
