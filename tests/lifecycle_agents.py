"""Agents of the approval lifecycle tests, at module level so the reconciler can import them
(scripted models)."""

from __future__ import annotations

from datetime import timedelta

from nexo_django import Agent, Permissions
from nexo_django.testing import ScriptedModel, reply, tool_call


class Hurried(Agent):
    """Scripted: a gated write that waits one minute for a person, then an answer."""

    model = ScriptedModel([tool_call("write", path="notes/a.txt", content="hi"), reply("Noted.")])
    sandbox = "local"
    permissions = "approve"
    approval_timeout = timedelta(minutes=1)


class HurriedStop(Agent):
    """Scripted: like Hurried (in seconds), but an expiry stops the run."""

    model = ScriptedModel([tool_call("write", path="notes/a.txt", content="hi"), reply("Noted.")])
    sandbox = "local"
    permissions = "approve"
    approval_timeout = 60
    on_timeout = "stop"


class Patient(Agent):
    """Scripted: a gated write that waits forever."""

    model = ScriptedModel([tool_call("write", path="notes/a.txt", content="hi"), reply("Noted.")])
    sandbox = "local"
    permissions = "approve"
    approval_timeout = None


class TwoWrites(Agent):
    """Scripted: one turn of two gated writes (notes/ and secrets/), then an answer."""

    model = ScriptedModel(
        [
            [tool_call("write", path="notes/a.txt", content="A"), tool_call("write", path="secrets/b.txt", content="B")],
            reply("Both handled."),
        ]
    )
    sandbox = "local"
    permissions = "approve"


class SelfAllowed(Agent):
    """Scripted: the gate allows write on its own (pre-approved), so no rule is ever asked."""

    model = ScriptedModel([tool_call("write", path="notes/a.txt", content="hi"), reply("Noted.")])
    sandbox = "local"
    permissions = Permissions("approve", allow=("read", "glob", "write"))


class AskedNobody(Agent):
    """Scripted: bare "ask" has no on_ask, so the gate itself denies the write."""

    model = ScriptedModel([tool_call("write", path="notes/a.txt", content="hi"), reply("Noted.")])
    sandbox = "local"
    permissions = "ask"
