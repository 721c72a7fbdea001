"""What a confined command sees: the bubblewrap arguments of one call (:mod:`.confine` says why).

The system's programs read-only, a per-process copy of a short list of /etc, a private /tmp, its
own /proc, a minimal /dev, the workspace read-write with its protected names read-only, and with
``network`` the egress socket and the forwarder that relays to it.
"""

from __future__ import annotations

import atexit
import fnmatch
import os
import shutil
import stat
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from .confine import (
    EGRESS_PORT,
    EGRESS_SOCKET,
    ETC_FILES,
    PROTECTED_WALK_DEPTH,
    PROTECTED_WALK_ENTRIES,
    SANDBOX_HOME,
    SANDBOX_UID,
    SYSTEM_DIRS,
    ShellPolicy,
    ShellUnavailable,
)

_ETC_FILE_MAX = 1024 * 1024
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass
class Mounts:
    """bubblewrap arguments for one call, the descriptors they name, and what to undo after."""

    args: list[str] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    placeholders: list[str] = field(default_factory=list)  # names created at the root, removed after

    def bind_fd(self, option: str, fd: int, dest: str) -> None:
        self.fds.append(fd)
        self.args += [option, str(fd), dest]

    def close(self) -> None:
        for fd in self.fds:
            with suppress(OSError):
                os.close(fd)
        self.fds.clear()


def _system(mounts: Mounts) -> None:
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            mounts.args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            mounts.args += ["--ro-bind", path, path]


def _write(path: str, data: bytes) -> None:
    # os.open, not open(): no codec is looked up (a worker may no longer be able to import one).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _copy(source: str, dest: str) -> None:
    fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        data = os.read(fd, _ETC_FILE_MAX + 1)
    finally:
        os.close(fd)
    if len(data) <= _ETC_FILE_MAX:
        _write(dest, data)


def _etc_names() -> list[str]:
    return [*ETC_FILES, *sorted(n for n in os.listdir("/etc") if n.startswith("python3"))]


def _build_etc(etc: str) -> list[str]:
    """Fill ``etc`` with copies of the listed files (and the same symbolic links); return the
    listed folders, which are bound read-only into it. One mount per folder instead of one per
    file: each bubblewrap mount costs about a millisecond."""
    os.mkdir(etc, 0o755)
    # Only the sandbox's own user (and root, which programs expect to resolve) are listed.
    passwd = f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:{SANDBOX_HOME}:/bin/sh\n"
    _write(os.path.join(etc, "passwd"), passwd.encode())
    _write(os.path.join(etc, "group"), f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\n".encode())
    _write(os.path.join(etc, "hosts"), b"127.0.0.1 localhost\n::1 localhost\n")
    folders: list[str] = []
    for name in _etc_names():
        source, dest = f"/etc/{name}", os.path.join(etc, name)
        try:
            st = os.lstat(source)
        except OSError:
            continue
        os.makedirs(os.path.dirname(dest), 0o755, exist_ok=True)
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(source), dest)  # resolved inside, against what the sandbox sees
        elif stat.S_ISDIR(st.st_mode):
            os.mkdir(dest, 0o755)
            folders.append(name)
        elif stat.S_ISREG(st.st_mode):
            with suppress(OSError):
                _copy(source, dest)
    return folders


