"""``@nexo_django.tool`` on typed functions: the schema, the context, and gating in a scripted run."""

from __future__ import annotations

from typing import Any, Literal, Optional

import pytest

import nexo_django
from nexo_django import Agent, ApprovalRequired, ConfigurationError, Permissions, Tool, ToolContext
from nexo_django.core.sandboxes import VirtualSandbox
from nexo_django.testing import ScriptedModel, reply, tool_call


@nexo_django.tool(capability="read")
def describe(
    name: str,
    count: int,
    ratio: float,
    loud: bool,
    tags: list[str],
    colour: Literal["red", "green"],
    note: Optional[str],  # noqa: UP045 - the typing spelling must keep working
    limit: int = 10,
    suffix: str | None = None,
) -> dict[str, Any]:
    """Describe a thing.

    The second paragraph is not part of the description the model sees.
    """
    return {"name": name}


def test_schema_of_typed_parameters() -> None:
    assert describe.parameters["properties"] == {
        "name": {"type": "string"},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "loud": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "colour": {"enum": ["red", "green"]},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "limit": {"type": "integer"},
        "suffix": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    }


def test_schema_required_are_the_parameters_without_defaults() -> None:
    assert describe.parameters["required"] == ["name", "count", "ratio", "loud", "tags", "colour", "note"]


def test_schema_refuses_extra_properties() -> None:
    assert describe.parameters["type"] == "object"
    assert describe.parameters["additionalProperties"] is False


def test_decorated_function_is_a_tool_with_name_description_and_capability() -> None:
    assert isinstance(describe, Tool)
    assert describe.name == "describe"
    assert describe.description == "Describe a thing."
    assert describe.capability == "read"
    assert describe.spec() == {"name": "describe", "description": "Describe a thing.", "parameters": describe.parameters}


def test_name_and_description_can_be_given() -> None:
    @nexo_django.tool(capability="write", name="save_note", description="Save a note.")
    def save(text: str) -> None:
        """Ignored."""

    assert (save.name, save.description) == ("save_note", "Save a note.")


def test_idempotent_defaults_follow_the_capability() -> None:
    @nexo_django.tool(capability="glob")
    def lister() -> list[str]:
        return []

    @nexo_django.tool(capability="shell")
    def runner() -> str:
        return ""

    @nexo_django.tool(capability="shell", idempotent=True)
    def safe_runner() -> str:
        return ""

    assert lister.idempotent is True
    assert runner.idempotent is False
    assert safe_runner.idempotent is True


def test_capability_is_required_and_the_error_names_the_fix() -> None:
    with pytest.raises(TypeError, match=r"capability='read'"):

        @nexo_django.tool
        def no_capability(path: str) -> str:
            return path


def test_capability_is_required_with_parentheses_too() -> None:
    with pytest.raises(TypeError, match="declare the capability"):

        @nexo_django.tool()
        def no_capability(path: str) -> str:
            return path


def test_unknown_capability_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown capability 'delete'"):

        @nexo_django.tool(capability="delete")
        def remove(path: str) -> None:
            return None


def test_unannotated_parameter_is_an_error() -> None:
    with pytest.raises(TypeError, match="'path' needs a type annotation"):

        @nexo_django.tool(capability="read")
        def untyped(path) -> str:  # type: ignore[no-untyped-def]
            return str(path)


def test_unsupported_annotation_is_an_error() -> None:
    with pytest.raises(TypeError, match="cannot make a JSON schema"):

        @nexo_django.tool(capability="read")
        def odd(value: complex) -> None:
            return None


def test_star_args_are_an_error() -> None:
    with pytest.raises(TypeError, match=r"\*args/\*\*kwargs"):

        @nexo_django.tool(capability="read")
        def variadic(**options: str) -> None:
            return None


def test_positional_only_parameter_is_an_error() -> None:
    with pytest.raises(TypeError, match="positional-only"):

        @nexo_django.tool(capability="read")
        def positional(path: str, /) -> None:
            return None


# --- the context -----------------------------------------------------------------------------


@nexo_django.tool(capability="read")
def shout(path: str, ctx: ToolContext) -> dict[str, Any]:
    """Read a file and shout it."""
    got = ctx.sandbox.read(path, ctx.limits.read_max_bytes)
    return {"shouted": got.data.decode().upper()}


@nexo_django.tool(capability="read")
def whisper(path: str, context: ToolContext) -> str:
    """Read a file and whisper it (the context under another name)."""
    return context.sandbox.read(path, 100).data.decode().lower()


def test_ctx_parameter_is_not_in_the_schema() -> None:
    assert shout.parameters["properties"] == {"path": {"type": "string"}}
    assert shout.parameters["required"] == ["path"]
    assert "context" not in whisper.parameters["properties"]


