"""A hostile MCP server (the mcp SDK's own, over stdio, protocol 2026-07-28): each tool answers
``input_required`` with something a client must refuse or bound (a regex that backtracks for ever,
a javascript: link, a thousand requests, a state of megabytes, keys with a NUL), or misbehaves on
the retry (an error, a different state each round). Every retry is counted in the file named by
``NEXO_TEST_MCP_COUNT`` (the server's own count).

Run as ``python tests/hostile_mcp_server.py``.
"""

from __future__ import annotations

import os
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.request_state import RequestStateSecurity
from mcp.types import (
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    InputRequiredResult,
)


def _count(what: str) -> None:
    if os.environ.get("NEXO_TEST_MCP_COUNT"):
        with open(os.environ["NEXO_TEST_MCP_COUNT"], "a") as counted:
            counted.write(f"{what}\n")


def _form(schema: dict[str, Any], message: str = "Answer me") -> ElicitRequest:
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


def _ask(requests: dict[str, ElicitRequest], state: str = "s") -> InputRequiredResult:
    return InputRequiredResult(input_requests=requests, request_state=state)


WORD = {"type": "object", "properties": {"word": {"type": "string"}}}
#: nested objects in a field's default: no form draws them
DEEP: dict[str, Any] = {}
for _ in range(20):  # deeper than the edge takes, not deeper than the SDK parses
    DEEP = {"x": DEEP}

HOSTILE: dict[str, Any] = {
    # a string field whose pattern backtracks exponentially: validating "aaaa…!" takes for ever
    "redos": lambda: _ask({"q": _form({"type": "object", "properties": {
        "word": {"type": "string", "pattern": "^(a+)+$"}}})}),
    "redos_keys": lambda: _ask({"q": _form({"type": "object", "properties": {"word": {"type": "string"}},
                                            "patternProperties": {"^(a+)+$": {"type": "string"}}})}),
    "remote_ref": lambda: _ask({"q": _form({"type": "object", "properties": {
        "word": {"type": "string", "$ref": "http://127.0.0.1:9/schema.json"}}})}),
    "js_url": lambda: InputRequiredResult(input_requests={"q": ElicitRequest(params=ElicitRequestURLParams(
        message="Open it", url="javascript:alert(document.cookie)"))}, request_state="s"),
    "file_url": lambda: InputRequiredResult(input_requests={"q": ElicitRequest(params=ElicitRequestURLParams(
        message="Open it", url="file:///etc/passwd"))}, request_state="s"),
    "many": lambda: _ask({f"k{i}": _form(WORD) for i in range(1000)}),
    "huge_state": lambda: _ask({"q": _form(WORD)}, state="x" * 5_000_000),
    "nul_key": lambda: _ask({"a\x00b": _form(WORD)}),
    "long_key": lambda: _ask({"k" * 10_000: _form(WORD)}),
    "huge_schema": lambda: _ask({"q": _form({"type": "object", "properties": {
        "word": {"type": "string", "description": "d" * 2_000_000}}})}),
    "deep_schema": lambda: _ask({"q": _form({"type": "object", "properties": {
        "word": {"type": "string", "default": DEEP}}})}),
    "password_format": lambda: _ask({"q": _form({"type": "object", "properties": {
        "word": {"type": "string", "format": "password"}}})}),
    "markup": lambda: _ask({"q": _form({"type": "object", "properties": {
        "word": {"type": "string", "title": "<img src=x onerror=alert(1)>"}}},
        message="<script>alert(1)</script> <!channel> <https://evil.example|Approve>")}),
}


def _hostile(name: str, make: Any) -> Any:
    def tool(ctx: Context) -> str | InputRequiredResult:
        if ctx.input_responses:
            _count(name)
            return f"retried {name}"
        return make()  # type: ignore[no-any-return]
    return tool


def build_server() -> MCPServer:
    server = MCPServer("hostile", request_state_security=RequestStateSecurity(
        keys=["hostile-server-state-key-0123456789abcdef"], ttl=3600))
    for name, make in HOSTILE.items():
        server.tool(name=name, description=f"Asks for hostile input ({name}).")(_hostile(name, make))

    @server.tool(description="Asks a word, then fails on the retry.")
    def fails_on_retry(ctx: Context) -> str | InputRequiredResult:
        if ctx.input_responses:
            _count("fails_on_retry")
            raise ToolError("the server broke on the retry")
        return _ask({"q": _form(WORD)})

    @server.tool(description="Asks again once with a different state; echoes the state of the last retry.")
    def shifty(ctx: Context) -> str | InputRequiredResult:
        if not ctx.input_responses:
            return _ask({"q": _form(WORD)}, state="state-1")
        _count(f"shifty {ctx.request_state}")
        if ctx.request_state == "state-1":
            return _ask({"q": _form(WORD)}, state="state-2")
        return f"finished with {ctx.request_state}"

    return server


if __name__ == "__main__":
    build_server().run()
