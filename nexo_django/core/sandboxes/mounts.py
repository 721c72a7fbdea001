"""What a confined command sees: the bubblewrap arguments of one call (:mod:`.confine` says why).

The system's programs read-only, a per-process copy of a short list of /etc, a private /tmp, its
own /proc, a minimal /dev, the workspace read-write with its protected names read-only, and with
``network`` the egress socket and the forwarder that relays to it.
"""

from __future__ import annotations

import atexit
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
    SANDBOX_HOME,
    SANDBOX_UID,
    SYSTEM_DIRS,
    ShellPolicy,
    ShellUnavailable,
)
from .guard import Survey

_ETC_FILE_MAX = 1024 * 1024
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass
class Mounts:
    """bubblewrap arguments for one call, the descriptors they name, and what to undo after."""

    args: list[str] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)

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
        os.chmod(folder, 0o755)  # a root worker's bubblewrap runs as the shell's user: it must read it
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


def searchable_parents(mounts: Mounts, path: str) -> None:
    """``--dir`` for each folder above ``path`` (mode 0755 in the sandbox's own root): bubblewrap
    would otherwise copy the host's modes, and a 0700 parent (``/root``, pytest's temp folders)
    would keep the shell's user from reaching what is bound there."""
    parents = []
    parent = os.path.dirname(path)
    while parent not in ("/", ""):
        parents.append(parent)
        parent = os.path.dirname(parent)
    for folder in reversed(parents):
        mounts.args += ["--dir", folder]


def _python_mounts(mounts: Mounts, python: str | None) -> str:
    """The interpreter of the in-sandbox forwarder; binds its standard library when it is not
    visible already, with every site-packages folder of this interpreter hidden."""
    if python is not None:
        return python
    executable = os.path.realpath(sys.executable)
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    for prefix in sorted(prefixes):
        if not prefix.startswith("/usr/"):
            searchable_parents(mounts, prefix)
            mounts.bind_fd("--ro-bind-fd", os.open(prefix, _PATH_FLAGS | os.O_DIRECTORY), prefix)
    hidden = set()
    for scheme_vars in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
        for key in ("purelib", "platlib"):
            hidden.add(os.path.realpath(sysconfig.get_path(key, vars=scheme_vars)))
    for path in sorted(hidden):
        if os.path.isdir(path) and any(path.startswith(p + "/") for p in prefixes):
            mounts.args += ["--tmpfs", path, "--remount-ro", path]
    return executable


def _protected(mounts: Mounts, root: str, root_fd: int, survey: Survey) -> None:
    """Read-only binds over the root's ``.git`` first (the caller made an empty placeholder if
    there was none, so none can be created), then over each folder above a protected entry
    (bound over itself: a mount point cannot be renamed or removed), then over every protected
    entry the complete walk found. Each source is a descriptor opened without following links:
    a link swapped in after the walk is never followed out of the workspace."""
    mounts.bind_fd("--ro-bind-fd", os.open(".git", _PATH_FLAGS, dir_fd=root_fd), os.path.join(root, ".git"))
    for folder in sorted(survey.holders, key=lambda rel: (rel.count("/"), rel)):
        mounts.bind_fd("--bind-fd", os.dup(survey.holders[folder]), os.path.join(root, folder))
    for rel, fd in survey.protected:
        mounts.bind_fd("--ro-bind-fd", os.dup(fd), os.path.join(root, rel))


