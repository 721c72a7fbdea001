"""The scripted model of ``nexo_django.testing``: deterministic, and it says it is scripted."""

from __future__ import annotations

from typing import Any

import pytest

from nexo_django.core.errors import ModelError
from nexo_django.core.llm import Model
from nexo_django.testing import ScriptedModel, reply, tool_call

TOOLS = [{"name": "read", "description": "", "parameters": {}}, {"name": "write", "description": "", "parameters": {}}]


def user(text: str = "go") -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_scripted_model_says_it_is_scripted() -> None:
    model = ScriptedModel([reply("x")])
    assert model.is_scripted is True
    assert "scripted" in repr(model).lower()
    assert "scripted" in str(model).lower()
    assert model.name == "scripted"


def test_scripted_model_is_a_model() -> None:
    assert isinstance(ScriptedModel([]), Model)


def test_helpers_build_script_entries() -> None:
    assert tool_call("write", path="a.txt", content="hi") == {
        "type": "tool_call",
        "name": "write",
        "args": {"path": "a.txt", "content": "hi"},
    }
    assert reply("Done.") == {"type": "reply", "content": "Done."}


def test_tool_call_accepts_an_argument_called_name() -> None:
    # The tool name is positional-only, so a tool may take its own "name" argument.
    assert tool_call("greet", name="Ada")["args"] == {"name": "Ada"}


def test_scripted_reply_turn() -> None:
    completion = ScriptedModel([reply("Done.")]).complete([user()], TOOLS)
    assert completion.message == {"role": "assistant", "content": "Done."}
    assert completion.usage["input_tokens"] > 0 and completion.usage["output_tokens"] > 0


def test_scripted_tool_call_turn_has_ids_by_turn_and_index() -> None:
    completion = ScriptedModel([tool_call("read", path="a.txt")]).complete([user()], TOOLS)
    assert completion.message == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_0_0", "name": "read", "args": {"path": "a.txt"}}],
    }


def test_scripted_parallel_calls_with_text() -> None:
    model = ScriptedModel([[reply("Reading both."), tool_call("read", path="a"), tool_call("read", path="b")]])
    message = model.complete([user()], TOOLS).message
    assert message["content"] == "Reading both."
    assert [c["id"] for c in message["tool_calls"]] == ["call_0_0", "call_0_1"]
    assert [c["args"]["path"] for c in message["tool_calls"]] == ["a", "b"]


def test_scripted_model_records_each_request() -> None:
    model = ScriptedModel([reply("x")])
    messages = [user("hello")]
    model.complete(messages, TOOLS)
    assert model.requests == [{"messages": [{"role": "user", "content": "hello"}], "tools": ["read", "write"]}]
    messages[0]["content"] = "changed later"
    assert model.requests[0]["messages"][0]["content"] == "hello"  # a copy, not a reference


def test_scripted_model_continues_by_counting_assistant_turns() -> None:
    model = ScriptedModel([tool_call("read", path="a.txt"), reply("second entry"), reply("third entry")])
    transcript = [
        user(),
        {"role": "assistant", "content": None, "tool_calls": [{"id": "x", "name": "read", "args": {"path": "a.txt"}}]},
        {"role": "tool", "tool_call_id": "x", "name": "read", "content": {"content": "alpha"}},
    ]
    assert model.complete(transcript, TOOLS).message["content"] == "second entry"


def test_scripted_model_ids_continue_with_the_turn() -> None:
    model = ScriptedModel([reply("unused"), tool_call("read", path="b")])
    transcript = [user(), {"role": "assistant", "content": "earlier"}, user("more")]
    assert model.complete(transcript, TOOLS).message["tool_calls"][0]["id"] == "call_1_0"


def test_scripted_model_is_deterministic_for_the_same_transcript() -> None:
    # Two model objects, like two processes resuming the same run, play the same entry.
    script = [tool_call("read", path="a.txt"), reply("done")]
    transcript = [user(), {"role": "assistant", "content": "thinking"}]
    first = ScriptedModel(script).complete(transcript, TOOLS)
    second = ScriptedModel(script).complete(transcript, TOOLS)
    assert first.message == second.message == {"role": "assistant", "content": "done"}


def test_scripted_played_arguments_are_copies() -> None:
    script = [tool_call("write", path="a.txt", content="hi")]
    model = ScriptedModel(script)
    message = model.complete([user()], TOOLS).message
    message["tool_calls"][0]["args"]["path"] = "../evil"
    assert script[0]["args"]["path"] == "a.txt"
    assert model.complete([user()], TOOLS).message["tool_calls"][0]["args"]["path"] == "a.txt"


def test_scripted_model_out_of_turns_says_so() -> None:
    model = ScriptedModel([reply("only one")])
    with pytest.raises(ModelError, match="1 turns and was asked for turn 2"):
        model.complete([user(), {"role": "assistant", "content": "only one"}, user("again")], TOOLS)


def test_scripted_model_rejects_an_unknown_entry() -> None:
    with pytest.raises(ModelError, match="reply"):
        ScriptedModel([{"type": "shrug"}]).complete([user()], TOOLS)
