"""Running one ``shell`` command under bubblewrap (what it sees: :mod:`.confine`, :mod:`.mounts`;
the workspace around it: :mod:`.guard`; the seccomp filter: :mod:`.seccomp`).

The order matters: the workspace lock is taken and the root's ``.git`` bound first, then the
complete survey (or a refusal, and nothing runs); bubblewrap builds the namespaces and mounts,
loads the seccomp filter and starts the command as PID 1 (``--as-pid-1``) — for a root worker
through ``setpriv``, which drops to the shell's unprivileged host user — and the caps are set by
``prlimit`` before the command itself starts. Its exit code is taken from the status pipe, which
bubblewrap writes only when the command was really executed: anything else is a setup failure,
reported as an error that names bubblewrap, and nothing ran. After it, the survey runs again
(set-id bits, a bare repository at the root, the quota) and what it finds fails the call (over the
quota, the result says so in ``"over_quota"``, and the shell tool fails the run).
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

from . import gitlinks
from .confine import (
    TMPFS_FIX,
    UNKNOWN_OPTION,
    USERNS_FIX,
    Egress,
    ShellPolicy,
    ShellUnavailable,
    find_bwrap,
)
from .guard import (
    Quota,
    Survey,
    WorkspaceLock,
    WorkspaceRefused,
    check_after,
    neutralise_bare_root,
    survey,
)
from .mounts import build_mounts
from .quotawatch import QuotaWatch, file_cap
from .seccomp import SeccompUnavailable, filter_program, program_fd
from .shell import _remove, _run

_START_TIMEOUT = 10.0


def limits_of(policy: ShellPolicy, file_size: int | None = None) -> list[tuple[int, int]]:
    return [
        (resource.RLIMIT_AS, policy.memory),
        (resource.RLIMIT_NPROC, policy.processes),
        (resource.RLIMIT_FSIZE, policy.file_size if file_size is None else file_size),
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


_PRLIMIT_OPTIONS = {
    resource.RLIMIT_AS: "--as", resource.RLIMIT_NPROC: "--nproc", resource.RLIMIT_FSIZE: "--fsize",
    resource.RLIMIT_CPU: "--cpu", resource.RLIMIT_CORE: "--core",
}
PRLIMIT_FIX = "the confined shell sets its caps with util-linux's prlimit (apt-get install util-linux)"


def limits_argv(policy: ShellPolicy, file_size: int | None = None) -> list[str]:
    """The sandbox's first process: util-linux's ``prlimit``, which lowers its own caps and then
    starts the command (everything it starts inherits them), so nothing of the command runs
    uncapped. Inside, not from the worker: a root worker's sandbox runs as another user, whose
    limits the worker may not change without ``CAP_SYS_RESOURCE``. Never raises a hard limit:
    where the worker's own is lower, that one stays. ``file_size``: this call's per-file cap
    (what the workspace quota has left), instead of the policy's."""
    prlimit = next((p for p in ("/usr/bin/prlimit", "/bin/prlimit") if os.access(p, os.X_OK)), None)
    if prlimit is None:
        raise ShellUnavailable(f"shell: refused to run: {PRLIMIT_FIX}")
    argv = [prlimit]
    for which, value in limits_of(policy, file_size):
        _soft, hard = resource.getrlimit(which)
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        # CPU: SIGXCPU at the cap (a program may catch it and stop cleanly), SIGKILL a second later.
        top = cap + 1 if which == resource.RLIMIT_CPU and (hard == resource.RLIM_INFINITY or cap < hard) else cap
        argv.append(f"{_PRLIMIT_OPTIONS[which]}={cap}:{top}")
    return [*argv, "--"]


def setup_failure(stderr: str) -> str:
    detail = stderr.strip().splitlines()[-1] if stderr.strip() else "no message"
    hint = USERNS_FIX if any(w in stderr for w in ("namespace", "uid map", "Operation not permitted", "setting up uid")) else (
        TMPFS_FIX if UNKNOWN_OPTION in stderr else
        "check NEXO['SHELL'] (BWRAP, READ) and that the workspace is a plain folder the worker can write"
    )
    return f"shell: bubblewrap could not set up the sandbox, nothing ran ({detail}); {hint}"


def _refused(reason: str) -> dict[str, Any]:
    return {"error": f"shell: refused to run, nothing ran: {reason}"}