def _fingerprint() -> tuple[tuple[Any, ...], ...]:
    found: list[tuple[Any, ...]] = []
    for name in _etc_names():
        try:
            st = os.lstat(f"/etc/{name}")
        except OSError:
            found.append((name,))
            continue
        found.append((name, st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(found)


@dataclass(frozen=True)
class _Base:
    fingerprint: tuple[tuple[Any, ...], ...]
    folder: str  # holds etc/ and empty/
    etc_folders: tuple[str, ...]
    pid: int


_BASE: list[_Base] = []
_BASE_LOCK = threading.Lock()


def _remove_base(base: _Base) -> None:
    if base.pid == os.getpid():  # never the parent's, from a forked child
        shutil.rmtree(base.folder, ignore_errors=True)


def _remove_bases() -> None:
    for base in _BASE:
        _remove_base(base)


def sandbox_base() -> _Base:
    """This process's read-only parts of every sandbox: the /etc copy and an empty folder.
    Made once and rebuilt when a listed /etc entry changes. Not per call: removing a folder
    that was bind-mounted into a sandbox waits for the kernel to detach it (tens of ms)."""
    fingerprint = _fingerprint()
    with _BASE_LOCK:
        current = _BASE[0] if _BASE else None
        if current is not None and current.fingerprint == fingerprint and os.path.isdir(current.folder):
            return current
        folder = tempfile.mkdtemp(prefix="nexo-bwrap-base-")
        folders = _build_etc(os.path.join(folder, "etc"))
        os.mkdir(os.path.join(folder, "empty"), 0o555)
        base = _Base(fingerprint, folder, tuple(folders), os.getpid())
        _BASE[:] = [base]
        if current is None:
            atexit.register(_remove_bases)
        else:
            _remove_base(current)
        return base


def _etc(mounts: Mounts, base: _Base) -> None:
    mounts.args += ["--ro-bind", os.path.join(base.folder, "etc"), "/etc"]
    for name in base.etc_folders:
        mounts.args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]


def _python_mounts(mounts: Mounts, python: str | None) -> str:
    """The interpreter of the in-sandbox forwarder; binds its standard library when it is not
    visible already, with every site-packages folder of this interpreter hidden."""
    if python is not None:
        return python
    executable = os.path.realpath(sys.executable)
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    for prefix in sorted(prefixes):
        if not prefix.startswith("/usr/"):
            mounts.args += ["--ro-bind", prefix, prefix]
    hidden = set()
    for scheme_vars in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
        for key in ("purelib", "platlib"):
            hidden.add(os.path.realpath(sysconfig.get_path(key, vars=scheme_vars)))
    for path in sorted(hidden):
        if os.path.isdir(path) and any(path.startswith(p + "/") for p in prefixes):
            mounts.args += ["--tmpfs", path, "--remount-ro", path]
    return executable


def _matches(rel: str, patterns: Sequence[str]) -> bool:
    base = rel.rsplit("/", 1)[-1]
    return base.casefold() == ".git" or any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(base, p) for p in patterns)


def _protected(mounts: Mounts, root: str, root_fd: int, patterns: Sequence[str], empty_fd: int) -> None:
    """Read-only binds over the root's ``.git`` (an empty read-only folder if there is none, so
    none can be created) and over every existing protected name a bounded walk finds. Each
    source is bound through an ``O_PATH | O_NOFOLLOW`` descriptor: a link swapped in after the
    walk is never followed out of the workspace."""
    try:
        st = os.stat(".git", dir_fd=root_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is None:
        mounts.bind_fd("--ro-bind-fd", os.dup(empty_fd), os.path.join(root, ".git"))
        mounts.placeholders.append(".git")
    elif stat.S_ISLNK(st.st_mode):
        raise ShellUnavailable(
            f"shell: refused to run: {root}/.git is a symbolic link, which the sandbox would follow; "
            "replace it with the folder (or the 'gitdir:' file) it stands for"
        )
    budget = [PROTECTED_WALK_ENTRIES]

    def walk(fd: int, rel: str, depth: int) -> None:
        with os.scandir(fd) as entries:
            listed = sorted(entries, key=lambda e: e.name)
        for entry in listed:
            budget[0] -= 1
            if budget[0] < 0:
                return
            child = f"{rel}{entry.name}"
            if entry.is_symlink():
                continue
            if _matches(child, patterns) and (entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False)):
                with suppress(OSError):
                    mounts.bind_fd("--ro-bind-fd", os.open(entry.name, _PATH_FLAGS, dir_fd=fd), os.path.join(root, child))
                continue  # nothing below a protected folder needs its own bind
            if entry.is_dir(follow_symlinks=False) and depth < PROTECTED_WALK_DEPTH:
                try:
                    sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError:
                    continue
                try:
                    walk(sub, child + "/", depth + 1)
                finally:
                    os.close(sub)

    walk(root_fd, "", 0)