def build_mounts(
    policy: ShellPolicy, root: str, root_fd: int, survey: Survey, *, egress_socket: str | None,
    caps: Sequence[str] = (),
) -> tuple[Mounts, list[str]]:
    """The bubblewrap arguments (before ``--``) and the argv prefix run inside: for a root
    worker setpriv first, then ``caps`` (the argv that sets the caps), then the forwarder."""
    mounts = Mounts()
    mounts.args += [
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox",
        "--die-with-parent", "--new-session", "--clearenv",
        # The command is PID 1 itself: no bubblewrap init beside it, which held the host's /proc
        # open (/proc/1/fd/3) while dumpable with the command's uid until it had started it.
        "--as-pid-1",
    ]
    inner: list[str] = []
    if os.geteuid() == 0:
        # A root worker: bubblewrap sets the sandbox up as root (no user namespace, whose uid 0
        # would be the host's root), keeping only what the first process needs to drop to the
        # shell's host user with setpriv, before anything of the command runs.
        mounts.args += ["--cap-drop", "ALL", *(a for cap in _DROP_CAPS for a in ("--cap-add", cap))]
        inner = [setpriv_path(), f"--reuid={policy.uid}", f"--regid={policy.gid}", "--clear-groups",
                 "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs",
                 # A change of uid clears the parent-death signal bubblewrap set: set it again.
                 "--pdeathsig=SIGKILL", "--"]
    else:
        mounts.args += [
            "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            # No user namespace inside: the kernel code they open (netfilter, mounts...) is where
            # most unprivileged escapes of recent years were found (the seccomp filter denies
            # them too).
            "--disable-userns", "--cap-drop", "ALL",
        ]
    inner += caps
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
        # /tmp and /dev/shm: the command's own, capped, gone with the mount namespace. 1777 as on
        # any host (a root worker's bubblewrap makes them as root; the command is another uid), and
        # only the command's uid exists inside. HOME is made by the command's own user (below).
        "--perms", "1777", "--size", str(policy.tmp_size), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
        "--perms", "1777", "--size", str(policy.tmp_size), "--tmpfs", "/tmp",
    ]
    if egress_socket is not None:
        python = _python_mounts(mounts, policy.python)
        # Through a descriptor: a root worker's bubblewrap runs as the shell's user, which cannot
        # reach the worker's private scratch folder by its path.
        searchable_parents(mounts, EGRESS_SOCKET)
        mounts.bind_fd("--bind-fd", os.open(egress_socket, _PATH_FLAGS), EGRESS_SOCKET)
        inner += [python, "-I", "-S", "-c", FORWARDER, EGRESS_SOCKET, str(EGRESS_PORT)]
    for path in policy.read:
        if not os.path.exists(path):
            raise ShellUnavailable(f"shell: refused to run: NEXO['SHELL']['READ'] names {path!r}, which does not exist")
        mounts.args += ["--ro-bind", path, path]
    try:
        # Its folders made searchable (bubblewrap would copy the host's modes: a 0700 parent would
        # keep the shell's user out), then the workspace through the descriptor the sandbox holds.
        searchable_parents(mounts, root)
        mounts.bind_fd("--bind-fd", os.dup(root_fd), root)
        _protected(mounts, root, root_fd, survey)
    except BaseException:
        mounts.close()
        raise
    mounts.args += ["--remount-ro", "/", "--chdir", root]
    # HOME made by the command's user, after the caps: owned by it and 0700, whichever uid that is.
    inner += ["/bin/sh", "-c", HOME_PRELUDE, "sh"]
    return mounts, inner


#: Run before the command (``sh -c HOME_PRELUDE sh /bin/sh -c COMMAND``): its private HOME.
HOME_PRELUDE = 'mkdir -m 0700 "$HOME" && exec "$@"'


#: What a root worker's sandbox keeps until setpriv drops to the shell's user (and them).
_DROP_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_DAC_READ_SEARCH")  # the last: --chdir into a 0700 workspace
SETPRIV_FIX = "a root worker's confined shell drops to its user with util-linux's setpriv (apt-get install util-linux)"


def setpriv_path() -> str:
    found = next((p for p in ("/usr/bin/setpriv", "/bin/setpriv") if os.access(p, os.X_OK)), None)
    if found is None:
        raise ShellUnavailable(f"shell: refused to run: {SETPRIV_FIX}")
    return found


def sandbox_env(network: bool) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": SANDBOX_HOME, "LANG": "C.UTF-8", "TMPDIR": "/tmp",
           "PYTHONNOUSERSITE": "1"}
    if network:
        proxy = f"http://127.0.0.1:{EGRESS_PORT}"
        for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
            env[key] = proxy
    return env


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
