"""MCP servers as tools behind the second gate (``Permissions.authorize_mcp``).

Declare servers on an agent with :class:`MCPServer`; the agent builds one :class:`MCPManager`
per run, which opens one session per server lazily, lists the servers' tools as
:class:`MCPTool` objects and closes every session (and every stdio child process) when the run
ends, suspends or fails. The loop stays synchronous: the async SDK runs on one event loop in
one thread per run (an anyio blocking portal) and nowhere else. See docs/mcp.md.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TextIO

from . import mcp_input, mcp_io
from .errors import ConfigurationError, ToolArgumentError
from .tools.base import Limits, Tool, ToolContext, ToolResult, error

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

logger = logging.getLogger("nexo_django.mcp")

#: Server names become name prefixes, so they keep to what every model provider accepts.
SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
#: Tool names model providers accept (OpenAI and Anthropic: letters, digits, ``_``, ``-``, <= 64).
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Between a server name and a tool name when a name must be qualified: ``time__get_current_time``.
SEPARATOR = "__"
#: Names no MCP tool may take unqualified, whatever the mode attaches: the contract tool names.
BUILTIN_NAMES = frozenset({"read", "glob", "write", "shell", "fetch", "search"})

#: How long close() waits for a session (and its child process) to wind down.
_CLOSE_WAIT = 15.0


@dataclass(frozen=True, repr=False, eq=False)
class MCPServer:
    """One MCP server an agent may use. Build it with :meth:`stdio` or :meth:`http`.

    ``env`` and ``headers`` values are literal strings in which ``${ENV_VAR}`` and
    ``${settings:NAME}`` are filled in when the session opens; filled-in values are secrets:
    they never appear in reprs, errors, logs, events or tool results.
    """

    name: str
    transport: Literal["stdio", "http"]
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    #: Seconds one tool call may take before it returns ``{"error"}``.
    timeout: float = 60.0
    #: Seconds to start the server (or reach it) and list its tools.
    connect_timeout: float = 20.0
    #: Always qualify this server's tool names (``server__tool``), clash or not.
    prefix: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not SERVER_NAME.fullmatch(self.name):
            raise ConfigurationError(
                f"MCP server name {self.name!r}: use 1-32 letters, digits, '_' or '-' (it prefixes tool names)"
            )
        if SEPARATOR in self.name or self.name.endswith("_"):
            # So that "server__tool" names one server's tool and nothing else: with "a__b" or
            # "a_" allowed, server "a" could list a tool that qualifies to another's name.
            raise ConfigurationError(
                f"MCP server name {self.name!r}: it may not contain {SEPARATOR!r} or end with '_', "
                f"since {SEPARATOR!r} separates a server name from a tool name"
            )
        for limit in ("timeout", "connect_timeout"):
            value = getattr(self, limit)
            if not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigurationError(f"MCP server {self.name!r}: {limit} must be a positive number of seconds")

    @classmethod
    def stdio(
        cls,
        name: str,
        command: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        *,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 20.0,
        prefix: bool = False,
    ) -> MCPServer:
        """A server started as a child process that speaks MCP on its stdin/stdout. It gets
        ``env`` over a minimal environment (PATH, HOME, USER, LOGNAME, SHELL, TERM), never the
        worker's own variables."""
        owner = f"MCP server {name!r}"
        if not isinstance(command, str) or not command:
            raise ConfigurationError(f"{owner}: command must be a non-empty string, e.g. 'uvx'")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise ConfigurationError(f"{owner}: args must be a list of strings, e.g. ['-m', 'mcp_server_time']")
        return cls(
            name,
            "stdio",
            command=command,
            args=tuple(args),
            env=mcp_io.check_references(owner, "env", env or {}),
            cwd=os.fspath(cwd) if cwd is not None else None,
            timeout=timeout,
            connect_timeout=connect_timeout,
            prefix=prefix,
        )

    @classmethod
    def http(
        cls,
        name: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        timeout: float = 60.0,
        connect_timeout: float = 20.0,
        prefix: bool = False,
    ) -> MCPServer:
        """A server reached over streamable HTTP at ``url``. Proxies from the environment are
        not used; redirects are followed only within the URL's origin (the SDK's rule)."""
        owner = f"MCP server {name!r}"
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"{owner}: url must start with http:// or https://")
        return cls(
            name,
            "http",
            url=url,
            headers=mcp_io.check_references(owner, "headers", headers or {}),
            timeout=timeout,
            connect_timeout=connect_timeout,
            prefix=prefix,
        )

    def __repr__(self) -> str:
        if self.transport == "stdio":
            where = f"command={self.command!r}, args={list(self.args)!r}, env={dict.fromkeys(self.env, '***')!r}"
        else:
            where = f"url={mcp_io.safe_url(self.url)!r}, headers={dict.fromkeys(self.headers, '***')!r}"
        return f"MCPServer.{self.transport}({self.name!r}, {where})"

    __str__ = __repr__