def build_mounts(
    policy: ShellPolicy, root: str, root_fd: int, protected: Sequence[str], *, egress_socket: str | None
) -> tuple[Mounts, list[str]]:
    """The bubblewrap arguments (before ``--``) and the argv prefix run inside."""
    mounts = Mounts()
    mounts.args += [
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
        # No user namespace inside: the kernel code they open (netfilter, mounts...) is where
        # most unprivileged escapes of recent years were found.
        "--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
    ]
    for key, value in sandbox_env(bool(egress_socket)).items():
        mounts.args += ["--setenv", key, value]
    _system(mounts)
    base = sandbox_base()
    _etc(mounts, base)
    mounts.args += [
        # /proc read-only: bubblewrap leaves /proc/sys writable, and for a root worker the sandbox
        # is uid 0 outside, which sysctl permission checks (owner bits, no capability) let write
        # the host's kernel.core_pattern or kernel.modprobe: a way out.
        "--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev",
        "--size", str(policy.tmp_size), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
        "--size", str(policy.tmp_size), "--tmpfs", "/tmp", "--perms", "0700", "--dir", SANDBOX_HOME,
    ]
    inner: list[str] = []
    if egress_socket is not None:
        python = _python_mounts(mounts, policy.python)
        mounts.args += ["--bind", egress_socket, EGRESS_SOCKET]
        inner = [python, "-I", "-S", "-c", FORWARDER, EGRESS_SOCKET, str(EGRESS_PORT)]
    for path in policy.read:
        if not os.path.exists(path):
            raise ShellUnavailable(f"shell: refused to run: NEXO['SHELL']['READ'] names {path!r}, which does not exist")
        mounts.args += ["--ro-bind", path, path]
    mounts.args += ["--bind", root, root]
    empty_fd = os.open(os.path.join(base.folder, "empty"), _PATH_FLAGS)
    try:
        _protected(mounts, root, root_fd, protected, empty_fd)
    except BaseException:
        mounts.close()
        raise
    finally:
        os.close(empty_fd)
    mounts.args += ["--remount-ro", "/", "--chdir", root]
    return mounts, inner


def sandbox_env(network: bool) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": SANDBOX_HOME, "LANG": "C.UTF-8", "TMPDIR": "/tmp",
           "PYTHONNOUSERSITE": "1"}
    if network:
        proxy = f"http://127.0.0.1:{EGRESS_PORT}"
        for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
            env[key] = proxy
    return env


def remove_placeholders(root_fd: int, names: Sequence[str]) -> None:
    """rmdir (never rm -r) what bubblewrap created as mount points: still empty, since they were
    read-only for the whole call."""
    for name in names:
        with suppress(OSError):
            os.rmdir(name, dir_fd=root_fd)



#: The in-sandbox forwarder (run with ``python -I -S -c``): listens on 127.0.0.1:PORT in the
#: sandbox's empty network namespace, relays each connection to the egress proxy's Unix socket
#: bound in, then the first process becomes the command (``exec``). Plain relay, no parsing: the
#: proxy outside decides everything.
FORWARDER = r"""
import os, selectors, socket, sys
sock_path, port, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
server.bind(("127.0.0.1", port))
server.listen(64)
if os.fork() == 0:
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ, None)
    peers = {}
    def drop(a):
        b = peers.pop(a, None)
        for s in (a, b):
            if s is not None:
                peers.pop(s, None)
                try: sel.unregister(s)
                except Exception: pass
                s.close()
    while True:
        for key, _ in sel.select():
            if key.fileobj is server:
                client, _ = server.accept()
                if len(peers) >= 128:
                    client.close(); continue
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    upstream.connect(sock_path)
                except OSError:
                    client.close(); upstream.close(); continue
                peers[client], peers[upstream] = upstream, client
                sel.register(client, selectors.EVENT_READ, None)
                sel.register(upstream, selectors.EVENT_READ, None)
                continue
            src = key.fileobj
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                drop(src); continue
            try:
                peers[src].sendall(data)
            except (OSError, KeyError):
                drop(src)
server.close()
os.execvp(argv[0], argv)
"""


def clear_set_id_bits(root_fd: int, max_entries: int = PROTECTED_WALK_ENTRIES) -> int:
    """After the call (nothing of it runs any more): drop setuid and setgid from the regular
    files it left in the workspace, walking at most ``max_entries`` entries without following
    links. Inside, every mount is ``nosuid``; outside the workspace's file system is not, and a
    root worker's command would leave setuid-root programs there. Returns how many it changed."""
    changed = 0
    budget = max_entries
    stack = [os.dup(root_fd)]
    try:
        while stack and budget > 0:
            fd = stack.pop()
            try:
                with os.scandir(fd) as entries:
                    listed = list(entries)
                for entry in listed:
                    budget -= 1
                    if budget < 0:
                        break
                    if entry.is_symlink():
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        with suppress(OSError):
                            stack.append(os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd))
                        continue
                    mode = entry.stat(follow_symlinks=False).st_mode
                    if stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
                        changed += _drop_set_id(fd, entry.name)
            except OSError:
                pass
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)
    return changed


def _drop_set_id(dir_fd: int, name: str) -> int:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return 0
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return 0
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
        return 1
    finally:
        os.close(fd)
