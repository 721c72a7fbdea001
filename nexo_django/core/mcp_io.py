"""What nexo_django.mcp exchanges with the outside: secrets filled into a server's env and
headers, the async SDK calls (run on the manager's portal), and tool results turned into the
dicts the loop records. ``${settings:NAME}`` references are looked up through the function the
Django side passes in (the core imports no Django)."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, Protocol, TextIO

from .errors import ConfigurationError
from .tools.base import Limits, ToolResult, error


class ServerAddress(Protocol):
    """What :func:`connect` needs of an ``MCPServer``."""

    @property
    def transport(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def timeout(self) -> float: ...

_REFERENCE = re.compile(r"\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Filled-in values shorter than this are not scrubbed from results: they would mangle text.
MIN_SECRET = 4
_MAX_LIST_PAGES = 50
#: Bytes one server-sent event from an HTTP server may hold (the SDK's own default is 1 MiB, and
#: a larger result failed with its size error). A result is received whole, then capped at
#: ``Limits.result_max_chars``; an event above this is an ``{"error"}`` naming the limit.
MESSAGE_MAX_BYTES = 32 * 1024 * 1024
#: The header that carries an HTTP server's session id (protocol 2025-11-25 and before).
SESSION_HEADER = "mcp-session-id"


def client_info() -> Any:
    """How the client names itself to servers: nexo_django and its installed version."""
    from importlib.metadata import PackageNotFoundError, version

    from mcp.types import Implementation

    try:
        installed = version("nexo-django")
    except PackageNotFoundError:  # run from a source tree that was never installed
        installed = "0+unknown"
    return Implementation(name="nexo_django", version=installed)


# --- secrets ---------------------------------------------------------------------------------


def check_references(owner: str, what: str, values: Mapping[str, str]) -> dict[str, str]:
    """Refuse non-string values and malformed ``${...}`` references at declaration time."""
    if not isinstance(values, Mapping):
        raise ConfigurationError(f"{owner}: {what} must be a dict of strings")
    checked: dict[str, str] = {}
    for key, value in values.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigurationError(f"{owner}: {what} keys and values must be strings (see {key!r})")
        for ref in _REFERENCE.findall(value):
            if not _ENV_NAME.fullmatch(ref.removeprefix("settings:")):
                raise ConfigurationError(
                    f"{owner}: {what}[{key!r}] has a bad reference ${{{ref}}}; write ${{ENV_VAR}} or ${{settings:NAME}}"
                )
        checked[key] = value
    return checked


class Secrets:
    """The values filled into references during one run; scrubbed from everything shown."""

    def __init__(self, setting: Callable[[str], Any] | None = None) -> None:
        self._values: set[str] = set()
        #: ``${settings:NAME}`` -> the project's setting NAME (None: no settings to read)
        self._setting = setting

    def fill(self, owner: str, what: str, values: Mapping[str, str]) -> dict[str, str]:
        """Fill ``${ENV_VAR}`` and ``${settings:NAME}`` in; every filled-in value is a secret.
        A missing one is a ``ConfigurationError`` that names it, never a value."""

        def fill_in(key: str, template: str) -> str:
            return _REFERENCE.sub(lambda match: value_of(key, match.group(1)), template)

        def value_of(key: str, ref: str) -> str:
            if ref.startswith("settings:"):
                name = ref.removeprefix("settings:")
                value = self._setting(name) if self._setting is not None else None
                if not isinstance(value, str):
                    raise ConfigurationError(
                        f"{owner}: {what}[{key!r}] refers to settings.{name}, which is not a string setting; define it"
                    )
            else:
                value = os.environ.get(ref)
                if value is None:
                    raise ConfigurationError(
                        f"{owner}: {what}[{key!r}] refers to the environment variable {ref}, which is not set; set it"
                    )
            if len(value) >= MIN_SECRET:
                self._values.add(value)
            return value

        return {key: fill_in(key, template) for key, template in values.items()}

    def redact(self, text: str) -> str:
        for secret in sorted(self._values, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, list):
            return [self.scrub(v) for v in value]
        if isinstance(value, dict):
            return {self.scrub(k): self.scrub(v) for k, v in value.items()}
        return value


def safe_url(url: str) -> str:
    # Userinfo is a credential: never shown.
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return f"{scheme}{sep}{authority}{slash}{path}"


def remote_ref(schema: Any) -> str | None:
    """The first ``$ref`` in a schema that points outside it, if any."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            return ref
        values: Iterable[Any] = schema.values()
    elif isinstance(schema, list):
        values = schema
    else:
        return None
    for value in values:
        found = remote_ref(value)
        if found is not None:
            return found
    return None


# --- the SDK (these run on the portal's event loop) -------------------------------------------


