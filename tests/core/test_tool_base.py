"""The Tool base: schema validation never fetches anything."""

from __future__ import annotations

import contextlib
import socket
import threading

from nexo_django import Permissions
from nexo_django.core.sandboxes import VirtualSandbox
from nexo_django.core.tools import Tool, ToolContext


def test_a_remote_ref_in_a_schema_is_never_fetched() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    connections: list[object] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            connections.append(listener.accept())

    thread = threading.Thread(target=accept)
    thread.start()
    schema = {
        "type": "object",
        "properties": {"x": {"$ref": f"http://127.0.0.1:{port}/schema.json"}},
        "required": ["x"],
    }
    ran: list[dict] = []
    tool = Tool("t", "", schema, capability="read", idempotent=True, run=lambda a, c: ran.append(a) or {})
    result = tool.invoke({"x": 1}, ToolContext(sandbox=VirtualSandbox(), permissions=Permissions("auto")))
    thread.join()
    listener.close()
    assert connections == []
    assert "error" in result and ran == []


def test_a_tool_without_an_implementation_is_refused_when_declared() -> None:
    import pytest

    with pytest.raises(TypeError, match="run="):
        Tool("t", "", {"type": "object"}, capability="read", idempotent=True)


MEMORY_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "entityType": {"type": "string"},
        "observations": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"contents": {"type": "string"}},
                "required": ["contents"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["name", "entityType", "observations"],
    "additionalProperties": False,
}


def _memory_tool() -> Tool:
    return Tool("create_entity", "", MEMORY_SCHEMA, capability="read", idempotent=True, run=lambda a, c: {})


def test_a_missing_nested_field_is_named_by_its_path() -> None:
    import pytest

    from nexo_django.errors import ToolArgumentError

    args = {"name": "n", "entityType": "t", "observations": [{"contents": "a"}, {}]}
    with pytest.raises(ToolArgumentError) as caught:
        _memory_tool().validate(args)
    assert str(caught.value) == "create_entity: missing required argument observations[1].contents"


def test_a_nested_extra_key_is_named_by_its_path() -> None:
    import pytest

    from nexo_django.errors import ToolArgumentError

    args = {"name": "n", "entityType": "t", "observations": [{"contents": "a", "colour": "red"}]}
    with pytest.raises(ToolArgumentError) as caught:
        _memory_tool().validate(args)
    assert str(caught.value) == "create_entity: unexpected argument observations[0].colour"


def test_top_level_problems_keep_their_plain_names() -> None:
    import pytest

    from nexo_django.errors import ToolArgumentError

    with pytest.raises(ToolArgumentError, match=r"^create_entity: missing required argument entityType$"):
        _memory_tool().validate({"name": "n", "observations": []})
    with pytest.raises(ToolArgumentError, match=r"^create_entity: unexpected argument extra$"):
        _memory_tool().validate({"name": "n", "entityType": "t", "observations": [], "extra": 1})
    with pytest.raises(ToolArgumentError, match=r"^create_entity: argument observations\[0\]\.contents: 5 is not"):
        _memory_tool().validate({"name": "n", "entityType": "t", "observations": [{"contents": 5}]})
