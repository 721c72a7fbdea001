"""Agents declared at module level so workers in other processes can import them (scripted models)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nexo_django import Agent, tool
from nexo_django.testing import ScriptedModel, reply, tool_call


class Scribe(Agent):
    """Scripted: writes notes.txt under approve, then answers."""

    model = ScriptedModel([tool_call("write", path="notes.txt", content="hi"), reply("Done.")])
    sandbox = "local"
    permissions = "approve"


class ParallelScribe(Agent):
    """Scripted: one turn with an ungated read and two gated writes, then an answer."""

    model = ScriptedModel(
        [
            [
                tool_call("glob", pattern="*"),
                tool_call("write", path="a.txt", content="A"),
                tool_call("write", path="b.txt", content="B"),
            ],
            reply("Both handled."),
        ]
    )
    sandbox = "local"
    permissions = "approve"


class ThreeTurns(Agent):
    """Scripted: glob, a gated write, a read, then an answer (three tool turns)."""

    model = ScriptedModel(
        [
            tool_call("glob", pattern="*"),
            tool_call("write", path="out.txt", content="three"),
            tool_call("read", path="out.txt"),
            reply("Finished."),
        ]
    )
    sandbox = "virtual"
    permissions = "approve"


def count(path: Path) -> list[str]:
    """What the scripted side-effect tools recorded, in order."""
    return path.read_text().split() if path.exists() else []


def _count(name: str) -> None:
    import os

    path = os.environ.get("NEXO_TEST_COUNTER")
    if path:
        with open(path, "a") as f:
            f.write(name + "\n")


@tool(capability="shell", idempotent=False)
def bump(label: str) -> dict:
    """Scripted side effect: appends the label to the file named by NEXO_TEST_COUNTER."""
    _count(label)
    return {"bumped": label}


@tool(capability="fetch", idempotent=True)
def lookup(key: str) -> dict:
    """An idempotent gated tool (counted too)."""
    _count("lookup:" + key)
    return {"value": key.upper()}


class Bumper(Agent):
    """Scripted: a gated non-idempotent bump, then an answer. Counts executions."""

    model = ScriptedModel([tool_call("bump", label="one"), reply("Bumped.")])
    permissions = "approve"
    tools = [bump]


class Looker(Agent):
    """Scripted: a gated idempotent lookup, then an answer."""

    model = ScriptedModel([tool_call("lookup", key="k"), reply("Looked.")])
    permissions = "approve"
    tools = [lookup]


class MixedTurn(Agent):
    """Scripted: one turn with an ungated bump-free glob, a gated bump and a gated write."""

    model = ScriptedModel(
        [
            [tool_call("glob", pattern="*"), tool_call("bump", label="x"), tool_call("write", path="w.txt", content="W")],
            reply("Mixed done."),
        ]
    )
    permissions = "approve"
    tools = [bump]


@tool(capability="read", idempotent=True)
def nap(seconds: float) -> dict:
    """Scripted slow tool: sleeps, like a slow model call or a long shell command."""
    import time

    time.sleep(seconds)
    return {"slept": seconds}


class Sleeper(Agent):
    """Scripted: one slow call, then an answer."""

    model = ScriptedModel([tool_call("nap", seconds=2.0), reply("Rested.")])
    permissions = "auto"
    tools = [nap]


class CountingModel(ScriptedModel):
    """Scripted, and appends "model" to the NEXO_TEST_COUNTER file for each request it answers,
    so a test counts model requests across worker processes."""

    def complete(self, messages: list[dict], tools: list[dict]) -> Any:
        _count("model")
        return super().complete(messages, tools)


@tool(capability="read", idempotent=True)
def trip(label: str) -> dict:
    """Scripted idempotent tool: with NEXO_TEST_CRASH_AT=in_tool its worker is SIGKILLed while it runs."""
    from nexo_django.durable.journal import crash_point

    _count("trip:" + label)
    crash_point("in_tool")
    return {"tripped": label}


class Tripper(Agent):
    """Scripted, counted: one turn of two idempotent ungated calls (glob, trip), then an answer."""

    model = CountingModel([[tool_call("glob", pattern="*"), tool_call("trip", label="t")], reply("Tripped.")])
    permissions = "approve"
    tools = [trip]


class SlowSleeper(Agent):
    """Scripted: one slow call (long enough to restart a database meanwhile), then an answer."""

    model = ScriptedModel([tool_call("nap", seconds=4.0), reply("Rested.")])
    permissions = "auto"
    tools = [nap]


class SlowModel(ScriptedModel):
    """Scripted, counted, and slow: each request waits ``delay`` seconds before its answer, as a
    real model's does (a run of the concurrent worker spends its life there).

    With ``NEXO_TEST_MODEL_GATE`` naming a file (see ``model_gate``), each request first waits
    until that file exists (at most a minute): a test holds every run inside its model request
    for as long as it needs, where a fixed delay raced a loaded machine (the first runs were past
    their request before the last had made theirs)."""

    def __init__(self, steps: list[Any], delay: float) -> None:
        super().__init__(steps)
        self.delay = delay

    def complete(self, messages: list[dict], tools: list[dict]) -> Any:
        import os
        import time

        _count("model")
        gate = os.environ.get("NEXO_TEST_MODEL_GATE")
        if gate:
            wait_open(gate)
        time.sleep(self.delay)
        return super().complete(messages, tools)


def wait_open(gate: str) -> None:
    """Wait until the file ``gate`` exists (a test opened it), a minute at most."""
    import os
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)


def model_gate(tmp_path: Path, monkeypatch: Any) -> Path:
    """A closed gate for SlowModel's requests, in the workers the test starts after this call:
    ``.touch()`` opens it."""
    gate = tmp_path / "model-gate"
    monkeypatch.setenv("NEXO_TEST_MODEL_GATE", str(gate))
    return gate


class Patient(Agent):
    """Scripted, slow model (2 s a turn): a non-idempotent bump, then an answer. Counts both."""

    model = SlowModel([tool_call("bump", label="x"), reply("Patient.")], delay=2.0)
    permissions = "auto"
    tools = [bump]


class Brisk(Agent):
    """Scripted, slow model (0.7 s a turn): a non-idempotent bump, then an answer."""

    model = SlowModel([tool_call("bump", label="b"), reply("Brisk.")], delay=0.7)
    permissions = "auto"
    tools = [bump]


@tool(capability="read", idempotent=True)
def spin(seconds: float) -> dict:
    """Scripted CPU hog: a pure-Python busy loop for ``seconds`` (it never sleeps)."""
    import time

    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return {"spun": n}


class Spinner(Agent):
    """Scripted: one call that keeps a CPU busy for a minute, then an answer."""

    model = ScriptedModel([tool_call("spin", seconds=60.0), reply("Spun.")])
    permissions = "auto"
    tools = [spin]


class Dawdler(Agent):
    """Scripted: a 20 s nap (idempotent), then an answer: longer than a shutdown's grace."""

    model = ScriptedModel([tool_call("nap", seconds=20.0), reply("Dawdled.")])
    permissions = "auto"
    tools = [nap]


