"""The confined shell (bubblewrap), tried as an attacker would, checking the outside world.

Every check runs twice: as the worker's own user (root on CI, as many containers run) and as an
unprivileged user (uid 65534; when the tests already run unprivileged, that same user). Each
call runs in a fresh worker process (:data:`DRIVER`) that holds a secret in its environment;
the assertions look at what the command printed *and* at the host: files that must not exist,
listeners that must have received nothing. Where a check could pass for a wrong reason, the same
attack is first shown to work unconfined.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nexo_django import Agent
from nexo_django.core.sandboxes.confine import ShellPolicy
from nexo_django.core.sandboxes.local import LocalSandbox
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.core.test_shell import none_running, unique_sleep

ROOT = os.geteuid() == 0
SECRET = "nexo-worker-secret-" + os.urandom(6).hex()
SYSTEM_PYTHON = "/usr/bin/python3"

#: A worker: imports everything first, becomes uid 65534 if asked (root only), then runs the
#: calls in a LocalSandbox and prints the results as JSON.
DRIVER = r"""
import json, os, sys
import encodings.idna  # what getaddrinfo needs later: this worker cannot import it once it is uid 65534
from nexo_django.core.sandboxes.confine import ShellPolicy
from nexo_django.core.sandboxes.local import LocalSandbox
from nexo_django.core.sandboxes import confined
from nexo_django.core.tools import netguard
from nexo_django.core.tools.egress import EgressProxy
spec = json.loads(sys.argv[1])
names = spec.pop("resolve", None) or {}
def resolve(host, port):
    return [names[host]] if host in names else netguard.system_resolver(host, port)
policy = ShellPolicy.from_spec(spec["policy"], egress=EgressProxy)
if names:
    import dataclasses
    policy = dataclasses.replace(policy, resolve=resolve)
if spec["uid"] is not None and os.geteuid() == 0:
    os.setgroups([])
    os.setgid(spec["uid"])
    os.setuid(spec["uid"])
