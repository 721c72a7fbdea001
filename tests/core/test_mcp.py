"""MCP servers behind the second gate, against real servers (scripted models throughout).

Over stdio: mcp-server-time from PyPI and tests/mcp_http_server.py in its stdio mode. Over
streamable HTTP: tests/mcp_http_server.py on a loopback port, which refuses requests without
its bearer token. Every run checks that no MCP server process outlives it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import secrets
import select
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nexo_django import Agent, ApprovalRequired, ConfigurationError, Permissions, tool
from nexo_django.core.agent import Reply
from nexo_django.core.errors import ToolArgumentError
from nexo_django.core.mcp import MCPManager, MCPServer, MCPTool
from nexo_django.core.tools.base import Limits
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.servers import descendants, pid_alive

SERVER_SCRIPT = str(Path(__file__).resolve().parents[1] / "mcp_http_server.py")
TOKEN_ENV = "NEXO_TEST_MCP_TOKEN"

TIME = MCPServer.stdio("time", sys.executable, ["-m", "mcp_server_time"])
TEST_STDIO = MCPServer.stdio("test", sys.executable, [SERVER_SCRIPT, "--transport", "stdio"], timeout=2)


def agent_class(*servers: MCPServer) -> type[Agent]:
    return type("MCPAgent", (Agent,), {"mcp_servers": list(servers), "__module__": __name__})


class TimeAgent(Agent):
    """Scripted runs against mcp-server-time over stdio."""

    mcp_servers = [TIME]


class DurableProbe(Agent):
    """Scripted, durable (workers import it): a pre-approved ``pid``, an ``echo`` that waits for
    approval, another ``pid``, then an answer."""

    model = ScriptedModel([tool_call("pid"), tool_call("echo", text="hello"), tool_call("pid"), reply("done")])
    permissions = Permissions("approve", mcp_allow=["pid"])
    mcp_servers = [TEST_STDIO]


# --- watching processes and events ----------------------------------------------------------


def mcp_server_processes() -> set[int]:
    """Live stdio MCP servers started by this test process."""
    found = set()
    for pid in descendants(os.getpid()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if (b"mcp_server_time" in cmdline or b"--transport\x00stdio" in cmdline) and pid_alive(pid):
            found.add(pid)
    return found


class Watch:
    """An ``on_event`` callback: keeps every event and the MCP server processes alive at each
    tool call, so a test can prove a server ran during the run and is gone after it."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.servers: set[int] = set()

    def __call__(self, type: str, data: dict[str, Any]) -> None:
        self.events.append((type, data))
        if type == "tool_call":
            self.servers |= mcp_server_processes()

    def assert_servers_gone(self) -> None:
        assert self.servers, "no MCP server process was seen during the run"
        assert not any(pid_alive(pid) for pid in self.servers)
        assert mcp_server_processes() == set()
        assert not [t for t in threading.enumerate() if t.name == "nexo-mcp"]


def run(
    cls: type[Agent], script: list[Any], permissions: Permissions | str = "auto"
) -> tuple[Reply, ScriptedModel, Watch]:
    model = ScriptedModel(script)
    watch = Watch()
    result = cls(model=model, permissions=permissions, on_event=watch).prompt("scripted")
    return result, model, watch


def results(reply_: Reply) -> list[dict[str, Any] | None]:
    return [c.result for c in reply_.tool_calls]


NOW_UTC = [tool_call("get_current_time", timezone="UTC"), reply("ok")]


def ran_time_tool(result: dict[str, Any] | None) -> bool:
    return result is not None and result.get("structured", {}).get("timezone") == "UTC"


# --- the mode table, over stdio with mcp-server-time ----------------------------------------


def test_time_server_tools_are_attached_with_their_schemas() -> None:
    agent = TimeAgent(model=ScriptedModel([]), permissions="auto")
    try:
        tools = agent.toolset()
        assert {"get_current_time", "convert_time"} <= set(tools)
        tool = tools["get_current_time"]
        assert isinstance(tool, MCPTool)
        assert tool.capability == "mcp"
        assert tool.parameters["required"] == ["timezone"]
        assert tool.idempotent  # mcp-server-time annotates its tools read-only
    finally:
        agent.close()
    assert mcp_server_processes() == set()


