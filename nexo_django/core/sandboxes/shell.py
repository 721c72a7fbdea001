"""Running one ``shell`` command for the local sandbox. It limits; it does not confine.

What a command gets (docs/sandboxes.md): ``/bin/sh -c`` in the workspace, an environment built
from nothing (PATH, a private empty HOME and TMPDIR made for this command and removed after it,
LANG, PYTHONNOUSERSITE), no stdin, no inherited descriptors, its own session and process group
(killed as a whole at the timeout and when the command ends), output capped in bytes. Before
each command, the process that runs it is made non-dumpable, so the command cannot read the
worker's environment through ``/proc/$PPID/environ`` (unless it runs as root).
"""

from __future__ import annotations

import ctypes
import functools
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

SHELL_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Past this many bytes of output (beyond the cap) a command is stopped rather than drained.
SHELL_DRAIN_FACTOR = 16
_CHUNK = 64 * 1024
_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def make_undumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)`` on this process (Linux): its ``/proc/<pid>/environ``,
    ``mem`` and ``maps`` become root's, and processes of the same user can no longer read them
    or attach a debugger. ``execve`` resets the flag in the command itself, not here. Returns
    False where there is no such call (no ``/proc`` to protect either); raises ``OSError`` if
    Linux refuses."""
    if not sys.platform.startswith("linux"):
        return False
    if _libc().prctl(_PR_SET_DUMPABLE, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)):
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_DUMPABLE, 0) failed: {os.strerror(errno)}")
    return True


def is_dumpable() -> bool | None:
    """This process's dumpable flag, or None where it cannot be asked."""
    if not sys.platform.startswith("linux"):
        return None
    return bool(_libc().prctl(_PR_GET_DUMPABLE, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)))


def shell_env(home: str, tmpdir: str) -> dict[str, str]:
    # Built from nothing: the worker's environment (secrets, LD_PRELOAD, BASH_ENV) never leaks in.
    # HOME is private and empty: no rc file, history or tool configuration of anyone else's is
    # read, and nothing the command leaves there outlives it. No user site-packages for Python.
    return {"PATH": SHELL_PATH, "HOME": home, "LANG": "C.UTF-8", "TMPDIR": tmpdir, "PYTHONNOUSERSITE": "1"}


def run_shell(command: str, cwd: str, timeout: float, max_output: int) -> dict[str, Any]:
    """Run ``/bin/sh -c command`` in ``cwd`` with a fresh HOME and TMPDIR, both removed after."""
    try:
        make_undumpable()
    except OSError as exc:
        return {"error": f"shell: refused to run: {exc}"}
    scratch = tempfile.mkdtemp(prefix="nexo-shell-")  # 0700, ours alone
    try:
        home, tmpdir = os.path.join(scratch, "home"), os.path.join(scratch, "tmp")
        os.mkdir(home, 0o700)
        os.mkdir(tmpdir, 0o700)
        return _run(["/bin/sh", "-c", command], cwd, shell_env(home, tmpdir), timeout, max_output)
    finally:
        _remove(scratch)


def _remove(path: str) -> None:
    """Remove a tree the command may have made unreadable (``chmod 000`` on a folder)."""

    def retry(function: Any, name: str, exc: BaseException) -> None:
        with suppress(OSError):
            parent = os.path.dirname(name)
            if os.path.islink(parent) or os.path.islink(name):
                return  # chmod follows links: never change anything outside the scratch folder
            os.chmod(parent, stat.S_IRWXU)
            if os.path.isdir(name):
                os.chmod(name, stat.S_IRWXU)
                shutil.rmtree(name, ignore_errors=True)
            else:
                os.unlink(name)

    shutil.rmtree(path, onexc=retry)


def _killpg(pgid: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _exited(pid: int) -> bool:
    """Whether the child exited, without reaping it: while it is a zombie its pid (the process
    group id) cannot be reused, so killing the group after this is safe."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None
    except ChildProcessError:
        return True


#: Called once the process exists, before any output is read: returns an error to stop it.
Started = Callable[[subprocess.Popen[bytes], float], "str | None"]


def _run(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    timeout: float,
    max_output: int,
    *,
    pass_fds: tuple[int, ...] = (),
    started: Started | None = None,
    popen: dict[str, Any] | None = None,
) -> dict[str, Any]:
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own session and process group, killed as a whole
        close_fds=True,
        pass_fds=pass_fds,
        **(popen or {}),
    )
    assert proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + timeout
    refused = started(proc, deadline) if started is not None else None
    if refused is not None:
        _killpg(proc.pid)
        proc.wait()
        stderr = proc.stderr.read(max_output).decode("utf-8", "replace")
        proc.stdout.close()
        proc.stderr.close()
        return {"error": refused, "stderr": stderr}
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    kept: dict[int, bytearray] = {out_fd: bytearray(), err_fd: bytearray()}
    drained = 0
    truncated = timed_out = flooded = False
    selector = selectors.DefaultSelector()
    try:
        for fd in (out_fd, err_fd):
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, _CHUNK)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                buffer = kept[key.fd]
                room = max_output - len(buffer)
                if len(chunk) > room:
                    truncated = True
                    drained += len(chunk) - max(room, 0)
                buffer += chunk[: max(room, 0)]
            if drained > SHELL_DRAIN_FACTOR * max_output + _CHUNK:
                flooded = True
                break
        while not timed_out and not flooded and not _exited(proc.pid):
            if time.monotonic() >= deadline:
                timed_out = True
                break
            time.sleep(0.005)
        # Whatever the command left behind in its group (background jobs) dies with it.
        _killpg(proc.pid)
        code = proc.wait()
    finally:
        selector.close()
        proc.stdout.close()
        proc.stderr.close()
        if proc.returncode is None:
            _killpg(proc.pid)
            proc.wait()
    stdout, stderr = (bytes(kept[fd]).decode("utf-8", "replace") for fd in (out_fd, err_fd))
    if timed_out:
        return {
            "error": f"shell: command timed out after {timeout:g} s",
            "stdout": stdout,
            "stderr": stderr,
            "truncated": truncated,
        }
    result: dict[str, Any] = {"exit_code": code, "stdout": stdout, "stderr": stderr, "truncated": truncated}
    if flooded:
        result["note"] = f"the command was stopped: it wrote far more than the {max_output}-byte cap"
    return result