#: What :class:`Teller` answers, word by word (a provider's stream, scripted).
TOLD = "Once upon a time a worker wrote this answer one word at a time for a page far away."


class Teller(Agent):
    """Scripted, streamed: answers :data:`TOLD` a word every 50 ms (about a second in all)."""

    model = ScriptedModel([reply(TOLD)], stream=True, stream_delay=0.05)
    sandbox = "virtual"


class Conversant(Agent):
    """Scripted: answers; its follow-up writes notes.txt under approve, then answers. The
    script's turn is the conversation's assistant count, so the follow-up's worker plays the
    write only if it was sent the earlier run's transcript."""

    model = ScriptedModel([reply("Paris."), tool_call("write", path="notes.txt", content="Paris"), reply("Noted it.")])
    sandbox = "local"
    permissions = "approve"


class SlowTeller(Agent):
    """Scripted, streamed: answers :data:`TOLD` a word every 150 ms (about 2.7 s in all)."""

    model = ScriptedModel([reply(TOLD)], stream=True, stream_delay=0.15)
    sandbox = "virtual"


class Keyless(Agent):
    """The project's model (``NEXO["MODEL"]``): a test points it at a loopback provider."""

    sandbox = "virtual"


class Filler(Agent):
    """Scripted: one confined shell command that writes 3 MB into the workspace, then an answer
    (which a run over its quota must never reach)."""

    model = ScriptedModel([
        tool_call("shell", command="head -c 3000000 /dev/zero > big; echo wrote"),
        reply("Filled."),
    ])  # fmt: skip
    sandbox = "local"
    permissions = "auto"
