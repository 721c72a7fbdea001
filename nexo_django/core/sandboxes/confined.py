"""Running one ``shell`` command under bubblewrap (what it sees: :mod:`.confine`).

The order matters: bubblewrap builds the namespaces and mounts, reports the sandbox's first
process on ``--json-status-fd`` and waits on ``--block-fd``; the caps are then set on that
process with ``prlimit`` and only then is it released to start the command, so nothing of the
command ever runs uncapped. Its exit code is taken from the status pipe, which bubblewrap writes
only when the command was really executed: anything else is a setup failure, reported as an
error that names bubblewrap, and nothing ran.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import subprocess
import tempfile
import time
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

from .confine import USERNS_FIX, Egress, ShellPolicy, ShellUnavailable, find_bwrap
from .mounts import build_mounts, clear_set_id_bits, remove_placeholders
from .shell import _remove, _run

_START_TIMEOUT = 10.0


def limits_of(policy: ShellPolicy) -> list[tuple[int, int]]:
    return [
        (resource.RLIMIT_AS, policy.memory),
        (resource.RLIMIT_NPROC, policy.processes),
        (resource.RLIMIT_FSIZE, policy.file_size),
        (resource.RLIMIT_CPU, policy.cpu_seconds),
        (resource.RLIMIT_CORE, 0),
    ]


class StatusPipe:
    """bubblewrap's ``--json-status-fd``: the sandbox's pid once it exists, and the command's
    exit code only if the command was really executed (not when setup failed)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.buffer = b""

    def wait_for_start(self, deadline: float) -> int | None:
        """The sandbox's first process (held on --block-fd), or None if bubblewrap gave up."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.read_fd, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None
                chunk = os.read(self.read_fd, 4096)
                if not chunk:
                    return None
                self.buffer += chunk
        first = json.loads(self.buffer.split(b"\n", 1)[0])
        pid = first.get("child-pid")
        return pid if isinstance(pid, int) else None

    def exit_code(self) -> int | None:
        """After bubblewrap exited: the command's exit code, or None if it never ran."""
        os.set_blocking(self.read_fd, False)
        with suppress(BlockingIOError, OSError):
            while chunk := os.read(self.read_fd, 4096):
                self.buffer += chunk
        for line in self.buffer.split(b"\n"):
            with suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict) and isinstance(doc.get("exit-code"), int):
                    return int(doc["exit-code"])
        return None

    def close_write_end(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def close(self) -> None:
        self.close_write_end()
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1


def apply_limits(pid: int, policy: ShellPolicy) -> None:
    """Lower the caps of the sandbox's first process (everything it starts inherits them). Never
    raises a hard limit: where the worker's own is lower, that one stays."""
    for which, value in limits_of(policy):
        _soft, hard = resource.prlimit(pid, which)
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        # CPU: SIGXCPU at the cap (a program may catch it and stop cleanly), SIGKILL a second later.
        top = cap + 1 if which == resource.RLIMIT_CPU and (hard == resource.RLIM_INFINITY or cap < hard) else cap
        resource.prlimit(pid, which, (cap, top))


def setup_failure(stderr: str) -> str:
    detail = stderr.strip().splitlines()[-1] if stderr.strip() else "no message"
    hint = USERNS_FIX if any(w in stderr for w in ("namespace", "uid map", "Operation not permitted", "setting up uid")) else (
        "check NEXO['SHELL'] (BWRAP, READ) and that the workspace is a plain folder the worker can write"
    )
    return f"shell: bubblewrap could not set up the sandbox, nothing ran ({detail}); {hint}"


def run_confined(
    command: str,
    root: str,
    root_fd: int,
    protected: Sequence[str],
    policy: ShellPolicy,
    timeout: float,
    max_output: int,
) -> dict[str, Any]:
    try:
        bwrap = find_bwrap(policy)
    except ShellUnavailable as exc:
        return {"error": str(exc)}
    scratch = tempfile.mkdtemp(prefix="nexo-egress-") if policy.network else None
    status = StatusPipe()
    block_read, block_write = os.pipe()
    open_fds = [block_read, block_write]
    proxy: Egress | None = None
    mounts = None
    try:
        if scratch is not None:
            if policy.egress is None:
                return {"error": (
                    "shell: refused to run: NETWORK names hosts but this sandbox has no egress proxy; build its "
                    "policy with ShellPolicy(..., egress=EgressProxy) (nexo_django.core.tools.egress)"
                )}
            proxy = policy.egress(policy, os.path.join(scratch, "egress.sock"), deadline=time.monotonic() + timeout)
            proxy.start()
        try:
            mounts, inner = build_mounts(
                policy, root, root_fd, protected, egress_socket=proxy.path if proxy else None
            )
        except ShellUnavailable as exc:
            return {"error": str(exc)}
        argv = [
            bwrap, "--json-status-fd", str(status.write_fd), "--block-fd", str(block_read),
            *mounts.args, "--", *inner, "/bin/sh", "-c", command,
        ]

        def started(proc: subprocess.Popen[bytes], deadline: float) -> str | None:
            # Our copies of the ends bubblewrap owns: EOF on the status pipe must mean it is gone.
            status.close_write_end()
            open_fds.remove(block_read)
            os.close(block_read)
            pid = status.wait_for_start(min(deadline, time.monotonic() + _START_TIMEOUT))
            if pid is None:
                proc.wait(timeout=_START_TIMEOUT)
                assert proc.stderr is not None
                return setup_failure(proc.stderr.read(64 * 1024).decode("utf-8", "replace"))
            try:
                apply_limits(pid, policy)
            except OSError as exc:
                return f"shell: refused to run: the resource caps could not be set on the sandbox ({exc})"
            os.write(block_write, b"1")
            return None

        result = _run(argv, "/", {}, timeout, max_output, pass_fds=(status.write_fd, block_read, *mounts.fds),
                      started=started)
        if "error" in result and "exit_code" not in result:
            if result["error"].startswith("shell: bubblewrap") and "stderr" in result:
                result.pop("stderr")  # it is in the message already
            return result
        if status.exit_code() is None and "note" not in result:  # a note: we stopped it ourselves
            return {"error": setup_failure(result.get("stderr", ""))}
        return result
    finally:
        if mounts is not None:
            mounts.close()
            remove_placeholders(root_fd, mounts.placeholders)
            clear_set_id_bits(root_fd)
        for fd in open_fds:
            os.close(fd)
        status.close()
        if proxy is not None:
            proxy.close()
        if scratch is not None:
            _remove(scratch)


__all__ = ["run_confined"]