def _prepare(root: str, root_fd: int, protected: Sequence[str], policy: ShellPolicy, lock: WorkspaceLock) -> Survey:
    """Before the command: the root's ``.git`` (a placeholder if missing), a root that became a
    bare repository, then the complete survey. Raises :class:`WorkspaceRefused`."""
    lock.placeholder()
    st = os.stat(".git", dir_fd=root_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        raise WorkspaceRefused(
            f"{root}/.git is a symbolic link, which the sandbox would follow; replace it with the folder "
            "(or the 'gitdir:' file) it stands for"
        )
    neutralised = neutralise_bare_root(root_fd)
    if neutralised is not None:
        raise WorkspaceRefused(f"{neutralised}; look at what left it there, then call again")
    owner = (policy.uid, policy.gid) if os.geteuid() == 0 else None
    quota = Quota(policy.workspace_bytes, policy.workspace_entries)
    return survey(root, root_fd, protected, quota, bind=True, owner=owner)


def _after(result: dict[str, Any], root: str, root_fd: int, protected: Sequence[str], policy: ShellPolicy,
           unchecked: Sequence[str] = ()) -> dict[str, Any]:
    """After the command (nothing of it runs any more): a bare repository at the root is
    neutralised, set-id bits dropped, the quota checked; what was found fails the call, with the
    command's output kept."""
    problems: list[str] = []
    with suppress(OSError):
        neutralised = neutralise_bare_root(root_fd)
        if neutralised is not None:
            problems.append(neutralised)
    with suppress(OSError):
        problems += gitlinks.neutralise_new(root_fd, unchecked)
    found, over_quota = check_after(root, root_fd, protected, Quota(policy.workspace_bytes, policy.workspace_entries))
    problems += found
    if not problems:
        return result
    message = "shell: the command left the workspace unsafe or over its limits: " + "; ".join(problems)
    if "error" in result:
        message = f"{result['error']}; also, {message[len('shell: '):]}"
    failed = {**result, "error": message + " (the next call refuses to run until this is fixed)"}
    # Over the quota, the shell tool fails the run (WorkspaceOverQuota), not only the call.
    return {**failed, "over_quota": over_quota} if over_quota else failed


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
        program = filter_program()
    except (ShellUnavailable, SeccompUnavailable) as exc:
        message = str(exc)
        return {"error": message if message.startswith("shell:") else f"shell: refused to run: {message}"}
    try:
        lock = WorkspaceLock(root_fd)
    except OSError as exc:
        return _refused(f"the workspace lock could not be taken ({exc})")
    try:
        try:
            # Submodules the root registers without a .git: one made during the call is renamed aside.
            unchecked = gitlinks.absent(root_fd, gitlinks.registered(root_fd))
            found = _prepare(root, root_fd, protected, policy, lock)
        except WorkspaceRefused as exc:
            return _refused(str(exc))
        except OSError as exc:
            return _refused(f"the workspace could not be prepared ({exc})")
        try:
            result = _sandboxed(command, root, root_fd, found, policy, timeout, max_output, bwrap, program)
        finally:
            found.close()
        if "exit_code" not in result and "stdout" not in result:
            return result  # nothing ran
        return _after(result, root, root_fd, protected, policy, unchecked)
    finally:
        lock.release()


def _sandboxed(
    command: str,
    root: str,
    root_fd: int,
    found: Survey,
    policy: ShellPolicy,
    timeout: float,
    max_output: int,
    bwrap: str,
    program: bytes,
) -> dict[str, Any]:
    scratch = tempfile.mkdtemp(prefix="nexo-egress-") if policy.network else None
    status = StatusPipe()
    block_read, block_write = os.pipe()
    seccomp_fd = program_fd(program)
    open_fds = [block_read, block_write, seccomp_fd]
    proxy: Egress | None = None
    mounts = None
    first: list[int] = []  # a pidfd of the sandbox's first process
    quota = Quota(policy.workspace_bytes, policy.workspace_entries)
    watch: QuotaWatch | None = None

    def kill() -> None:
        for pidfd in first:
            with suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)

    try:
        if scratch is not None:
            if policy.egress is None:
                return {"error": (
                    "shell: refused to run: NETWORK names hosts but this sandbox has no egress proxy; build its "
                    "policy with ShellPolicy(..., egress=EgressProxy) (nexo_django.core.tools.egress)"
                )}
            proxy = policy.egress(policy, os.path.join(scratch, "egress.sock"), deadline=time.monotonic() + timeout)
            proxy.start()
            if os.geteuid() == 0:
                os.chmod(proxy.path, 0o666)  # the command's user connects to it (the folder stays 0700)
        try:
            caps = limits_argv(policy, file_cap(policy.file_size, quota, found))
            mounts, inner = build_mounts(policy, root, root_fd, found, egress_socket=proxy.path if proxy else None, caps=caps)
        except ShellUnavailable as exc:
            return {"error": str(exc)}
        argv = [
            bwrap, "--json-status-fd", str(status.write_fd), "--block-fd", str(block_read),
            "--seccomp", str(seccomp_fd), *mounts.args, "--", *inner, "/bin/sh", "-c", command,
        ]

        def started(proc: subprocess.Popen[bytes], deadline: float) -> str | None:
            # Our copies of the ends bubblewrap owns: EOF on the status pipe must mean it is gone.
            status.close_write_end()
            open_fds.remove(block_read)
            os.close(block_read)
            pid = status.wait_for_start(min(deadline, time.monotonic() + _START_TIMEOUT))
            if pid is not None:
                with suppress(OSError):  # killed at the end, whatever: its PID namespace dies with it
                    first.append(os.pidfd_open(pid))
            if pid is None:
                proc.wait(timeout=_START_TIMEOUT)
                assert proc.stderr is not None
                return setup_failure(proc.stderr.read(64 * 1024).decode("utf-8", "replace"))
            nonlocal watch
            watch = QuotaWatch(root, root_fd, quota, found, kill)  # before it runs: counters from before
            watch.start()
            os.write(block_write, b"1")
            return None

        result = _run(argv, "/", {}, timeout, max_output, pass_fds=(status.write_fd, block_read, seccomp_fd, *mounts.fds),
                      started=started)
        if watch is not None:
            watch.stop()
            if watch.over is not None:
                # Killed by the watch: the workspace's check after the call reports the quota.
                note = f"the command was stopped during the call: {watch.over}"
                return {**result, "note": f"{result['note']}; {note}" if "note" in result else note}
        if "error" in result and "exit_code" not in result:
            if result["error"].startswith("shell: bubblewrap") and "stderr" in result:
                result.pop("stderr")  # it is in the message already
            return result
        if status.exit_code() is None and "note" not in result:  # a note: we stopped it ourselves
            return {"error": setup_failure(result.get("stderr", ""))}
        return result
    finally:
        kill()
        if watch is not None:
            watch.stop()
        for pidfd in first:
            os.close(pidfd)
        if mounts is not None:
            mounts.close()
        for fd in open_fds:
            os.close(fd)
        status.close()
        if proxy is not None:
            proxy.close()
        if scratch is not None:
            _remove(scratch)


__all__ = ["run_confined"]