def test_scripted_read_only_without_mcp_allow_attaches_no_mcp_tool_and_starts_no_server() -> None:
    result, model, watch = run(TimeAgent, NOW_UTC, Permissions("read_only"))
    assert model.requests[0]["tools"] == ["read", "glob"]
    assert "unknown tool 'get_current_time'" in result.tool_calls[0].result["error"]
    assert result.content == "ok"
    assert watch.servers == set()  # no MCP tool could run, so no server was started


def test_scripted_read_only_with_mcp_allow_runs_exactly_the_named_tools() -> None:
    # Exact, case-sensitive names: "Convert_Time" does not name convert_time.
    gate = Permissions("read_only", mcp_allow=["get_current_time", "Convert_Time"])
    result, model, watch = run(TimeAgent, NOW_UTC, gate)
    assert "get_current_time" in model.requests[0]["tools"]
    assert "convert_time" not in model.requests[0]["tools"]
    assert ran_time_tool(result.tool_calls[0].result)
    watch.assert_servers_gone()


def test_scripted_ask_yes_runs_and_on_ask_sees_the_mcp_args() -> None:
    asked: list[tuple[str, Any]] = []

    def on_ask(capability: str, detail: Any) -> bool:
        asked.append((capability, detail))
        return True

    result, _, watch = run(TimeAgent, NOW_UTC, Permissions("ask", on_ask=on_ask))
    assert asked == [("mcp", {"tool": "get_current_time", "args": {"timezone": "UTC"}})]
    assert ran_time_tool(result.tool_calls[0].result)
    watch.assert_servers_gone()


def test_scripted_ask_no_returns_an_error_and_the_run_goes_on() -> None:
    result, _, watch = run(TimeAgent, NOW_UTC, Permissions("ask", on_ask=lambda c, d: False))
    assert result.tool_calls[0].result == {"error": "MCP tool 'get_current_time' denied: the person asked said no"}
    assert result.content == "ok"
    watch.assert_servers_gone()


def test_scripted_approve_suspends_with_the_mcp_args_pending() -> None:
    watch = Watch()
    agent = TimeAgent(model=ScriptedModel(NOW_UTC), permissions="approve", on_event=watch)
    with pytest.raises(ApprovalRequired) as caught:
        agent.prompt("scripted")
    [pending] = caught.value.pending
    assert (pending.name, pending.capability, pending.args) == ("get_current_time", "mcp", {"timezone": "UTC"})
    watch.assert_servers_gone()


def test_scripted_approve_runs_mcp_allow_names_without_asking() -> None:
    result, _, watch = run(TimeAgent, NOW_UTC, Permissions("approve", mcp_allow=["get_current_time"]))
    assert ran_time_tool(result.tool_calls[0].result)
    watch.assert_servers_gone()