class MCPTool(Tool):
    """A tool of an MCP server. Its gate is ``authorize_mcp(name, args)`` with the name the model
    sees; it runs inside its server, outside the sandbox."""

    def __init__(
        self,
        manager: MCPManager,
        *,
        server: str,
        remote_name: str,
        name: str,
        description: str,
        parameters: dict[str, Any],
        idempotent: bool,
    ) -> None:
        super().__init__(name, description, parameters, capability="mcp", idempotent=idempotent)
        self.server = server
        self.remote_name = remote_name
        self._manager = manager

    def __repr__(self) -> str:
        return f"<MCPTool {self.name} server={self.server} tool={self.remote_name}>"

    def validate(self, args: Any) -> dict[str, Any]:
        try:
            return super().validate(args)
        except ToolArgumentError:
            raise
        except Exception as exc:  # an unresolvable "$ref" and the like: the schema's fault
            raise ToolArgumentError(f"{self.name}: its input schema cannot be checked: {exc}") from exc

    def gate(self, args: dict[str, Any], ctx: ToolContext) -> None:
        ctx.permissions.authorize_mcp(self.name, args)

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return self._manager.call(self, args, ctx.limits, answers=ctx.answers)


@dataclass
class _Session:
    server: MCPServer
    #: Set by the holder task once the session is open and its tools are listed.
    listed: concurrent.futures.Future[list[Any]] = field(default_factory=concurrent.futures.Future)
    holder: concurrent.futures.Future[None] | None = None
    client: Any = None
    wake: Any = None  # anyio.Event, made on the portal's loop: set to close or renew the session
    #: Set by renew() and resolved by the holder task once the new session is open.
    renewed: concurrent.futures.Future[None] | None = None
    stopping: bool = False
    #: Set when the server answered 404 to a request carrying this session's id.
    lost: bool = False
    failure: str | None = None

    def mark_lost(self) -> None:
        self.lost = True


