"""A call id names one call of a run: a model that reuses ids never reuses an approval (scripted)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from nexo_django import Agent, Permissions, tool
from nexo_django.core.sandboxes import VirtualSandbox
from nexo_django.core.tools import ToolContext
from nexo_django.models import AgentRun, CallStatus, Decision, RunMessage, RunStatus, ToolCall
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.durable_agents import bump

PROVIDER_SAFE = re.compile(r"^[a-zA-Z0-9_-]+$")


class Reader(Agent):
    permissions = "read_only"


class Writer(Agent):
    """Scripted per test: gated writes in a virtual sandbox."""

    permissions = "approve"


class ShellAllowed(Agent):
    """Scripted per test: ``bump`` (a shell capability) runs ungated, writes are gated."""

    permissions = Permissions("approve", allow=("read", "glob", "shell"))
    tools = [bump]


def durable(agent: type[Agent], script: list[Any], ids: str) -> AgentRun:
    return agent.run("go", model=ScriptedModel(script, call_ids=ids))


# --- in process ---------------------------------------------------------------------------------


def test_scripted_ids_reused_across_turns_are_renamed_and_keep_their_own_results() -> None:
    model = ScriptedModel(
        [tool_call("read", path="a.txt"), tool_call("read", path="b.txt"), reply("ok")], call_ids="toolu_{index}"
    )
    result = Reader(model=model, sandbox=VirtualSandbox({"a.txt": "A", "b.txt": "B"})).prompt("read both")
    ids = [c.id for c in result.tool_calls]
    assert ids[0] == "toolu_0"
    assert len(set(ids)) == 2
    assert all(PROVIDER_SAFE.match(i) for i in ids)
    assert [c.result["content"] for c in result.tool_calls] == ["A", "B"]  # type: ignore[index]
    # The model is sent the renamed id with its result, so the pair stays consistent.
    sent = model.requests[2]["messages"]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ids


def test_scripted_ids_duplicated_within_one_turn_are_renamed() -> None:
    model = ScriptedModel(
        [[tool_call("read", path="a.txt"), tool_call("read", path="b.txt")], reply("ok")], call_ids="dup"
    )
    result = Reader(model=model, sandbox=VirtualSandbox({"a.txt": "A", "b.txt": "B"})).prompt("read both")
    ids = [c.id for c in result.tool_calls]
    assert ids[0] == "dup" and len(set(ids)) == 2
    assert all(PROVIDER_SAFE.match(i) for i in ids)
    assert [c.result["content"] for c in result.tool_calls] == ["A", "B"]  # type: ignore[index]


@tool(capability="read")
def whoami(ctx: ToolContext) -> dict:
    """Returns the id of the call it runs in."""
    return {"call_id": ctx.call_id}


class Introspective(Agent):
    tools = [whoami]


def test_scripted_tool_context_carries_the_call_id() -> None:
    model = ScriptedModel([[tool_call("whoami"), tool_call("whoami")], reply("ok")])
    result = Introspective(model=model).prompt("who")
    assert [c.result for c in result.tool_calls] == [{"call_id": "call_0_0"}, {"call_id": "call_0_1"}]


# --- durable ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_scripted_a_reused_id_never_runs_on_an_earlier_approval() -> None:
    script = [
        tool_call("write", path="a.txt", content="A"),
        tool_call("write", path="b.txt", content="B"),
        reply("ok"),
    ]
    run = durable(Writer, script, "toolu_missing_{index}")
    [first] = run.pending_calls()
    first.approve()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED  # the second write waits for its own decision
    [second] = run.pending_calls()
    assert second.args == {"path": "b.txt", "content": "B"}
    assert second.tool_call_id != first.tool_call_id
    assert PROVIDER_SAFE.match(second.tool_call_id)
    assert set(run.workspace["files"]) == {"a.txt"}
    assert ToolCall.objects.filter(run=run).count() == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_scripted_a_reused_id_of_an_ungated_call_does_not_re_pend_it(counter: Any) -> None:
    script = [tool_call("bump", label="one"), tool_call("write", path="w.txt", content="W"), reply("ok")]
    run = durable(ShellAllowed, script, "toolu_missing_{index}")
    assert run.status == RunStatus.SUSPENDED
    [pending] = run.pending_calls()  # the inbox shows the write, not the bump that ran
    assert (pending.name, pending.args) == ("write", {"path": "w.txt", "content": "W"})
    bumped = ToolCall.objects.get(run=run, name="bump")
    assert bumped.status == CallStatus.SUCCEEDED


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_scripted_ids_duplicated_within_a_turn_get_a_row_each() -> None:
    script = [[tool_call("write", path="a.txt", content="A"), tool_call("write", path="b.txt", content="B")], reply("ok")]
    run = durable(Writer, script, "dup")
    assert run.status == RunStatus.SUSPENDED, run.error
    pending = list(run.pending_calls())
    assert [c.args["path"] for c in pending] == ["a.txt", "b.txt"]
    assert len({c.tool_call_id for c in pending}) == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_scripted_a_decision_recorded_for_other_arguments_is_never_applied() -> None:
    # A run stored before ids were unique: its open call carries the id of a decided call whose
    # arguments differ. The decision must not run it.
    run = durable(Writer, [tool_call("write", path="a.txt", content="A"), reply("ok")], "toolu_missing_{index}")
    [call] = run.pending_calls()
    turn = RunMessage.objects.get(run=run, role="assistant")
    turn.data["tool_calls"][0]["args"] = {"path": "a.txt", "content": "something else"}
    RunMessage.objects.filter(pk=turn.pk).update(data=turn.data)
    call.approve()
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "different call" in run.error
    assert run.workspace["files"] == {}
    assert Decision.objects.filter(tool_call__run=run).count() == 1