def test_scripted_auto_runs_the_tool() -> None:
    result, _, watch = run(TimeAgent, [tool_call("convert_time", source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo"), reply("ok")])
    assert result.tool_calls[0].result["structured"]["target"]["datetime"].endswith("21:00:00+09:00")
    watch.assert_servers_gone()


def test_scripted_server_side_tool_error_is_an_error_result() -> None:
    result, _, watch = run(TimeAgent, [tool_call("get_current_time", timezone="Nowhere/Atlantis"), reply("ok")])
    assert "reported an error" in result.tool_calls[0].result["error"]
    assert "Nowhere/Atlantis" in result.tool_calls[0].result["error"]
    assert result.content == "ok"
    watch.assert_servers_gone()


def test_scripted_failed_run_still_stops_the_server() -> None:
    # The script ends after the tool call: asking for a second turn fails the run.
    watch = Watch()
    agent = TimeAgent(model=ScriptedModel([tool_call("get_current_time", timezone="UTC")]), permissions="auto", on_event=watch)
    with pytest.raises(Exception, match="scripted model has 1 turns"):
        agent.prompt("scripted")
    watch.assert_servers_gone()


# --- sessions: one per server per run ----------------------------------------------------------

ProbeAgent = agent_class(TEST_STDIO)


def test_scripted_one_session_per_server_per_run() -> None:
    script = [tool_call("pid"), tool_call("pid"), reply("ok")]
    one, _, _ = run(ProbeAgent, script)
    two, _, watch = run(ProbeAgent, script)
    first_run = {r["structured"]["result"] for r in results(one)}
    second_run = {r["structured"]["result"] for r in results(two)}
    assert len(first_run) == 1  # every call of a run reuses its session
    assert len(second_run) == 1
    assert first_run != second_run  # the next run starts its own
    assert watch.servers == second_run
    assert not any(pid_alive(pid) for pid in first_run)
    watch.assert_servers_gone()


def test_scripted_crashed_server_is_an_error_and_the_run_goes_on() -> None:
    result, _, watch = run(ProbeAgent, [tool_call("crash"), tool_call("add", a=1, b=1), reply("ok")])
    crashed, after = results(result)
    assert "error" in crashed
    assert "error" in after
    assert result.content == "ok"
    watch.assert_servers_gone()


def test_scripted_server_that_cannot_start_attaches_nothing_and_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    missing = agent_class(MCPServer.stdio("ghost", "/nonexistent/mcp-server"))
    model = ScriptedModel([tool_call("anything"), reply("ok")])
    with caplog.at_level(logging.WARNING, logger="nexo_django.mcp"):
        result = missing(model=model, permissions="auto").prompt("scripted")
    assert result.content == "ok"
    assert "MCP server 'ghost' is unavailable" in caplog.text
    assert model.requests[0]["tools"] == ["read", "glob", "write"]


# --- declarations ------------------------------------------------------------------------------


def test_args_as_one_string_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="args must be a list of strings"):
        MCPServer.stdio("time", sys.executable, "-m mcp_server_time")  # type: ignore[arg-type]


def test_server_names_must_be_unique() -> None:
    with pytest.raises(ConfigurationError, match="two servers are named 'time'"):
        MCPManager([TIME, TIME])


def test_server_name_with_a_dot_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="MCP server name 'my.time'"):
        MCPServer.http("my.time", "http://127.0.0.1:1/mcp")


def test_missing_environment_variable_fails_the_run_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEXO_TEST_UNSET_VAR", raising=False)
    unset = agent_class(MCPServer.http("web", "http://127.0.0.1:1/mcp", {"Authorization": "Bearer ${NEXO_TEST_UNSET_VAR}"}))
    with pytest.raises(ConfigurationError, match="environment variable NEXO_TEST_UNSET_VAR, which is not set"):
        unset(model=ScriptedModel([reply("ok")]), permissions="auto").prompt("scripted")


def test_repr_shows_no_header_or_env_value() -> None:
    server = MCPServer.http("web", "http://user:pw@127.0.0.1:1/mcp", {"Authorization": "Bearer literal-secret"})
    stdio = MCPServer.stdio("s", "srv", env={"API_KEY": "literal-secret"})
    for text in (repr(server), str(server), repr(stdio)):
        assert "literal-secret" not in text
        assert ":pw@" not in text
    assert "'Authorization': '***'" in repr(server)


# --- streamable HTTP -----------------------------------------------------------------------------


class HTTPServer:
    """tests/mcp_http_server.py over streamable HTTP. ``era="modern"``: the SDK's server as it
    comes (2026-07-28 stateless requests); ``"handshake"``: a server of protocol 2025-11-25 and
    before, with sessions, whose ``expire()`` ends them as its idle timeout would."""

    def __init__(self, era: str = "modern") -> None:
        self.token = secrets.token_hex(16)
        env = {**os.environ, "MCP_TEST_TOKEN": self.token}
        self.proc = subprocess.Popen(
            [sys.executable, SERVER_SCRIPT, "--transport", "http", "--era", era], stdout=subprocess.PIPE, env=env, text=True
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        line = self.proc.stdout.readline() if ready else ""
        if not line.strip().isdigit():
            self.stop()
            pytest.fail(f"the test MCP HTTP server did not start (got {line!r})")
        self.url = f"http://127.0.0.1:{int(line)}/mcp"

    def server(self, **options: Any) -> MCPServer:
        return MCPServer.http("web", self.url, {"Authorization": f"Bearer ${{{TOKEN_ENV}}}"}, **options)

    def expire(self) -> int:
        """End every open session; returns how many there were."""
        answer = httpx.post(self.url.removesuffix("/mcp") + "/expire", headers={"Authorization": f"Bearer {self.token}"}, timeout=20)
        assert answer.status_code == 200
        return int(answer.text)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture(scope="module")
def http_server() -> Iterator[HTTPServer]:
    server = HTTPServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def web(http_server: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> HTTPServer:
    monkeypatch.setenv(TOKEN_ENV, http_server.token)
    return http_server


@pytest.fixture(scope="module")
def handshake_server() -> Iterator[HTTPServer]:
    server = HTTPServer("handshake")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def old_web(handshake_server: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> HTTPServer:
    monkeypatch.setenv(TOKEN_ENV, handshake_server.token)
    return handshake_server


def yes(capability: str, detail: Any) -> bool:
    return True


def no(capability: str, detail: Any) -> bool:
    return False


MODE_TABLE = [
    ("read_only", Permissions("read_only"), "not attached"),
    ("read_only+mcp_allow", Permissions("read_only", mcp_allow=["add"]), "ran"),
    ("ask-yes", Permissions("ask", on_ask=yes), "ran"),
    ("ask-no", Permissions("ask", on_ask=no), "denied"),
    ("approve", Permissions("approve"), "suspended"),
    ("approve+mcp_allow", Permissions("approve", mcp_allow=["add"]), "ran"),
    ("auto", Permissions("auto"), "ran"),
]


@pytest.mark.parametrize(("gate", "expected"), [row[1:] for row in MODE_TABLE], ids=[row[0] for row in MODE_TABLE])
def test_scripted_http_mode_table(web: HTTPServer, gate: Permissions, expected: str) -> None:
    cls = agent_class(web.server())
    model = ScriptedModel([tool_call("add", a=2, b=3), reply("ok")])
    try:
        result = cls(model=model, permissions=gate).prompt("scripted").tool_calls[0].result
    except ApprovalRequired as exc:
        [pending] = exc.pending
        outcome = "suspended" if (pending.name, pending.args) == ("add", {"a": 2, "b": 3}) else repr(pending)
    else:
        assert result is not None
        if result == {"content": ["5"], "structured": {"result": 5}}:
            outcome = "ran"
        elif "unknown tool 'add'" in result.get("error", ""):
            outcome = "not attached"
        elif "denied" in result.get("error", ""):
            outcome = "denied"
        else:
            outcome = repr(result)
    assert outcome == expected
    assert ("add" in model.requests[0]["tools"]) == (expected != "not attached")


def test_scripted_http_token_never_reaches_events_transcripts_or_logs(
    web: HTTPServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The attack: a server that reflects the caller's headers into its tool result.
    watch = Watch()
    cls = agent_class(web.server())
    model = ScriptedModel([tool_call("headers"), reply("ok")])
    with caplog.at_level(logging.DEBUG):
        result = cls(model=model, permissions="auto", on_event=watch).prompt("scripted")
    echoed = result.tool_calls[0].result["structured"]
    assert echoed["authorization"] == "Bearer ***"  # the header was sent, and scrubbed on return
    everything = json.dumps([result.transcript, watch.events, model.requests, repr(cls.mcp_servers)], default=str)
    assert web.token not in everything
    assert web.token not in caplog.text


def test_scripted_http_wrong_token_attaches_nothing_and_logs_no_token(
    http_server: HTTPServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "wrong-" + secrets.token_hex(8)
    monkeypatch.setenv(TOKEN_ENV, wrong)
    cls = agent_class(http_server.server())
    model = ScriptedModel([tool_call("add", a=1, b=2), reply("ok")])
    with caplog.at_level(logging.DEBUG):
        result = cls(model=model, permissions="auto").prompt("scripted")
    assert "unknown tool 'add'" in result.tool_calls[0].result["error"]
    assert "MCP server 'web' is unavailable" in caplog.text
    assert wrong not in caplog.text
    assert wrong not in json.dumps(result.transcript)


def test_scripted_http_token_from_settings(http_server: HTTPServer, settings: Any) -> None:
    settings.NEXO_TEST_MCP_TOKEN_SETTING = http_server.token
    server = MCPServer.http("web", http_server.url, {"Authorization": "Bearer ${settings:NEXO_TEST_MCP_TOKEN_SETTING}"})
    result, _, _ = run(agent_class(server), [tool_call("add", a=2, b=2), reply("ok")])
    assert result.tool_calls[0].result == {"content": ["4"], "structured": {"result": 4}}


def test_scripted_http_timeout_is_an_error(web: HTTPServer) -> None:
    result, _, _ = run(agent_class(web.server(timeout=0.5)), [tool_call("slow", seconds=30), tool_call("add", a=1, b=1), reply("ok")])
    timed_out, added = results(result)
    assert timed_out == {"error": "MCP tool 'slow' timed out after 0.5 s"}
    assert added["content"] == ["2"]


def test_scripted_http_crashed_server_is_an_error_and_the_run_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    doomed = HTTPServer()  # its own server: this test kills it
    try:
        monkeypatch.setenv(TOKEN_ENV, doomed.token)
        result, _, _ = run(agent_class(doomed.server()), [tool_call("crash"), tool_call("add", a=1, b=1), reply("ok")])
    finally:
        doomed.stop()
    crashed, after = results(result)
    assert "error" in crashed
    assert "error" in after
    assert result.content == "ok"
    assert not [t for t in threading.enumerate() if t.name == "nexo-mcp"]


def test_scripted_http_tool_reporting_an_error_is_an_error_result(web: HTTPServer) -> None:
    result, _, _ = run(agent_class(web.server()), [tool_call("fail", message="boom"), reply("ok")])
    assert result.tool_calls[0].result == {"error": "MCP tool 'fail' reported an error: Error executing tool fail: boom"}
    assert result.content == "ok"


def test_scripted_arguments_off_the_server_schema_never_reach_the_server(web: HTTPServer) -> None:
    result, _, _ = run(agent_class(web.server()), [tool_call("add", a="two", b=3), reply("ok")])
    assert result.tool_calls[0].result == {"error": "add: argument a: 'two' is not of type 'integer'"}


def test_scripted_server_that_never_answers_is_given_up_and_killed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pid_file = tmp_path / "pid"
    hang = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    mute = agent_class(MCPServer.stdio("mute", sys.executable, ["-c", hang, str(pid_file)], connect_timeout=1))
    with caplog.at_level(logging.WARNING, logger="nexo_django.mcp"):
        result, _, _ = run(mute, [reply("ok")])
    assert result.content == "ok"
    assert "MCP server 'mute' is unavailable, its tools are not attached: timed out" in caplog.text
    assert not pid_alive(int(pid_file.read_text()))


# --- names -------------------------------------------------------------------------------------


def test_scripted_clashing_names_are_qualified_and_the_gate_sees_the_qualified_name(web: HTTPServer) -> None:
    asked: list[str] = []

    def on_ask(capability: str, detail: Any) -> bool:
        asked.append(detail["tool"])
        return True

    both = agent_class(TIME, web.server())
    script = [tool_call("time__get_current_time", timezone="UTC"), tool_call("web__get_current_time", timezone="UTC"), reply("ok")]
    result, model, watch = run(both, script, Permissions("ask", on_ask=on_ask))
    tools = model.requests[0]["tools"]
    assert "get_current_time" not in tools
    assert {"time__get_current_time", "web__get_current_time", "convert_time", "add"} <= set(tools)
    assert asked == ["time__get_current_time", "web__get_current_time"]
    from_time, from_web = results(result)
    assert ran_time_tool(from_time)
    assert from_web["content"] == ["test server time in UTC"]
    watch.assert_servers_gone()


@pytest.mark.parametrize("time_first", [True, False], ids=["time-first", "web-first"])
def test_scripted_a_tool_claiming_another_servers_qualified_name_never_takes_it(web: HTTPServer, time_first: bool) -> None:
    # The web server lists "time__get_current_time": the name the time server's tool gets when
    # qualified, and the name an allow-list uses for it.
    servers = (TIME, web.server()) if time_first else (web.server(), TIME)
    allowed = Permissions("read_only", mcp_allow=("time__get_current_time",))
    result, model, _ = run(agent_class(*servers), [tool_call("time__get_current_time", timezone="UTC"), reply("ok")], allowed)
    assert model.requests[0]["tools"].count("time__get_current_time") == 1
    assert ran_time_tool(results(result)[0])  # the allow-listed name reached the time server

    script = [tool_call("web__time__get_current_time", timezone="UTC"), reply("ok")]
    result, model, _ = run(agent_class(*servers), script)
    assert {"time__get_current_time", "web__time__get_current_time"} <= set(model.requests[0]["tools"])
    assert results(result)[0]["content"] == ["not the time server: UTC"]


@pytest.mark.parametrize("name", ["a__b", "a_", "a___b"])
def test_server_name_that_could_fake_a_qualified_name_is_refused(name: str) -> None:
    with pytest.raises(ConfigurationError, match="may not contain '__' or end with '_'"):
        MCPServer.stdio(name, sys.executable, ["-m", "mcp_server_time"])


def test_scripted_name_of_a_builtin_tool_is_qualified_and_the_builtin_kept(web: HTTPServer) -> None:
    result, model, _ = run(agent_class(web.server()), [tool_call("web__read", path="x"), reply("ok")])
    assert model.requests[0]["tools"].count("read") == 1
    assert "web__read" in model.requests[0]["tools"]
    assert result.tool_calls[0].result["content"] == ["server-side read of x"]


def test_scripted_prefix_qualifies_every_tool_of_a_server(web: HTTPServer) -> None:
    result, model, _ = run(agent_class(web.server(prefix=True)), [tool_call("web__add", a=1, b=2), reply("ok")])
    tools = model.requests[0]["tools"]
    assert {"web__add", "web__echo"} <= set(tools)
    assert "add" not in tools
    assert result.tool_calls[0].result["content"] == ["3"]


def test_tools_with_unusable_names_or_schemas_are_skipped_with_a_warning(
    web: HTTPServer, caplog: pytest.LogCaptureFixture
) -> None:
    manager = MCPManager([web.server()])
    try:
        with caplog.at_level(logging.WARNING, logger="nexo_django.mcp"):
            names = {t.name for t in manager.tools()}
    finally:
        manager.close()
    assert "add" in names
    assert "broken_schema" not in names
    assert "dotted.name" not in names
    assert "tool 'broken_schema' skipped: invalid input schema" in caplog.text
    assert "tool 'dotted.name' skipped" in caplog.text
    assert "remote_ref" not in names
    assert "tool 'remote_ref' skipped: its input schema refers to 'http://127.0.0.1:9/schema.json'" in caplog.text


def test_remote_schema_reference_is_never_fetched() -> None:
    # The attack: a schema whose "$ref" makes the harness GET a URL at every validation.
    connections: list[bytes] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(1.0)

        def accept() -> None:
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                with conn:
                    connections.append(conn.recv(200))

        watcher = threading.Thread(target=accept)
        watcher.start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/schema.json"
        schema = {"type": "object", "properties": {"value": {"$ref": url}}}
        tool_ = MCPTool(MCPManager([]), server="s", remote_name="t", name="t", description="", parameters=schema, idempotent=False)
        with pytest.raises(ToolArgumentError, match="its input schema cannot be checked"):
            tool_.validate({"value": "x"})
        watcher.join()
    assert connections == []


def test_idempotent_comes_from_the_tool_annotations(web: HTTPServer) -> None:
    manager = MCPManager([web.server()])
    try:
        tools = {t.name: t for t in manager.tools()}
    finally:
        manager.close()
    assert tools["add"].idempotent  # annotated read-only
    assert not tools["echo"].idempotent  # no annotations: an MCP call has effects


@tool(capability="read")
def add(a: int, b: int) -> dict[str, int]:
    """The agent's own add (scripted tests)."""
    return {"own": a + b}


def test_scripted_name_of_an_agents_own_tool_is_qualified_and_its_tool_kept(web: HTTPServer) -> None:
    cls = type("OwnAdd", (Agent,), {"mcp_servers": [web.server()], "tools": [add], "__module__": __name__})
    result, model, _ = run(cls, [[tool_call("add", a=1, b=2), tool_call("web__add", a=1, b=2)], reply("ok")])
    assert model.requests[0]["tools"].count("add") == 1
    own, remote = results(result)
    assert own == {"own": 3}
    assert remote["content"] == ["3"]


# --- durable: suspend on an MCP call, resume in a worker --------------------------------------


# Not `durable`: the MCP session across a worker does not depend on the database, so the
# PostgreSQL pass leaves it to the SQLite run (docs/testing.md).
@pytest.mark.django_db(transaction=True)
@pytest.mark.redis
def test_scripted_durable_mcp_call_is_approved_and_resumed_by_a_worker_with_a_fresh_session(rq_worker: Any) -> None:
    from nexo_django.models import AgentRun, CallStatus, RunStatus
    from tests.servers import wait_until

    def status_is(run: AgentRun, status: str) -> AgentRun | None:
        fresh = AgentRun.objects.get(pk=run.pk)
        return fresh if fresh.status == status else None

    rq_worker(1)
    run = DurableProbe.run_later("scripted")
    run = wait_until(lambda: status_is(run, RunStatus.SUSPENDED), timeout=60, what="the run to suspend")
    [pending] = run.pending_calls()
    assert (pending.name, pending.capability, pending.args) == ("echo", "mcp", {"text": "hello"})
    assert not pending.idempotent
    first_pid = run.transcript()[2]["content"]["structured"]["result"]
    assert not pid_alive(first_pid)  # the worker closed the session when the run suspended

    pending.approve()
    run = wait_until(lambda: status_is(run, RunStatus.DONE), timeout=60, what="the resumed run to finish")
    tool_results = [m["content"] for m in run.transcript() if m["role"] == "tool"]
    assert tool_results[1] == {"content": ["hello"], "structured": {"result": "hello"}}
    second_pid = tool_results[2]["structured"]["result"]
    assert second_pid != first_pid  # a fresh session in the resuming worker
    assert not pid_alive(second_pid)
    pending.refresh_from_db()
    assert pending.status == CallStatus.SUCCEEDED
    assert run.result == "done"


# --- the protocol: versions, sessions that end, large results, the client's name ----------------


@contextlib.contextmanager
def opened(server: MCPServer) -> Iterator[dict[str, MCPTool]]:
    manager = MCPManager([server])
    try:
        yield {t.name: t for t in manager.tools()}
    finally:
        manager.close()


def session_of(result: dict[str, Any]) -> str:
    return str(result["structured"]["mcp-session-id"])


def test_an_ended_session_is_replaced_and_the_call_runs_again_on_the_new_one(
    old_web: HTTPServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The server ends the session between two calls (as its idle timeout does) and answers 404
    # for the old id: the spec says the client MUST start a new session.
    with opened(old_web.server()) as tools:
        manager = tools["add"]._manager
        first = manager.call(tools["headers"], {})
        assert old_web.expire() >= 1
        with caplog.at_level(logging.INFO, logger="nexo_django.mcp"):
            second = manager.call(tools["headers"], {})
        third = manager.call(tools["add"], {"a": 2, "b": 3})
    assert "error" not in second, second
    assert session_of(second) != session_of(first)  # the call ran again, on a new session
    assert third == {"content": ["5"], "structured": {"result": 5}}  # and the run goes on with it
    assert "MCP server 'web' ended the session; the call of 'headers' runs again on a new session" in caplog.text


def test_an_ended_session_in_a_scripted_run_costs_no_call(old_web: HTTPServer) -> None:
    @tool(capability="read")
    def end_sessions() -> dict[str, int]:
        """Ends the server's sessions (scripted test)."""
        return {"ended": old_web.expire()}

    cls = type("Expiring", (Agent,), {"mcp_servers": [old_web.server()], "tools": [end_sessions], "__module__": __name__})
    script = [tool_call("add", a=1, b=1), tool_call("end_sessions"), tool_call("add", a=2, b=2), tool_call("add", a=3, b=3), reply("ok")]
    result, _, _ = run(cls, script)
    assert [r.get("structured", r) for r in results(result)] == [{"result": 2}, {"ended": 1}, {"result": 4}, {"result": 6}]


SSE_RESULT = 2 * 1024 * 1024  # above the SDK's 1 MiB limit for one server-sent event


@pytest.mark.parametrize("era", ["handshake", "modern"])
def test_a_2_mib_result_is_capped_at_the_result_limit(era: str, old_web: HTTPServer, http_server: HTTPServer, monkeypatch: pytest.MonkeyPatch) -> None:
    server = old_web if era == "handshake" else http_server  # handshake: the result is one server-sent event
    monkeypatch.setenv(TOKEN_ENV, server.token)
    limits = Limits(result_max_chars=1000)
    with opened(server.server()) as tools:
        result = tools["big"]._manager.call(tools["big"], {"size": SSE_RESULT}, limits)
    assert result == {"content": ["x" * 1000 + f"\n[truncated: {SSE_RESULT - 1000} more characters]"], "structured_omitted": "larger than the result limit"}


@pytest.mark.parametrize(
    ("era", "protocol"), [("modern", "2026-07-28"), ("handshake", "2025-11-25"), ("stdio", "2026-07-28")]
)
def test_the_client_names_itself_nexo_django_in_every_tested_protocol_version(
    era: str, protocol: str, http_server: HTTPServer, old_web: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/mcp.md lists these versions as the tested ones.
    if era == "stdio":
        server = TEST_STDIO
    else:
        monkeypatch.setenv(TOKEN_ENV, (http_server if era == "modern" else old_web).token)
        server = (http_server if era == "modern" else old_web).server()
    with opened(server) as tools:
        seen = tools["client"]._manager.call(tools["client"], {})
    assert seen["structured"] == {"name": "nexo_django", "version": importlib.metadata.version("nexo-django"), "protocol": protocol}


@pytest.mark.parametrize("era", ["modern", "handshake"])
def test_a_tool_that_needs_input_from_the_client_is_an_error_result(
    era: str, http_server: HTTPServer, old_web: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In process nobody can answer a server's question: an input_required result (2026-07-28) is
    # an error result naming it, a request mid-call (before) is refused; the run goes on.
    server = http_server if era == "modern" else old_web
    monkeypatch.setenv(TOKEN_ENV, server.token)
    result, _, _ = run(agent_class(server.server()), [tool_call("ask"), tool_call("add", a=1, b=1), reply("ok")])
    asked, added = results(result)
    if era == "modern":  # asked as input_required: in process nobody can answer (durable: tests/durable/test_elicitation.py)
        assert asked == {"error": "ask needs a person's input: __main__:which_word: Which word?. Answering it needs a "
                                  "durable run (the agent's run or run_later), which keeps the questions for a person"}
    else:  # asked mid-call: refused by the client, with the reason
        assert asked["error"].startswith("MCP tool 'ask' failed: ") and "answers a server's questions durably" in asked["error"]
    assert added["content"] == ["2"]