def test_ctx_parameter_receives_the_run_context() -> None:
    ctx = ToolContext(sandbox=VirtualSandbox({"a.txt": "hey"}), permissions=Permissions())
    assert shout.invoke({"path": "a.txt"}, ctx) == {"shouted": "HEY"}


def test_context_parameter_under_another_name_receives_the_context() -> None:
    ctx = ToolContext(sandbox=VirtualSandbox({"a.txt": "HEY"}), permissions=Permissions())
    # A plain return value is wrapped for the model.
    assert whisper.invoke({"path": "a.txt"}, ctx) == {"result": "hey"}


# --- in a scripted run --------------------------------------------------------------------------

written: list[str] = []


@nexo_django.tool(capability="write")
def append_line(line: str, times: int = 1) -> dict[str, Any]:
    """Append a line to a list kept in memory."""
    written.extend([line] * times)
    return {"lines": len(written)}


class Toolsmith(Agent):
    tools = [shout, append_line]


@pytest.fixture(autouse=True)
def _clean_written() -> None:
    written.clear()


def test_scripted_model_calls_a_user_tool() -> None:
    model = ScriptedModel([tool_call("shout", path="a.txt"), reply("done")])
    result = Toolsmith(model=model, sandbox=VirtualSandbox({"a.txt": "hey"})).prompt("shout a.txt")
    assert result.tool_calls[0].result == {"shouted": "HEY"}
    assert "shout" in model.requests[0]["tools"]


def test_scripted_read_only_hides_a_write_capability_tool() -> None:
    model = ScriptedModel([tool_call("append_line", line="x"), reply("done")])
    result = Toolsmith(model=model).prompt("append")
    assert model.requests[0]["tools"] == ["read", "glob", "shout"]
    assert "unknown tool 'append_line'" in result.tool_calls[0].result["error"]
    assert written == []


def test_scripted_auto_attaches_and_runs_a_write_capability_tool() -> None:
    model = ScriptedModel([tool_call("append_line", line="x", times=2), reply("done")])
    result = Toolsmith(model=model, permissions="auto").prompt("append")
    assert "append_line" in model.requests[0]["tools"]
    assert result.tool_calls[0].result == {"lines": 2}
    assert written == ["x", "x"]


def test_scripted_approve_suspends_a_user_tool() -> None:
    model = ScriptedModel([tool_call("append_line", line="x"), reply("done")])
    with pytest.raises(ApprovalRequired) as caught:
        Toolsmith(model=model, permissions="approve").prompt("append")
    [pending] = caught.value.pending
    assert (pending.name, pending.capability, pending.args) == ("append_line", "write", {"line": "x"})
    assert written == []


def test_scripted_ask_shows_the_arguments_to_on_ask() -> None:
    asked: list[tuple[str, Any]] = []
    gate = Permissions("ask", on_ask=lambda cap, detail: asked.append((cap, detail)) or True)
    model = ScriptedModel([tool_call("append_line", line="x"), reply("done")])
    Toolsmith(model=model, permissions=gate).prompt("append")
    assert asked == [("write", {"line": "x"})]
    assert written == ["x"]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"line": 5}, "argument line"),
        ({"line": "x", "times": "2"}, "argument times"),
        ({"line": "x", "times": True}, "argument times"),
        ({}, "missing required argument line"),
        ({"line": "x", "path": "/etc"}, "unexpected argument path"),
    ],
)
def test_scripted_ill_typed_arguments_return_an_error(args: dict[str, Any], named: str) -> None:
    model = ScriptedModel([tool_call("append_line", **args), reply("done")])
    result = Toolsmith(model=model, permissions="auto").prompt("append")
    assert named in result.tool_calls[0].result["error"]
    assert written == []
    assert result.content == "done"


def test_scripted_tool_that_raises_returns_an_error_and_the_loop_goes_on() -> None:
    @nexo_django.tool(capability="read")
    def broken(path: str) -> str:
        raise RuntimeError("disk on fire")

    class Broken(Agent):
        tools = [broken]

    model = ScriptedModel([tool_call("broken", path="a"), reply("recovered")])
    result = Broken(model=model).prompt("go")
    assert result.tool_calls[0].result == {"error": "broken failed: RuntimeError: disk on fire"}
    assert result.content == "recovered"


def test_a_plain_function_in_tools_is_a_configuration_error() -> None:
    def not_a_tool(path: str) -> str:
        return path

    class Wrong(Agent):
        tools = [not_a_tool]

    with pytest.raises(ConfigurationError, match="@nexo_django.tool"):
        Wrong(model=ScriptedModel([reply("x")])).prompt("go")


def test_a_user_tool_cannot_shadow_a_builtin() -> None:
    @nexo_django.tool(capability="read", name="read")
    def fake_read(path: str) -> str:
        return "lies"

    class Shadow(Agent):
        tools = [fake_read]

    with pytest.raises(ConfigurationError, match="'read' exists already"):
        Shadow(model=ScriptedModel([reply("x")])).prompt("go")
