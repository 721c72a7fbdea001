"""Running one ``shell`` command under bubblewrap (what it sees: :mod:`.confine`).

The order matters: bubblewrap builds the namespaces and mounts, reports the sandbox's first
process on ``--json-status-fd`` and waits on ``--block-fd``; the caps are then set on that
process with ``prlimit`` and only then is it released to start the command, so nothing of the
command ever runs uncapped. Its exit code is taken from the status pipe, which bubblewrap writes
only when the command was really executed: anything else is a setup failure, reported as an
error that names bubblewrap, and nothing ran.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from .confine import (
    Egress,
    ShellPolicy,
    ShellUnavailable,
    StatusPipe,
    apply_limits,
    build_mounts,
    find_bwrap,
    remove_placeholders,
    sandbox_env,
    setup_failure,
)
from .shell import _remove, _run

_START_TIMEOUT = 10.0


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
        for fd in open_fds:
            os.close(fd)
        status.close()
        if proxy is not None:
            proxy.close()
        if scratch is not None:
            _remove(scratch)


__all__ = ["run_confined", "sandbox_env"]
