"""The ``shell`` tool over a local workspace. Not a sandbox (docs/sandboxes.md): these tests check
what it does promise: a fresh minimal environment, no stdin, no inherited descriptors, its own
process group killed at the timeout, output capped in bytes, a timeout returned as ``{"error"}``."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nexo_django import Agent, Permissions
from nexo_django.core.sandboxes.local import LocalSandbox
from nexo_django.core.tools import SHELL, Limits, ToolContext
from nexo_django.testing import ScriptedModel, reply, tool_call


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


def shell(ws: Path, command: str, **limits: Any) -> dict[str, Any]:
    ctx = ToolContext(sandbox=LocalSandbox(ws), permissions=Permissions("auto"), limits=Limits(**limits))
    return SHELL.invoke({"command": command}, ctx)


def gone(pid: int, within: float = 3.0) -> bool:
    """The process no longer runs (absent, or a zombie waiting for a reaper)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False


def test_runs_in_the_workspace_and_reports_the_exit_code(ws: Path) -> None:
    result = shell(ws, "pwd; echo oops >&2; exit 3")
    assert result == {"exit_code": 3, "stdout": f"{os.path.realpath(ws)}\n", "stderr": "oops\n", "truncated": False}


def test_environment_is_fresh_and_minimal(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXO_TEST_SECRET", "hunter2")
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/evil.so")
    monkeypatch.setenv("PYTHONPATH", "/nonexistent")
    result = shell(ws, "env")
    env = dict(line.split("=", 1) for line in result["stdout"].splitlines())
    assert "hunter2" not in result["stdout"]
    assert "LD_PRELOAD" not in env and "BASH_ENV" not in env and "PYTHONPATH" not in env
    assert set(env) <= {"PATH", "HOME", "LANG", "TMPDIR", "PYTHONNOUSERSITE", "PWD", "SHLVL", "_", "OLDPWD"}
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert env["LANG"] == "C.UTF-8" and env["PYTHONNOUSERSITE"] == "1"


def test_home_is_private_empty_fresh_and_removed_afterwards(ws: Path) -> None:
    command = 'echo "$HOME"; stat -c %a "$HOME"; ls -A "$HOME" | wc -l; echo x > "$HOME/.bash_history"'
    first, second = shell(ws, command), shell(ws, command)
    home, mode, entries = first["stdout"].split()
    assert (mode, entries) == ("700", "0")
    assert not home.startswith(os.path.realpath(ws)) and not os.path.exists(home)
    assert second["stdout"].split()[1:] == ["700", "0"]  # nothing the first command left
    assert second["stdout"].split()[0] != home
    assert os.listdir(ws) == []


def test_python_user_site_packages_are_off(ws: Path) -> None:
    if not os.path.exists("/usr/bin/python3"):
        pytest.fail("this test needs /usr/bin/python3 (apt-get install python3)")
    result = shell(ws, "python3 -c 'import site; print(site.ENABLE_USER_SITE)'")
    assert result["stdout"] == "False\n"


def test_bash_env_of_the_worker_is_not_sourced(ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "sourced"
    script = tmp_path / "evil-bashenv"
    script.write_text(f"touch {marker}\n")
    monkeypatch.setenv("BASH_ENV", str(script))
    monkeypatch.setenv("ENV", str(script))
    result = shell(ws, "bash -c true; sh -c true")
    assert result["exit_code"] == 0
    assert not marker.exists()


def test_tmpdir_is_private_and_removed_afterwards(ws: Path) -> None:
    result = shell(ws, 'echo "$TMPDIR"; touch "$TMPDIR/scratch" && echo ok')
    tmpdir, ok = result["stdout"].split()
    assert ok == "ok"
    assert not tmpdir.startswith(str(ws))
    assert not os.path.exists(tmpdir)


@pytest.fixture
def stdin_held_open() -> Iterator[None]:
    """Make this process's fd 0 a pipe nobody writes to: a child that inherited it would block."""
    saved = os.dup(0)
    read_end, write_end = os.pipe()
    os.dup2(read_end, 0)
    try:
        yield
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)


def test_stdin_is_empty(ws: Path, stdin_held_open: None) -> None:
    started = time.monotonic()
    result = shell(ws, "cat; echo read-all", shell_timeout=5)
    assert result["exit_code"] == 0 and result["stdout"] == "read-all\n"
    assert time.monotonic() - started < 2.5


def test_no_descriptor_is_inherited(ws: Path) -> None:
    read_end, write_end = os.pipe()
    os.set_inheritable(read_end, True)
    os.set_inheritable(write_end, True)
    try:
        result = shell(ws, f"for fd in {read_end} {write_end}; do [ -e /proc/$$/fd/$fd ] && echo leaked $fd; done; ls /proc/$$/fd")
    finally:
        os.close(read_end)
        os.close(write_end)
    assert "leaked" not in result["stdout"]
    assert {int(fd) for fd in result["stdout"].split()} == {0, 1, 2}


def test_timeout_is_an_error_with_the_output_so_far(ws: Path) -> None:
    started = time.monotonic()
    result = shell(ws, "echo started; sleep 30", shell_timeout=0.5)
    assert result["error"] == "shell: command timed out after 0.5 s"
    assert result["stdout"] == "started\n"
    assert time.monotonic() - started < 3


def test_timeout_kills_the_whole_process_group(ws: Path) -> None:
    # The background child keeps stdout open, so the command only ends at the timeout.
    result = shell(ws, "sleep 30 & echo $!; wait", shell_timeout=0.5)
    assert "timed out" in result["error"]
    assert gone(int(result["stdout"]))


def test_background_child_does_not_outlive_a_finished_command(ws: Path) -> None:
    result = shell(ws, "sleep 30 >/dev/null 2>&1 & echo $!", shell_timeout=5)
    assert result["exit_code"] == 0
    assert gone(int(result["stdout"]))


def test_runs_in_its_own_session(ws: Path) -> None:
    result = shell(ws, "cut -d' ' -f6 /proc/$$/stat")  # field 6: the session id
    assert int(result["stdout"]) != os.getsid(0)


def test_output_is_capped_in_bytes(ws: Path) -> None:
    result = shell(ws, "head -c 5000 /dev/zero | tr '\\0' a; echo done >&2", shell_max_output=1000)
    assert result["stdout"] == "a" * 1000
    assert result["stderr"] == "done\n"
    assert result["truncated"] is True and result["exit_code"] == 0


def test_endless_output_is_stopped_not_drained_until_the_timeout(ws: Path) -> None:
    started = time.monotonic()
    result = shell(ws, "yes", shell_max_output=1000, shell_timeout=20)
    assert time.monotonic() - started < 5
    assert result["stdout"] == "y\n" * 500
    assert result["truncated"] is True
    assert "stopped" in result["note"]


def test_invalid_utf8_output_is_replaced(ws: Path) -> None:
    result = shell(ws, "printf 'ok\\377\\376'")
    assert result["stdout"] == "ok\ufffd\ufffd"


def test_shell_is_gated(ws: Path) -> None:
    marker = ws / "ran"
    ctx = ToolContext(sandbox=LocalSandbox(ws), permissions=Permissions("read_only"))
    result = SHELL.invoke({"command": f"touch {marker}"}, ctx)
    assert "denied" in result["error"]
    assert not marker.exists()


def test_scripted_agent_runs_shell_in_a_local_workspace(ws: Path) -> None:
    model = ScriptedModel([tool_call("shell", command="echo hi > out.txt; cat out.txt"), reply("done")])
    result = Agent(cwd=ws, sandbox="local", model=model, permissions="auto").prompt("go")
    assert result.tool_calls[0].result == {"exit_code": 0, "stdout": "hi\n", "stderr": "", "truncated": False}
    assert (ws / "out.txt").read_text() == "hi\n"


def test_scripted_read_only_agent_is_not_offered_shell(ws: Path) -> None:
    model = ScriptedModel([reply("nothing to do")])
    Agent(cwd=ws, sandbox="local", model=model).prompt("go")
    assert "shell" not in model.requests[0]["tools"]


# --- the worker's environment through /proc ---------------------------------------------------------

#: Plays a worker holding a secret in its environment. As root it first becomes an unprivileged
#: user (root reads any process's environ, dumpable or not: the docs say so), and sets itself
#: dumpable again as a worker started as that user would be (a uid change clears the flag).
WORKER = r"""
import ctypes, json, os, subprocess, sys
from nexo_django.core.sandboxes.local import LocalSandbox
from nexo_django.core.sandboxes.shell import is_dumpable
sandbox = LocalSandbox(sys.argv[1])
if os.geteuid() == 0:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    ctypes.CDLL(None).prctl(4, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
before = subprocess.run(["/bin/cat", f"/proc/{os.getpid()}/environ"], capture_output=True).stdout.decode()
result = sandbox.shell("cat /proc/$PPID/environ; echo; id -u", timeout=10, max_output=65536)
print(json.dumps({"uid": os.getuid(), "before": before, "result": result, "dumpable": is_dumpable()}))
"""


@pytest.fixture
def open_ws() -> Iterator[Path]:
    """A workspace an unprivileged user can enter (pytest's tmp_path is private to its owner)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="nexo-environ-"))
    if os.geteuid() == 0:
        os.chown(folder, 65534, 65534)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def as_unprivileged_worker(script: str, ws: Path, **env: str) -> dict[str, Any]:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", script, str(ws)],
        env={"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp", **env},
        cwd=ws, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout)
    return seen


def test_the_workers_environment_is_not_readable_through_proc_ppid(open_ws: Path) -> None:
    secret = "nexo-test-secret-" + os.urandom(8).hex()
    seen = as_unprivileged_worker(WORKER, open_ws, NEXO_TEST_WORKER_SECRET=secret)
    assert seen["uid"] != 0  # an unprivileged reader, as the worker's own user
    assert secret in seen["before"]  # a reader of the same user could read it before the shell ran
    result = seen["result"]
    assert secret not in result["stdout"] and secret not in result["stderr"]
    assert "Permission denied" in result["stderr"]
    assert result["stdout"].split()[-1] == str(seen["uid"])  # the command did run, as that user
    assert seen["dumpable"] is False


LOCKER = WORKER.replace(
    'result = sandbox.shell("cat /proc/$PPID/environ; echo; id -u", timeout=10, max_output=65536)',
    'result = sandbox.shell(\'mkdir -p "$HOME/locked/in" && touch "$HOME/locked/in/f" && chmod 000 "$HOME/locked" && echo "$HOME"\', timeout=10, max_output=65536)',
)


def test_a_home_the_command_locked_is_still_removed(open_ws: Path) -> None:
    seen = as_unprivileged_worker(LOCKER, open_ws)
    assert seen["uid"] != 0  # root would remove it whatever its modes
    home = seen["result"]["stdout"].strip()
    assert home.endswith("/home") and not os.path.exists(os.path.dirname(home))


def test_root_still_reads_a_non_dumpable_workers_environment(open_ws: Path) -> None:
    # The caveat docs/sandboxes.md states: the flag stops the worker's own user, not root
    # (CAP_SYS_PTRACE). This test process is the reader; as an unprivileged user it is refused.
    import subprocess
    import sys

    secret = "nexo-test-secret-" + os.urandom(8).hex()
    holder = (
        "import sys\nfrom nexo_django.sandboxes.local import LocalSandbox\n"
        "LocalSandbox(sys.argv[1]).shell('true', timeout=10, max_output=100)\n"
        "print('ready', flush=True)\nsys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", holder, str(open_ws)], env={"PATH": "/usr/bin:/bin", "NEXO_TEST_WORKER_SECRET": secret},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        environ = Path(f"/proc/{child.pid}/environ")
        assert os.stat(environ).st_uid == 0  # non-dumpable: its /proc files are root's
        if os.geteuid() == 0:
            assert secret in environ.read_bytes().decode()
        else:
            with pytest.raises(PermissionError):
                environ.read_bytes()
    finally:
        child.communicate("", timeout=10)