exec(spec.get("prelude") or "")
sandbox = LocalSandbox(spec["ws"], shell=policy)
results = [sandbox.shell(c, timeout=spec["timeout"], max_output=65536) for c in spec["calls"]]
print(json.dumps({"uid": os.getuid(), "results": results}))
"""


@pytest.fixture(params=["worker", "unprivileged"])
def who(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def uid_for(who: str) -> int | None:
    return 65534 if who == "unprivileged" and ROOT else None


@pytest.fixture
def ws(who: str) -> Iterator[Path]:
    """A workspace the user of ``who`` owns (pytest's tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="nexo-confine-ws-"))
    uid = uid_for(who)
    if uid is not None:
        os.chown(folder, uid, uid)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def outside() -> Iterator[Path]:
    """A world-readable, world-writable folder outside the workspace, with a world-readable file."""
    folder = Path(tempfile.mkdtemp(prefix="nexo-confine-outside-"))
    folder.chmod(0o777)
    (folder / "secret.txt").write_text(f"outside {SECRET}\n")
    (folder / "secret.txt").chmod(0o644)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def policy_for(who: str, **fields: Any) -> dict[str, Any]:
    # The unprivileged user cannot even open this test run's interpreter (it lives in root's
    # home): its in-sandbox forwarder uses the system's python3. The worker case uses the default.
    if uid_for(who) is not None and fields.get("network"):
        fields.setdefault("python", SYSTEM_PYTHON)
    return ShellPolicy(**fields).to_spec()


def start(who: str, ws: Path, *calls: str, timeout: float = 20, resolve: dict[str, str] | None = None,
          env: dict[str, str] | None = None, prelude: str = "", **policy: Any) -> subprocess.Popen[str]:
    """A worker process running ``calls`` (``prelude``: Python it runs first, as its user)."""
    spec = {"uid": uid_for(who), "ws": str(ws), "timeout": timeout, "calls": list(calls),
            "policy": policy_for(who, **policy), "resolve": resolve, "prelude": prelude}
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, json.dumps(spec)],
        env={"PATH": "/usr/bin:/bin", "NEXO_WORKER_SECRET": SECRET, **(env or {})},
        cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish(who: str, proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    out = json.loads(stdout)
    assert out["uid"] == (uid_for(who) if uid_for(who) is not None else os.getuid())
    results: list[dict[str, Any]] = out["results"]
    return results


def run(who: str, ws: Path, *calls: str, **options: Any) -> list[dict[str, Any]]:
    return finish(who, start(who, ws, *calls, **options))


def text(result: dict[str, Any]) -> str:
    return str(result.get("stdout", "")) + str(result.get("stderr", "")) + str(result.get("error", ""))


# --- what a command sees ---------------------------------------------------------------------------


def test_a_world_readable_file_outside_the_workspace_is_never_read(who: str, ws: Path, outside: Path) -> None:
    project_settings = Path(__file__).parents[1] / "settings.py"
    command = f"cat {outside}/secret.txt; cat {project_settings}; ls {outside} {Path.home()} {Path(__file__).parent}"
    [result] = run(who, ws, command)
    assert SECRET not in text(result)
    assert "DATABASES" not in text(result)  # the Django project's settings
    assert result["stderr"].count("No such file or directory") == 5
    # The same command, unconfined, does read the file: the test can tell.
    unconfined = LocalSandbox(ws, confine=False).shell(f"cat {outside}/secret.txt", timeout=10, max_output=1000)
    assert SECRET in unconfined["stdout"]


def test_etc_shadow_gshadow_and_sudoers_are_not_there(who: str, ws: Path) -> None:
    [result] = run(who, ws, "cat /etc/shadow /etc/gshadow /etc/sudoers; ls /etc; ls /etc/ssl; cat /etc/passwd")
    listed = result["stdout"].split()
    assert not {"shadow", "gshadow", "sudoers", "ssh", "private"} & set(listed)  # ssl/private: TLS keys
    assert "certs" in listed and "ld.so.cache" in listed
    assert result["stderr"].count("No such file or directory") == 3
    assert "root:x:0:0" in result["stdout"] and "sandbox:x:65534" in result["stdout"]
    host_users = {line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines()} - {"root"}
    assert not any(f"\n{user}:" in result["stdout"] for user in host_users)  # a passwd of its own


def test_the_workers_environment_is_not_in_any_proc_environ(who: str, ws: Path) -> None:
    [result] = run(who, ws, "for f in /proc/[0-9]*/environ; do echo \"== $f\"; cat $f; echo; done; ls /proc | grep -c '^[0-9]'; env")
    assert SECRET not in text(result)
    processes = int([line for line in result["stdout"].splitlines() if line.isdigit()][-1])
    assert processes <= 4  # its own PID namespace: the shell, ls, grep (and the sandbox's init)
    assert "NEXO_WORKER_SECRET" not in result["stdout"]


def test_writes_outside_the_workspace_never_land(who: str, ws: Path, outside: Path) -> None:
    marker = f"nexo-confine-{os.urandom(4).hex()}"
    command = (
        f"echo x > {outside}/{marker}; touch /tmp/{marker}; mkdir /{marker}; echo y > /usr/{marker}; "
        f"echo z > /etc/{marker}; echo w > $HOME/{marker}; echo inside > inside.txt"
    )
    [result] = run(who, ws, command)
    assert result["exit_code"] == 0
    for path in (outside / marker, Path("/tmp") / marker, Path("/") / marker, Path("/usr") / marker, Path("/etc") / marker):
        assert not path.exists(), path
    assert (outside / "secret.txt").read_text() == f"outside {SECRET}\n"
    assert (ws / "inside.txt").read_text() == "inside\n"  # the workspace is read-write


class Listener:
    """A loopback TCP server and a Unix socket server (path and abstract) that count connections."""

    def __init__(self, folder: Path) -> None:
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self.path = str(folder / "outside.sock")
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(self.path)
        os.chmod(self.path, 0o777)
        self.abstract_name = f"nexo-confine-{os.urandom(4).hex()}"
        self.abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.abstract.bind("\0" + self.abstract_name)
        self.accepted: list[str] = []
        self.servers = {"tcp": self.tcp, "unix": self.unix, "abstract": self.abstract}
        for name, server in self.servers.items():
            server.listen(8)
            server.settimeout(0.2)
            threading.Thread(target=self._serve, args=(name, server), daemon=True).start()

    def _serve(self, name: str, server: socket.socket) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(name)
            conn.close()

    def close(self) -> None:
        for server in self.servers.values():
            server.close()


PROBE = (
    "import socket, sys\n"
    "for family, address in ((socket.AF_INET, ('127.0.0.1', {port})), (socket.AF_UNIX, {path!r}), (socket.AF_UNIX, '\\0' + {name!r})):\n"
    "    s = socket.socket(family, socket.SOCK_STREAM); s.settimeout(2)\n"
    "    try: s.connect(address); print('connected', address)\n"
    "    except OSError as e: print('refused', e)\n"
)


def test_a_loopback_server_and_unix_sockets_outside_receive_no_connection(who: str, ws: Path, outside: Path) -> None:
    listener = Listener(outside)
    try:
        probe = PROBE.format(port=listener.port, path=listener.path, name=listener.abstract_name)
        script = ws / "probe.py"
        script.write_text(probe)
        script.chmod(0o644)
        [result] = run(who, ws, f"{SYSTEM_PYTHON} probe.py; bash -c 'exec 3<>/dev/tcp/127.0.0.1/{listener.port}' || echo bash-refused")
        time.sleep(0.5)
        assert listener.accepted == []
        lines = result["stdout"].splitlines()
        assert len(lines) == 4 and all(line.startswith("refused") for line in lines[:3]), lines
        assert lines[3] == "bash-refused"
        # Unconfined, the same probe reaches all three: the listeners do count.
        LocalSandbox(ws, confine=False).shell(f"{SYSTEM_PYTHON} probe.py", timeout=10, max_output=1000)
        deadline = time.monotonic() + 5
        while len(listener.accepted) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(listener.accepted) == ["abstract", "tcp", "unix"]
    finally:
        listener.close()


# --- privileges, caps, lifetime --------------------------------------------------------------------------


def test_no_capabilities_no_new_privs_and_an_unprivileged_uid(who: str, ws: Path) -> None:
    [result] = run(who, ws, "grep -E '^(CapEff|CapPrm|CapInh|CapAmb|NoNewPrivs)' /proc/self/status; id -u; id -g")
    lines = dict(line.split(":\t") for line in result["stdout"].splitlines() if ":\t" in line)
    assert lines["CapEff"] == lines["CapPrm"] == lines["CapInh"] == lines["CapAmb"] == "0000000000000000"
    assert lines["NoNewPrivs"] == "1"
    assert result["stdout"].splitlines()[-2:] == ["65534", "65534"]


def test_proc_is_read_only_and_the_hosts_sysctls_stay_untouched(who: str, ws: Path) -> None:
    # For a root worker the sandbox is uid 0 outside, and sysctl files check owner bits, not
    # capabilities: /proc/sys/kernel/core_pattern would be a way out. A harmless global one here.
    sysctl = Path("/proc/sys/fs/lease-break-time")
    before = sysctl.read_text()
    try:
        [result] = run(who, ws, f"echo {int(before) + 1} > {sysctl}; echo x > /proc/self/comm; cat {sysctl}")
        assert sysctl.read_text() == before
        assert result["stderr"].count("Read-only file system") == 2 and result["stdout"] == before
    finally:
        if ROOT and sysctl.read_text() != before:
            sysctl.write_text(before)


def test_no_user_namespace_can_be_made_inside(who: str, ws: Path) -> None:
    [result] = run(who, ws, "unshare -U true && echo made; unshare -Urn true && echo made; echo done")
    assert result["stdout"] == "done\n"


def test_a_background_process_dies_with_the_call(who: str, ws: Path) -> None:
    marker = unique_sleep()
    command = f"(while :; do echo t >> tick; sleep 0.05; done) >/dev/null 2>&1 & sleep {marker} >/dev/null 2>&1 & sleep 0.3; echo started"
    [result] = run(who, ws, command)
    assert result["exit_code"] == 0 and result["stdout"] == "started\n"
    assert none_running(marker)
    size = (ws / "tick").stat().st_size
    assert size > 0  # the loop did run
    time.sleep(0.4)
    assert (ws / "tick").stat().st_size == size  # and stopped when the call returned


def test_the_timeout_kills_the_whole_sandbox(who: str, ws: Path) -> None:
    marker = unique_sleep()
    [result] = run(who, ws, f"setsid sleep {marker} & (sleep {marker}; echo late > late) & wait", timeout=0.5)
    assert result["error"] == "shell: command timed out after 0.5 s"
    assert none_running(marker)  # setsid did not let it escape: the PID namespace is gone
    time.sleep(0.2)
    assert not (ws / "late").exists()


def test_a_4_gib_allocation_stops_at_the_cap_at_once(who: str, ws: Path) -> None:
    probe = (
        "import resource\n"
        "try:\n    bytearray(4 << 30)\nexcept MemoryError:\n    print('MemoryError')\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    (ws / "alloc.py").write_text(probe)
    (ws / "alloc.py").chmod(0o644)
    [result] = run(who, ws, f"{SYSTEM_PYTHON} alloc.py")
    first, peak_kib = result["stdout"].split()
    assert first == "MemoryError"
    assert int(peak_kib) < 200 * 1024  # refused up front, never filled


def test_a_file_stops_at_the_size_cap(who: str, ws: Path) -> None:
    [result] = run(who, ws, "head -c 3000000 /dev/zero > big; echo $?", file_size=1024 * 1024)
    assert result["stdout"].strip() != "0"
    assert (ws / "big").stat().st_size == 1024 * 1024


def test_a_busy_loop_stops_at_the_cpu_cap(who: str, ws: Path) -> None:
    [result] = run(who, ws, "sh -c 'while :; do :; done'; echo $?", cpu_seconds=1)
    assert result["stdout"] == "152\n"  # 128 + SIGXCPU: stopped by the cap, long before the timeout


def test_a_fork_bomb_is_held_at_the_process_cap_for_every_worker(who: str, ws: Path) -> None:
    # Linux never applies RLIMIT_NPROC to uid 0: a root worker's command runs as uid 65534 on the
    # host (setpriv), so the cap binds it too. Before, 150 processes ran under a cap of 40.
    (ws / "forks.py").write_text(
        "import os, time\nn = 0\ntry:\n    while n < 500:\n        if os.fork() == 0:\n            time.sleep(3); os._exit(0)\n"
        "        n += 1\nexcept OSError as e:\n    print('stopped', n)\nelse:\n    print('forked', n)\n"
    )
    (ws / "forks.py").chmod(0o644)
    [result] = run(who, ws, f"{SYSTEM_PYTHON} forks.py", processes=40)
    word, count = result["stdout"].split()
    assert word == "stopped" and int(count) < 40


# --- protected names ----------------------------------------------------------------------------------------


def test_a_missing_git_folder_cannot_be_created(who: str, ws: Path) -> None:
    [result] = run(who, ws, "mkdir .git/hooks; echo evil > .git/config; rmdir .git; mv .git x; echo done")
    assert result["stdout"] == "done\n"
    assert not (ws / ".git").exists() and not (ws / "x").exists()  # and the placeholder is gone


def test_an_existing_git_folder_and_protected_names_are_read_only(who: str, ws: Path) -> None:
    uid = uid_for(who)
    hooks = ws / ".git" / "hooks"
    hooks.mkdir(parents=True)
    (hooks / "pre-commit").write_text("#!/bin/sh\ntrue\n")
    (ws / ".bashrc").write_text("# mine\n")
    (ws / "sub" / ".git").mkdir(parents=True)
    (ws / "sub" / ".git" / "config").write_text("[core]\n")
    if uid is not None:
        for path in [ws, *ws.rglob("*")]:
            os.chown(path, uid, uid)
    command = (
        "echo evil > .git/hooks/pre-commit; echo evil > .git/hooks/post-checkout; echo evil >> .bashrc; "
        "echo '[core] fsmonitor = evil' > sub/.git/config; rm -rf .git sub/.git; echo ok > sub/fine; echo done"
    )
    [result] = run(who, ws, command)
    assert result["stdout"] == "done\n"
    assert (hooks / "pre-commit").read_text() == "#!/bin/sh\ntrue\n"
    assert not (hooks / "post-checkout").exists()
    assert (ws / ".bashrc").read_text() == "# mine\n"
    assert (ws / "sub" / ".git" / "config").read_text() == "[core]\n"
    assert (ws / "sub" / "fine").read_text() == "ok\n"


def test_no_setuid_or_setgid_program_is_left_in_the_workspace(who: str, ws: Path) -> None:
    command = "cp /bin/true suid; chmod 4755 suid; mkdir -p deep/er; cp /bin/true deep/er/sgid; chmod 2755 deep/er/sgid; stat -c %a suid"
    [result] = run(who, ws, command)
    assert result["stdout"] == "755\n"  # the seccomp filter refuses the bit ...
    assert result["stderr"].count("Operation not permitted") == 2
    for path in (ws / "suid", ws / "deep" / "er" / "sgid"):
        assert path.stat().st_mode & 0o7777 == 0o755  # ... and none is there after the call


def test_a_git_symlink_is_refused_and_nothing_runs(who: str, ws: Path, outside: Path) -> None:
    (ws / ".git").symlink_to(outside)
    [result] = run(who, ws, "touch ran")
    assert "symbolic link" in result["error"]
    assert not (ws / "ran").exists()


# --- fail closed ------------------------------------------------------------------------------------------


def test_missing_bubblewrap_runs_nothing(who: str, ws: Path) -> None:
    results = run(who, ws, "touch ran", env={"PATH": "/nonexistent"})
    results += run(who, ws, "touch ran", bwrap="/nonexistent/bwrap")
    for result in results:
        assert set(result) == {"error"}
        assert "bubblewrap" in result["error"] and "apt-get install bubblewrap" in result["error"]
        assert "CONFINE" not in result["error"] or "False" in result["error"]
    assert not (ws / "ran").exists()


def test_a_bubblewrap_that_cannot_set_up_runs_nothing(who: str, ws: Path, outside: Path) -> None:
    fake = outside / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    [result] = run(who, ws, "touch ran", bwrap=str(fake))
    assert result["error"].startswith("shell: bubblewrap could not set up the sandbox, nothing ran")
    assert "uid map" in result["error"] and "user namespaces" in result["error"]
    assert not (ws / "ran").exists()


def test_a_missing_read_path_runs_nothing(who: str, ws: Path) -> None:
    [result] = run(who, ws, "touch ran", read=("/nonexistent/tools",))
    assert "/nonexistent/tools" in result["error"]
    assert not (ws / "ran").exists()


def test_read_paths_are_visible_read_only(who: str, ws: Path, outside: Path) -> None:
    [result] = run(who, ws, f"cat {outside}/secret.txt; echo x > {outside}/new", read=(str(outside),))
    assert SECRET in result["stdout"] and "Read-only file system" in result["stderr"]
    assert not (outside / "new").exists()


# --- the egress proxy -------------------------------------------------------------------------------------


class Origin:
    """A loopback HTTP server that records each request line it receives (and each connection)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.server.settimeout(0.2)
        self.requests: list[str] = []
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                self.requests.append(data.split(b"\r\n", 1)[0].decode())
                if data.startswith(b"PING"):
                    conn.sendall(b"PONG\n")
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n")

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def origins() -> Iterator[list[Origin]]:
    servers = [Origin() for _ in range(3)]
    try:
        yield servers
    finally:
        for server in servers:
            server.close()


def test_without_network_hosts_there_is_no_proxy_and_no_route(who: str, ws: Path, origins: list[Origin]) -> None:
    [result] = run(who, ws, f"env | grep -ci proxy; curl -sS -m 3 http://127.0.0.1:{origins[0].port}/")
    assert result["stdout"].strip() == "0"
    assert "Failed to connect" in result["stderr"] or "Couldn't connect" in result["stderr"]
    assert origins[0].connections == 0


def test_an_allowed_host_is_reached_through_the_proxy_and_nothing_else(who: str, ws: Path, origins: list[Origin]) -> None:
    allowed, other, local = origins
    ports = (allowed.port, other.port, local.port)
    tunnel = (
        "import socket\ns = socket.create_connection(('127.0.0.1', 3128), timeout=5)\n"
        f"s.sendall(b'CONNECT allowed.test:{allowed.port} HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n')\n"
        "print(s.recv(4096).split(b'\\r\\n')[0].decode())\ns.sendall(b'PING\\r\\n\\r\\n')\nprint(s.recv(100).decode().strip())\n"
    )
    (ws / "tunnel.py").write_text(tunnel)
    (ws / "tunnel.py").chmod(0o644)
    calls = [
        f"curl -sS -m 5 http://allowed.test:{allowed.port}/yes",
        f"curl -sS -m 5 http://other.test:{other.port}/no",
        f"{SYSTEM_PYTHON} tunnel.py",
        f"curl -sS -m 5 http://127.0.0.1:{other.port}/direct --noproxy '*'",
        f"curl -sS -m 5 -p http://metadata.test:{other.port}/latest/meta-data/",
        "curl -sS -m 5 http://allowed.test:1/elsewhere",
    ]
    results = run(who, ws, *calls, network=("allowed.test", "metadata.test"), ports=ports, allow_private=True,
                  resolve={"allowed.test": "127.0.0.1", "other.test": "127.0.0.1", "metadata.test": "169.254.169.254"})
    assert results[0]["stdout"] == "hello\n"
    assert "refused GET http://other.test" in results[1]["stdout"] and "NETWORK" in results[1]["stdout"]
    assert results[2]["stdout"].split("\n")[:2] == ["HTTP/1.1 200 Connection established", "PONG"]
    assert "connect" in results[3]["stderr"].lower()
    assert "403" in results[4]["stderr"]  # link-local (cloud metadata): never, even with allow_private
    assert "port 1 is not allowed" in results[5]["stdout"]
    assert allowed.requests == ["GET /yes HTTP/1.1", "PING"]  # origin-form: the proxy rewrote it
    assert other.connections == 0


def test_an_allowed_name_resolving_to_loopback_is_refused_by_default(who: str, ws: Path, origins: list[Origin]) -> None:
    # The real resolver, the real name: "localhost" is on the allow-list, and still refused,
    # because it resolves to a loopback address (fetch's guard, at connect time).
    local = origins[0]
    calls = [f"curl -sS -m 5 http://localhost:{local.port}/x", f"curl -sS -m 5 -p http://localhost:{local.port}/y"]
    results = run(who, ws, *calls, network=("localhost",), ports=(local.port,))
    assert "resolves to 127.0.0.1, a blocked loopback address" in results[0]["stdout"]
    assert "shell_allow_private" in results[0]["stdout"]
    assert "403" in results[1]["stderr"]
    time.sleep(0.2)
    assert local.connections == 0


# --- settings, and the model -------------------------------------------------------------------------


def test_settings_reach_the_sandbox_an_agent_builds(tmp_path: Path) -> None:
    from django.test import override_settings

    model = ScriptedModel([reply("ok")])
    default = Agent(cwd=tmp_path, sandbox="local", model=model).workspace
    assert isinstance(default, LocalSandbox) and default.shell_policy == ShellPolicy()
    shell = {"NETWORK": ["pypi.org"], "READ": ["/opt"], "BWRAP": "/usr/bin/bwrap"}
    with override_settings(NEXO={"SHELL": shell, "LIMITS": {"shell_memory": 1024**3, "shell_ports": [443]}}):
        built = Agent(cwd=tmp_path, sandbox="local", model=model).workspace
    assert isinstance(built, LocalSandbox)
    assert built.shell_policy == ShellPolicy(network=("pypi.org",), read=("/opt",), bwrap="/usr/bin/bwrap",
                                             memory=1024**3, ports=(443,))
    with override_settings(NEXO={"SHELL": {"CONFINE": False}}):
        off = Agent(cwd=tmp_path, sandbox="local", model=model).workspace
    assert isinstance(off, LocalSandbox) and off.shell_policy.confine is False


def test_the_model_cannot_turn_confinement_off_scripted(tmp_path: Path, outside: Path) -> None:
    command = f"cat {outside}/secret.txt"
    model = ScriptedModel([
        [tool_call("shell", command=command, confine=False), tool_call("shell", command=command)],
        reply("done"),
    ])
    reply_ = Agent(cwd=tmp_path, sandbox="local", model=model, permissions="auto").prompt("go")
    extra, plain = (call.result for call in reply_.tool_calls)
    assert "unexpected argument confine" in extra["error"]
    assert SECRET not in json.dumps(plain) and "No such file" in plain["stderr"]


def test_the_shell_limits_default_to_the_policys_defaults() -> None:
    from nexo_django.core.tools.base import Limits
    from nexo_django.core.tools.shell_settings import shell_policy

    assert shell_policy({}, Limits()) == ShellPolicy()


def test_network_hosts_without_an_egress_proxy_run_nothing(tmp_path: Path) -> None:
    sandbox = LocalSandbox(tmp_path, shell=ShellPolicy(network=("pypi.org",)))
    result = sandbox.shell("touch ran", timeout=10, max_output=1000)
    assert "no egress proxy" in result["error"] and "EgressProxy" in result["error"]
    assert not (tmp_path / "ran").exists()


class DurableShell(Agent):
    """Scripted: one shell command under approve, with NETWORK hosts from settings."""

    model = ScriptedModel([tool_call("shell", command="id -u; ls /run/nexo; env | grep -c '^http_proxy='"), reply("Ran.")])
    sandbox = "local"
    permissions = "approve"


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_an_approved_durable_call_runs_confined_with_its_egress(tmp_path: Path) -> None:
    from django.test import override_settings

    from nexo_django.models import ToolCall

    with override_settings(NEXO={"SHELL": {"NETWORK": ["pypi.org"]}}):
        run = DurableShell.run("go", cwd=tmp_path)
        assert run.status == "suspended"
        run.resume(approved=True)  # the agent rebuilt from the database and settings, as another worker would
    call = ToolCall.objects.get(run=run, name="shell")
    assert call.result == {"exit_code": 0, "stdout": "65534\negress.sock\n1\n", "stderr": "", "truncated": False}