async def refuse_mid_call(context: Any, params: Any) -> Any:
    """A server of the handshake era (protocol 2025-11-25 and before) asking in the middle of a
    call (``elicitation/create``): refused with the reason. The client declares elicitation so
    that servers on 2026-07-28 ask with an ``input_required`` result, which a durable run keeps as
    questions for a person (docs/mcp.md); a question asked mid-call would hold the call, its
    session and the worker open until someone answers."""
    from mcp_types import INVALID_REQUEST, ErrorData

    return ErrorData(code=INVALID_REQUEST, message="nexo_django answers a server's questions durably, from an "
                     "input_required result (protocol 2026-07-28), not in the middle of a call")


@contextlib.asynccontextmanager
async def connect(
    server: ServerAddress, params: Any, stderr: TextIO, session_lost: Callable[[], None] | None = None
) -> AsyncIterator[Any]:
    """An open ``mcp.Client``: ``params`` are StdioServerParameters or the filled-in headers.
    ``session_lost`` is called when an HTTP server answers 404 to a request that carried its
    session id: the session is gone, and the spec says the client MUST start a new one."""
    from mcp import Client

    if server.transport == "stdio":
        from mcp.client.stdio import stdio_client

        async with Client(stdio_client(params, errlog=stderr), client_info=client_info(),
                          elicitation_callback=refuse_mid_call) as client:
            yield client
        return
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async def watch(response: httpx2.Response) -> None:
        # Only a POST answers for a call; the GET stream's 404 would come from the same ended session.
        request = response.request
        lost = response.status_code == 404 and request.method == "POST" and SESSION_HEADER in request.headers
        if lost and session_lost is not None:
            session_lost()

    # trust_env=False: a proxy from the environment would see the headers (and the token).
    timeout = httpx2.Timeout(server.connect_timeout, read=max(server.timeout, server.connect_timeout))
    async with (
        httpx2.AsyncClient(headers=params, timeout=timeout, trust_env=False, event_hooks={"response": [watch]}) as http,
        Client(
            streamable_http_client(server.url, http_client=http, max_sse_event_size=MESSAGE_MAX_BYTES),
            client_info=client_info(), elicitation_callback=refuse_mid_call,
        ) as client,
    ):
        yield client


async def list_tools(client: Any) -> list[Any]:
    listed: list[Any] = []
    cursor: str | None = None
    for _ in range(_MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        listed.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return listed


async def call_tool(client: Any, name: str, args: dict[str, Any], timeout: float,
                    input_responses: dict[str, Any] | None = None, request_state: str | None = None) -> Any:
    """The call's ``CallToolResult``, or the server's ``InputRequiredResult`` (protocol
    2026-07-28: it needs a person's input first), which is handed back, not answered here. With
    ``input_responses`` and ``request_state``: the same call again, with the answers."""
    import anyio
    from mcp.shared.exceptions import MCPError
    from mcp_types import HEADER_MISMATCH

    with anyio.fail_after(timeout):
        try:
            return await client.session.call_tool(
                name, args, read_timeout_seconds=timeout, input_responses=input_responses,
                request_state=request_state, allow_input_required=True)
        except MCPError as exc:
            if exc.code != HEADER_MISMATCH:
                raise
            # The tool's listing changed: Client.call_tool lists again and resends once.
            return await client.call_tool(name, args, read_timeout_seconds=timeout, input_responses=input_responses,
                                          request_state=request_state)


# --- results ---------------------------------------------------------------------------------


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind} {block.mime_type}, {len(block.data)} base64 characters not shown]"
    if kind == "resource_link":
        return f"[resource {block.uri}]"
    if kind == "resource":
        text = getattr(block.resource, "text", None)
        return str(text) if text is not None else f"[binary resource {block.resource.uri}]"
    return f"[{kind} content not shown]"


def convert(name: str, result: Any, limits: Limits) -> ToolResult:
    """``{"content": [text...], "structured": ...}``, or ``{"error"}`` for an ``isError`` result."""
    texts = [_block_text(b) for b in result.content]
    if result.is_error:
        return error(f"MCP tool {name!r} reported an error: {' '.join(texts)[: limits.result_max_chars]}")
    budget = limits.result_max_chars
    kept: list[str] = []
    for text in texts:
        if len(text) > budget:
            kept.append(text[:budget] + f"\n[truncated: {len(text) - budget} more characters]")
            break
        kept.append(text)
        budget -= len(text)
    out: ToolResult = {"content": kept}
    structured = result.structured_content
    if structured is not None:
        if len(json.dumps(structured, default=str)) <= limits.result_max_chars:
            out["structured"] = structured
        else:
            out["structured_omitted"] = "larger than the result limit"
    return out
