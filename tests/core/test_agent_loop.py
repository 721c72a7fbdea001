"""The loop of ``Agent.prompt()``, driven by a scripted model (no model service is called)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from nexo_django import Agent, ApprovalRequired, ConfigurationError, Permissions, SecurityError
from nexo_django.core.agent import Journal
from nexo_django.core.errors import MaxTurnsExceeded
from nexo_django.core.sandboxes import VirtualSandbox
from nexo_django.testing import ScriptedModel, reply, tool_call

ALL_TOOLS = ["read", "glob", "write", "shell", "fetch", "search"]


class ShellVirtualSandbox(VirtualSandbox):
    """An in-memory sandbox that claims a shell, so the shell tool is offered when allowed."""

    can_shell = True

    def shell(self, command: str, *, timeout: float, max_output: int) -> dict[str, Any]:
        return {"exit_code": 0, "stdout": f"ran {command}", "stderr": ""}


def no_results(query: str, limit: int) -> list[dict[str, str]]:
    return []


class Everything(Agent):
    """An agent that would offer all six built-in tools if its gate let it."""

    fetch_allow = ["example.com"]
    search_backend = staticmethod(no_results)


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, type: str, data: dict[str, Any]) -> None:
        self.seen.append((type, data))

    def types(self) -> list[str]:
        return [t for t, _ in self.seen]


def files(**content: str) -> VirtualSandbox:
    return VirtualSandbox(dict(content))


def result_of(reply_: Any, call_id: str) -> dict[str, Any]:
    return next(c.result for c in reply_.tool_calls if c.id == call_id)


# --- which tools the model sees ---------------------------------------------------------------


def test_scripted_read_only_agent_never_sees_privileged_tools() -> None:
    model = ScriptedModel([reply("hello")])
    Everything(model=model, sandbox=ShellVirtualSandbox()).prompt("hi")
    assert model.requests[0]["tools"] == ["read", "glob"]


def test_scripted_auto_agent_sees_all_six_tools() -> None:
    # The control of the test above: the same agent with a permissive gate sees everything.
    model = ScriptedModel([reply("hello")])
    Everything(model=model, sandbox=ShellVirtualSandbox(), permissions="auto").prompt("hi")
    assert model.requests[0]["tools"] == ALL_TOOLS


def test_scripted_read_only_with_allow_write_sees_write() -> None:
    model = ScriptedModel([reply("hello")])
    gate = Permissions("read_only", allow=("read", "glob", "write"))
    Everything(model=model, sandbox=ShellVirtualSandbox(), permissions=gate).prompt("hi")
    assert model.requests[0]["tools"] == ["read", "glob", "write"]


def test_scripted_read_only_call_to_a_hidden_tool_is_an_error() -> None:
    sandbox = files()
    model = ScriptedModel([tool_call("write", path="x.txt", content="pwned"), reply("gave up")])
    result = Agent(model=model, sandbox=sandbox).prompt("write")
    assert "unknown tool 'write'" in result.tool_calls[0].result["error"]
    assert sandbox.files == {}
    assert result.content == "gave up"


# --- gates in the loop -------------------------------------------------------------------------


def test_scripted_denied_write_returns_an_error_and_the_loop_finishes() -> None:
    sandbox = files()
    model = ScriptedModel([tool_call("write", path="notes.txt", content="hi"), reply("Could not write.")])
    result = Agent(model=model, sandbox=sandbox, permissions="ask").prompt("write")
    error = result.tool_calls[0].result["error"]
    assert "write" in error and "notes.txt" in error and "denied" in error
    assert result.content == "Could not write."
    assert sandbox.files == {}
    # The model saw the denial as the tool's result.
    tool_message = model.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["content"] == {"error": error}


def test_scripted_ask_with_on_ask_allowing_writes() -> None:
    asked: list[tuple[str, Any]] = []
    gate = Permissions("ask", on_ask=lambda cap, detail: asked.append((cap, detail)) or True)
    sandbox = files()
    model = ScriptedModel([tool_call("write", path="notes.txt", content="hi"), reply("Done.")])
    result = Agent(model=model, sandbox=sandbox, permissions=gate).prompt("write")
    assert asked == [("write", "/notes.txt")]
    assert sandbox.files == {"notes.txt": b"hi"}
    assert result.tool_calls[0].result["bytes_written"] == 2


def test_scripted_ask_with_on_ask_refusing_does_not_write() -> None:
    asked: list[tuple[str, Any]] = []
    gate = Permissions("ask", on_ask=lambda cap, detail: asked.append((cap, detail)) and False)
    sandbox = files()
    model = ScriptedModel([tool_call("write", path="notes.txt", content="hi"), reply("Refused.")])
    result = Agent(model=model, sandbox=sandbox, permissions=gate).prompt("write")
    assert asked == [("write", "/notes.txt")]
    assert sandbox.files == {}
    assert "said no" in result.tool_calls[0].result["error"]
    assert result.content == "Refused."


def test_scripted_ask_when_narrows_what_is_asked() -> None:
    asked: list[Any] = []
    gate = Permissions(
        "ask",
        on_ask=lambda cap, detail: asked.append(detail) and False,
        ask_when=lambda cap, detail: str(detail).startswith("/src/"),
    )
    sandbox = files()
    model = ScriptedModel(
        [[tool_call("write", path="notes.txt", content="a"), tool_call("write", path="src/app.py", content="b")], reply("ok")]
    )
    result = Agent(model=model, sandbox=sandbox, permissions=gate).prompt("write both")
    assert asked == ["/src/app.py"]
    assert sandbox.files == {"notes.txt": b"a"}
    assert "error" in result_of(result, "call_0_1")


def test_scripted_approve_suspends_with_every_pending_call_after_the_ungated_sibling_ran() -> None:
    events = Events()
    sandbox = files(**{"a.txt": "alpha"})
    model = ScriptedModel(
        [
            [
                tool_call("write", path="b.txt", content="bravo"),
                tool_call("read", path="a.txt"),
                tool_call("write", path="c.txt", content="charlie"),
            ],
            reply("never reached"),
        ]
    )
    agent = Agent(model=model, sandbox=sandbox, permissions="approve", on_event=events)
    with pytest.raises(ApprovalRequired) as caught:
        agent.prompt("copy")
    pending = caught.value.pending
    assert [(p.id, p.name, p.capability, p.args) for p in pending] == [
        ("call_0_0", "write", "write", {"path": "b.txt", "content": "bravo"}),
        ("call_0_2", "write", "write", {"path": "c.txt", "content": "charlie"}),
    ]
    # The read sibling ran and kept its result; nothing was written; the model was not asked again.
    results = [data for kind, data in events.seen if kind == "tool_result"]
    assert results == [{"id": "call_0_1", "name": "read", "error": False}]
    assert ("suspended", {"pending": ["call_0_0", "call_0_2"]}) in events.seen
    assert sandbox.files == {"a.txt": b"alpha"}
    assert len(model.requests) == 1


def test_scripted_approve_with_approved_decision_runs_the_call() -> None:
    sandbox = files()
    gate = Permissions("approve", decision=True)
    model = ScriptedModel([tool_call("write", path="b.txt", content="bravo"), reply("Written.")])
    result = Agent(model=model, sandbox=sandbox, permissions=gate).prompt("write")
    assert sandbox.files == {"b.txt": b"bravo"}
    assert result.content == "Written."


# --- security --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        tool_call("read", path="../x"),
        tool_call("write", path="../x", content="escaped"),
        tool_call("write", path="a/../../x", content="escaped"),
        tool_call("glob", pattern="../*"),
        tool_call("read", path="/etc/passwd"),
    ],
)
def test_scripted_path_escape_fails_loudly(call: dict[str, Any]) -> None:
    events = Events()
    sandbox = files(**{"a.txt": "alpha"})
    model = ScriptedModel([call, reply("should not get here")])
    with pytest.raises(SecurityError):
        Agent(model=model, sandbox=sandbox, permissions="auto", on_event=events).prompt("escape")
    assert sandbox.files == {"a.txt": b"alpha"}
    assert "security" in events.types()
    assert len(model.requests) == 1


# --- model resolution --------------------------------------------------------------------------------


def test_no_model_anywhere_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    monkeypatch.delenv("NEXO_MODEL", raising=False)
    settings.NEXO = {}
    with pytest.raises(ConfigurationError) as caught:
        Agent()
    message = str(caught.value)
    assert "model = " in message
    assert 'NEXO["MODEL"]' in message
    assert "NEXO_MODEL" in message
    assert isinstance(caught.value, ImproperlyConfigured)


def test_model_from_settings_is_used(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    # An unknown provider makes resolution fail with the name it was given: proof of where it came from.
    monkeypatch.delenv("NEXO_MODEL", raising=False)
    settings.NEXO = {"MODEL": "fromsettings:some-model"}
    with pytest.raises(ConfigurationError, match="unknown model provider 'fromsettings'"):
        Agent()


def test_model_from_environment_is_used(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.NEXO = {}
    monkeypatch.setenv("NEXO_MODEL", "fromenv:some-model")
    with pytest.raises(ConfigurationError, match="unknown model provider 'fromenv'"):
        Agent()


def test_settings_come_before_the_environment(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.NEXO = {"MODEL": "fromsettings:a"}
    monkeypatch.setenv("NEXO_MODEL", "fromenv:b")
    with pytest.raises(ConfigurationError, match="fromsettings"):
        Agent()


def test_class_model_comes_before_settings(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.NEXO = {"MODEL": "fromsettings:a"}
    monkeypatch.setenv("NEXO_MODEL", "fromenv:b")
    model = ScriptedModel([reply("from the class")])

    class Declared(Agent):
        pass

    Declared.model = model
    assert Declared().prompt("hi").content == "from the class"


def test_instance_model_comes_before_the_class_model() -> None:
    class Declared(Agent):
        model = ScriptedModel([reply("from the class")])

    assert Declared(model=ScriptedModel([reply("from the instance")])).prompt("hi").content == "from the instance"


def test_malformed_model_string_names_the_format(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.NEXO = {}
    monkeypatch.setenv("NEXO_MODEL", "gpt-4.1-mini")
    with pytest.raises(ConfigurationError, match="provider:model"):
        Agent()


def test_openai_model_string_from_settings_builds_the_provider(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    from nexo_django.core.llm.openai import OpenAIModel

    monkeypatch.delenv("NEXO_MODEL", raising=False)
    settings.NEXO = {
        "MODEL": "openai:gpt-4.1-mini",
        "PROVIDERS": {"openai": {"base_url": "http://127.0.0.1:9/v1"}},
    }
    llm = Agent().llm
    assert isinstance(llm, OpenAIModel)
    assert llm.model == "gpt-4.1-mini"


def test_openai_model_string_from_environment_builds_the_provider(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    from nexo_django.core.llm.openai import OpenAIModel

    settings.NEXO = {"PROVIDERS": {"openai": {"base_url": "http://127.0.0.1:9/v1"}}}
    monkeypatch.setenv("NEXO_MODEL", "openai:llama3.2")
    llm = Agent().llm
    assert isinstance(llm, OpenAIModel)
    assert llm.model == "llama3.2"


# --- turns, calls and errors ----------------------------------------------------------------------


def test_scripted_max_turns_is_enforced() -> None:
    class Short(Agent):
        max_turns = 2

    model = ScriptedModel([tool_call("glob", pattern="*")] * 3 + [reply("never")])
    with pytest.raises(MaxTurnsExceeded) as caught:
        Short(model=model).prompt("loop")
    assert "Short" in str(caught.value)
    assert "2 turns" in str(caught.value) and "max_turns" in str(caught.value)
    assert len(model.requests) == 2


def test_scripted_final_answer_on_the_last_allowed_turn_is_fine() -> None:
    class Short(Agent):
        max_turns = 2

    model = ScriptedModel([tool_call("glob", pattern="*"), reply("just in time")])
    assert Short(model=model).prompt("go").content == "just in time"


def test_scripted_parallel_calls_in_one_turn_all_run_in_order() -> None:
    sandbox = files(**{"a.txt": "alpha", "b.txt": "bravo"})
    model = ScriptedModel([[tool_call("read", path="a.txt"), tool_call("read", path="b.txt")], reply("both")])
    result = Agent(model=model, sandbox=sandbox).prompt("read both")
    assert [(c.id, c.result["content"]) for c in result.tool_calls] == [("call_0_0", "alpha"), ("call_0_1", "bravo")]
    tool_messages = [m for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_0_0", "call_0_1"]


def test_scripted_malformed_call_goes_back_to_the_model() -> None:
    # A provider marks a call it could not parse with "error"; start from such a transcript.
    transcript = [
        {"role": "user", "content": "write"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "name": "write", "args": {}, "error": "arguments are not valid JSON"}],
        },
    ]
    sandbox = files()
    model = ScriptedModel([reply("turn 1 is already in the transcript"), reply("Sorry, retrying later.")])
    agent = Agent(model=model, sandbox=sandbox, permissions="auto")
    journal = Journal(transcript)
    outcome = agent.drive(journal)
    assert outcome.kind == "done"
    assert outcome.content == "Sorry, retrying later."
    assert journal.messages[2] == {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "write",
        "content": {"error": "write: arguments are not valid JSON"},
    }
    assert sandbox.files == {}


def test_scripted_unknown_tool_goes_back_to_the_model() -> None:
    model = ScriptedModel([tool_call("delete_everything", path="/"), reply("ok then")])
    result = Agent(model=model).prompt("go")
    error = result.tool_calls[0].result["error"]
    assert "unknown tool 'delete_everything'" in error
    assert "read" in error and "glob" in error  # it lists what exists
    assert result.content == "ok then"


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (tool_call("read"), "missing required argument path"),
        (tool_call("read", path=3), "argument path"),
        (tool_call("read", path=None), "argument path"),
        (tool_call("read", path="a.txt", mode="rb"), "unexpected argument mode"),
        (tool_call("write", path="a.txt"), "missing required argument content"),
    ],
)
def test_scripted_bad_arguments_go_back_to_the_model_naming_the_argument(call: dict[str, Any], named: str) -> None:
    sandbox = files(**{"a.txt": "alpha"})
    model = ScriptedModel([call, reply("fixed")])
    result = Agent(model=model, sandbox=sandbox, permissions="auto").prompt("go")
    assert named in result.tool_calls[0].result["error"]
    assert result.content == "fixed"
    assert sandbox.files == {"a.txt": b"alpha"}


# --- Reply and events ----------------------------------------------------------------------------------


def test_scripted_reply_attributes() -> None:
    class Reader(Agent):
        instructions = "You read files."

    sandbox = files(**{"a.txt": "alpha"})
    model = ScriptedModel([tool_call("read", path="a.txt"), reply("It says alpha.")])
    result = Reader(model=model, sandbox=sandbox).prompt("What does a.txt say?")
    assert result.content == "It says alpha."
    assert [m["role"] for m in result.transcript] == ["system", "user", "assistant", "tool", "assistant"]
    assert result.transcript[0]["content"] == "You read files."
    assert result.transcript[1]["content"] == "What does a.txt say?"
    assert len(result.tool_calls) == 1
    call = result.tool_calls[0]
    assert (call.id, call.name, call.args) == ("call_0_0", "read", {"path": "a.txt"})
    assert call.result is not None and call.result["content"] == "alpha"
    assert set(result.usage) >= {"input_tokens", "output_tokens"}
    per_turn = [m["usage"] for m in result.transcript if m["role"] == "assistant"]
    assert result.usage["input_tokens"] == sum(u["input_tokens"] for u in per_turn) > 0
    assert result.usage["output_tokens"] == sum(u["output_tokens"] for u in per_turn) > 0


def test_scripted_events_follow_the_loop() -> None:
    events = Events()
    sandbox = files(**{"a.txt": "alpha"})
    model = ScriptedModel([tool_call("read", path="a.txt"), reply("done")])
    Agent(model=model, sandbox=sandbox, on_event=events).prompt("go")
    assert events.types() == [
        "model_request",
        "model_reply",
        "tool_call",
        "tool_result",
        "model_request",
        "model_reply",
        "done",
    ]
    data = dict(events.seen[1:4])
    assert data["model_reply"]["tool_calls"] == ["read"]
    assert data["tool_call"] == {"id": "call_0_0", "name": "read"}
    assert data["tool_result"] == {"id": "call_0_0", "name": "read", "error": False}


def test_scripted_prompt_with_no_tool_calls_finishes_in_one_turn() -> None:
    model = ScriptedModel([reply("Just text.")])
    result = Agent(model=model).prompt("hi")
    assert result.content == "Just text."
    assert result.tool_calls == []
    assert len(model.requests) == 1


# --- continuation ---------------------------------------------------------------------------------------


def test_scripted_read_before_write_survives_a_resume() -> None:
    """A resumed run rebuilds what was read from the transcript: the write needs no new read."""
    sandbox = files(**{"README.md": "Helo"})
    model = ScriptedModel(
        [tool_call("read", path="README.md"), tool_call("write", path="README.md", content="Hello"), reply("Fixed.")]
    )
    first = Agent(model=model, sandbox=sandbox, permissions="approve")
    journal = Journal(first.initial_messages("fix"))
    assert first.drive(journal).kind == "suspended"
    assert sandbox.files == {"README.md": b"Helo"}

    # A fresh agent (nothing in memory) continues the same transcript with the call approved.
    resumed = Agent(model=model, sandbox=sandbox, permissions=Permissions("approve", decision=True))
    outcome = resumed.drive(Journal(journal.messages))
    assert outcome.kind == "done" and outcome.content == "Fixed."
    assert sandbox.files == {"README.md": b"Hello"}


def test_scripted_write_without_a_read_in_the_transcript_is_refused() -> None:
    # The control of the test above: with no read on record, the overwrite is refused.
    sandbox = files(**{"README.md": "Helo"})
    transcript = [
        {"role": "user", "content": "fix"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "w1", "name": "write", "args": {"path": "README.md", "content": "Hello"}}],
        },
    ]
    model = ScriptedModel([reply("unused"), reply("Could not.")])
    journal = Journal(transcript)
    Agent(model=model, sandbox=sandbox, permissions="auto").drive(journal)
    assert "read it before overwriting" in journal.messages[2]["content"]["error"]
    assert sandbox.files == {"README.md": b"Helo"}


def test_fetch_allow_given_as_a_string_is_a_configuration_error() -> None:
    """Scripted: a string would read as a list of single letters and refuse every host silently."""

    class Fetcher(Agent):
        permissions = "auto"
        fetch_allow = "example.com"  # type: ignore[assignment]

    with pytest.raises(ConfigurationError, match="list of hosts"):
        Fetcher(model=ScriptedModel([reply("x")]))