class MCPManager:
    """The MCP sessions of one run: ``tools()`` opens them (once), ``close()`` ends them.

    ``reserved`` names (the agent's own tools) and the built-in tool names are never given to an
    MCP tool unqualified.
    """

    def __init__(
        self, servers: Iterable[MCPServer], reserved: Iterable[str] = (),
        setting: Callable[[str], Any] | None = None,
    ) -> None:
        self.servers: list[MCPServer] = list(servers)
        seen: set[str] = set()
        for server in self.servers:
            if not isinstance(server, MCPServer):
                raise ConfigurationError(
                    f"mcp_servers: {server!r} is not an MCPServer; use MCPServer.stdio(...) or MCPServer.http(...)"
                )
            if server.name in seen:
                raise ConfigurationError(f"mcp_servers: two servers are named {server.name!r}; names must be unique")
            seen.add(server.name)
        self.reserved = frozenset(reserved) | BUILTIN_NAMES
        self.secrets = mcp_io.Secrets(setting)
        self._sessions: dict[str, _Session] = {}
        self._stack = contextlib.ExitStack()
        self._portal: BlockingPortal | None = None
        self._tools: list[MCPTool] | None = None
        self._stderr: TextIO = sys.stderr
        self._closed = False

    def __repr__(self) -> str:
        return f"<MCPManager servers={[s.name for s in self.servers]!r} open={not self._closed}>"

    # --- opening and listing ----------------------------------------------------------------

    def tools(self) -> list[MCPTool]:
        """Open every session (in parallel) and return the servers' tools, named by the rule in
        docs/mcp.md. A server that cannot be reached is logged and contributes no tools."""
        if self._tools is not None:
            return self._tools
        if self._closed:
            raise RuntimeError("this MCPManager is closed; the agent makes a new one for the next run")
        for server in self.servers:
            self._sessions[server.name] = _Session(server)
        params = {name: self._parameters(s) for name, s in self._sessions.items()}  # may raise: config
        self._stderr = self._errlog()
        portal = self._open_portal()
        for name, session in self._sessions.items():
            session.holder = portal.start_task_soon(self._hold, session, params[name], name=f"mcp:{name}")
        listings: list[tuple[MCPServer, list[Any]]] = []
        for session in self._sessions.values():
            try:
                listings.append((session.server, session.listed.result(timeout=session.server.connect_timeout + 10)))
            except Exception as exc:  # a server that cannot start must not stop the run
                session.failure = self._describe(exc)
                logger.warning("MCP server %r is unavailable, its tools are not attached: %s", session.server.name, session.failure)
        self._tools = self._name_tools(listings)
        return self._tools

    def _open_portal(self) -> BlockingPortal:
        if self._portal is None:
            from anyio.from_thread import start_blocking_portal

            self._portal = self._stack.enter_context(start_blocking_portal(name="nexo-mcp"))
        return self._portal

    def _parameters(self, session: _Session) -> Any:
        server = session.server
        owner = f"MCP server {server.name!r}"
        if server.transport == "http":
            return self.secrets.fill(owner, "headers", server.headers)
        from mcp.client.stdio import StdioServerParameters

        env = self.secrets.fill(owner, "env", server.env)
        return StdioServerParameters(command=server.command, args=list(server.args), env=env, cwd=server.cwd)

    def _errlog(self) -> TextIO:
        # The child's stderr goes where ours goes; a stderr without a descriptor (captured
        # output, some embedders) cannot be handed to a child, so it gets /dev/null.
        try:
            sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            return self._stack.enter_context(open(os.devnull, "w"))  # noqa: SIM115 - closed with the stack
        return sys.stderr

    async def _hold(self, session: _Session, params: Any) -> None:
        """Own one server's session for the whole run: open it, list its tools, wait for close().
        When call() finds the session ended by the server, it wakes this task to open a new one."""
        import anyio

        server = session.server
        try:
            while not session.stopping:
                with anyio.fail_after(server.connect_timeout) as scope:
                    async with mcp_io.connect(server, params, self._stderr, session.mark_lost) as client:
                        listed = None if session.listed.done() else await mcp_io.list_tools(client)
                        scope.deadline = math.inf  # connected: from here on only close() or renew() ends it
                        session.client, session.lost = client, False
                        session.wake = anyio.Event()
                        if listed is not None:
                            session.listed.set_result(listed)
                        elif session.renewed is not None:
                            session.renewed.set_result(None)
                        if not session.stopping:  # close() may have come while this one opened
                            await session.wake.wait()
                        session.client = None
        except Exception as exc:  # reported to the run, never raised in the portal
            session.failure = self._describe(exc)
            if not session.listed.done():
                session.listed.set_exception(exc)
            else:
                logger.warning("MCP server %r closed its session: %s", server.name, session.failure)
                if session.renewed is not None and not session.renewed.done():
                    session.renewed.set_exception(exc)
        except BaseException:  # cancellation: mark the session ended, let it propagate
            session.failure = session.failure or "the session was cancelled"
            for waiting in (session.listed, session.renewed):
                if waiting is not None and not waiting.done():
                    waiting.set_exception(RuntimeError(session.failure))
            raise
        finally:
            session.client = None

    def _name_tools(self, listings: list[tuple[MCPServer, list[Any]]]) -> list[MCPTool]:
        """Bare names when unique; ``server__tool`` for every tool whose name another server
        shares or a reserved name takes, whose name contains ``__`` (so a server cannot claim
        another server's qualified name), and for every tool of a ``prefix=True`` server."""
        counts = Counter(t.name for _, listed in listings for t in listed)
        candidates: list[tuple[str, MCPServer, Any]] = []
        for server, listed in listings:
            for remote in listed:
                if not isinstance(remote.name, str) or not TOOL_NAME.fullmatch(remote.name):
                    logger.warning(
                        "MCP server %r: tool %r skipped: model providers accept only letters, digits, '_' and '-'",
                        server.name, remote.name,
                    )
                    continue
                qualify = (
                    server.prefix
                    or counts[remote.name] > 1
                    or remote.name in self.reserved
                    # "b__c" from server "a" would pass for server "b"'s tool "c": it is "a__b__c".
                    or SEPARATOR in remote.name
                )
                name = f"{server.name}{SEPARATOR}{remote.name}" if qualify else remote.name
                candidates.append((name, server, remote))
        final = Counter(name for name, _, _ in candidates)
        tools: list[MCPTool] = []
        for name, server, remote in candidates:
            if final[name] > 1 or name in self.reserved or not TOOL_NAME.fullmatch(name):
                logger.warning("MCP server %r: tool %r skipped: its name %r is taken or too long", server.name, remote.name, name)
                continue
            schema = dict(remote.input_schema or {"type": "object"})
            remote_ref = mcp_io.remote_ref(schema)
            if remote_ref is not None:
                logger.warning(
                    "MCP server %r: tool %r skipped: its input schema refers to %r; only local references (#...) are followed",
                    server.name, remote.name, remote_ref,
                )
                continue
            annotations = remote.annotations
            idempotent = bool(annotations and (annotations.read_only_hint or annotations.idempotent_hint))
            try:
                tool = MCPTool(
                    self,
                    server=server.name,
                    remote_name=remote.name,
                    name=name,
                    description=remote.description or remote.title or f"{remote.name} (MCP server {server.name})",
                    parameters=schema,
                    idempotent=idempotent,
                )
            except Exception as exc:  # jsonschema.SchemaError and friends
                logger.warning("MCP server %r: tool %r skipped: invalid input schema: %s", server.name, remote.name, str(exc).splitlines()[0])
                continue
            tools.append(tool)
        return tools

    # --- calling ----------------------------------------------------------------------------

    def call(self, tool: MCPTool, args: dict[str, Any], limits: Limits | None = None,
             answers: mcp_input.Answers | None = None) -> ToolResult:
        """Run one call on the tool's server. Never raises for the server's failures: a server
        error, a timeout or a crashed server is ``{"error": ...}``. A call the server refused
        because it ended the session (404 for its id) runs once more, on a new session."""
        session = self._sessions.get(tool.server)
        if self._closed or self._portal is None or session is None:
            return error(f"MCP tool {tool.name!r}: its session is closed")
        if session.client is None:
            return error(f"MCP tool {tool.name!r}: server {tool.server!r} is unavailable: {session.failure or 'not connected'}")
        outcome = self._call_once(tool, session, args, answers)
        if session.lost and isinstance(outcome, dict):
            # The 404 answered this call's request, so the server never ran it: a new session
            # (the spec's MUST), and the call once more.
            renewed = self._renew(session)
            if renewed is not None:
                return error(f"MCP tool {tool.name!r}: server {tool.server!r} ended the session, and a new one could not be opened: {renewed}")
            logger.info("MCP server %r ended the session; the call of %r runs again on a new session", tool.server, tool.name)
            outcome = self._call_once(tool, session, args, answers)
        if isinstance(outcome, dict):
            return outcome
        if getattr(outcome, "result_type", None) == "input_required":
            # The server needs a person's input first: the loop's journal keeps the asks.
            try:
                raise mcp_input.read(tool.name, outcome)
            except mcp_input.InputRefused as exc:
                return error(f"MCP tool {tool.name!r} asked for input that cannot be asked: {exc}")
        return self.secrets.scrub(mcp_io.convert(tool.name, outcome, limits or Limits()))

    def _call_once(self, tool: MCPTool, session: _Session, args: dict[str, Any],
                   answers: mcp_input.Answers | None = None) -> Any:
        """The SDK's result (an ``InputRequiredResult`` too), or the ``{"error"}`` the model gets."""
        assert self._portal is not None
        timeout = session.server.timeout
        session.lost = False
        given = mcp_input.responses(answers) if answers is not None else None
        state = answers.state if answers is not None else None
        try:
            return self._portal.call(mcp_io.call_tool, session.client, tool.remote_name, args, timeout, given, state)
        except TimeoutError:
            return error(f"MCP tool {tool.name!r} timed out after {timeout:g} s")
        except Exception as exc:  # the run goes on
            return error(f"MCP tool {tool.name!r} failed: {self._describe(exc)}")

    def _renew(self, session: _Session) -> str | None:
        """Have the holder task close the ended session and open a new one; None when it is
        open, else why not."""
        assert self._portal is not None
        if session.wake is None or session.holder is None or session.holder.done():
            return session.failure or "the session is closed"
        session.renewed = concurrent.futures.Future()
        self._portal.call(session.wake.set)
        try:
            session.renewed.result(timeout=session.server.connect_timeout + 10)
        except Exception as exc:
            return self._describe(exc)
        finally:
            session.renewed = None
        return None

    def _describe(self, exc: BaseException) -> str:
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        if isinstance(exc, TimeoutError):
            return "timed out"
        text = str(exc) or type(exc).__name__
        return self.secrets.redact(f"{type(exc).__name__}: {text}" if str(exc) else text)

    # --- closing ----------------------------------------------------------------------------

    def close(self) -> None:
        """End every session; a stdio server process is stopped and reaped before this returns."""
        if self._closed:
            return
        self._closed = True
        portal = self._portal
        try:
            if portal is not None:
                for session in self._sessions.values():
                    if session.holder is None or session.holder.done():
                        continue
                    session.stopping = True
                    if session.wake is None:
                        session.holder.cancel()  # still connecting: stop trying
                    else:
                        with contextlib.suppress(Exception):
                            portal.call(session.wake.set)
                holders = [s.holder for s in self._sessions.values() if s.holder is not None]
                _done, late = concurrent.futures.wait(holders, timeout=_CLOSE_WAIT)
                for holder in late:
                    holder.cancel()  # cancels the task; the SDK's stdio shutdown is shielded
        finally:
            self._stack.close()  # stops the portal and joins its thread
            self._portal = None
