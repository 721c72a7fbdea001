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
