"""Confining one ``shell`` command with bubblewrap: what the command sees, and what it may use.

Pure Python, no Django import: the Django side fills a :class:`ShellPolicy` from
``NEXO["SHELL"]`` and ``NEXO["LIMITS"]`` and hands it to ``LocalSandbox(root, shell=...)``.

The command runs in new user, PID, network, IPC, UTS and cgroup namespaces as uid/gid 65534
with no capabilities and ``no_new_privs`` (bubblewrap sets it), in its own session. Its root is
an empty read-only tmpfs holding only: the system's programs and libraries (read-only), a short
list of ``/etc`` files programs need (never ``shadow``, ``gshadow`` or ``sudoers``), a private
``/tmp`` (size-capped), its own ``/proc`` and a minimal ``/dev``, the workspace read-write at its
own path, with ``.git`` and the other protected names read-only, and the ``READ`` paths
read-only. Resource caps are set with ``prlimit`` on the sandbox's first process while
bubblewrap holds it on ``--block-fd``, before anything of the command runs (see
:func:`run_confined`). docs/sandboxes.md states what is and is not confined.
"""

from __future__ import annotations

import atexit
import fnmatch
import functools
import json
import os
import resource
import selectors
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

#: ``resolver(host, port)``: the addresses ``host`` resolves to (as in the fetch guard).
Resolver = Callable[[str, int], Sequence[str]]


class Egress(Protocol):
    """The egress proxy a policy with ``network`` hosts needs: listens on a Unix socket at
    ``path`` from ``start()`` to ``close()`` (``nexo_django.core.tools.egress.EgressProxy``)."""

    path: str

    def start(self) -> None: ...

    def close(self) -> None: ...


#: ``factory(policy, socket_path, deadline=...)`` -> an :class:`Egress`.
EgressFactory = Callable[..., Egress]

SANDBOX_UID = 65534
SANDBOX_HOME = "/tmp/home"
#: Where the egress proxy's socket appears inside, and the port of the in-sandbox forwarder.
EGRESS_SOCKET = "/run/nexo/egress.sock"
EGRESS_PORT = 3128
#: The host's top-level folders of programs and libraries, bound read-only (or re-created as
#: the same symbolic link, on a merged-/usr system).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: What of /etc a command sees: what the dynamic linker, locales, TLS and name lookups need.
#: passwd, group and hosts are written for the sandbox (they would list the host's users).
ETC_FILES = (
    "alternatives", "ca-certificates", "ca-certificates.conf", "crypto-policies", "debian_version",
    "gai.conf", "host.conf", "inputrc", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
    "lsb-release", "magic", "mime.types", "nsswitch.conf", "os-release", "pki/ca-trust/extracted",
    "pki/tls/certs", "pki/tls/openssl.cnf", "protocols", "services", "ssl/certs", "ssl/openssl.cnf",
    "terminfo", "timezone",
)  # ssl and pki by their parts: never ssl/private or pki/tls/private (TLS keys)
NEVER_READ = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/sudoers.d")
#: Bounds of the walk that finds existing protected names below the workspace root.
PROTECTED_WALK_ENTRIES = 20_000
PROTECTED_WALK_DEPTH = 12
_START_TIMEOUT = 10.0
_ETC_FILE_MAX = 1024 * 1024
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

BWRAP_FIX = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap) "
    "or set NEXO['SHELL']['BWRAP'] to its path"
)
USERNS_FIX = (
    "bubblewrap needs unprivileged user namespaces: on Ubuntu 23.10+ AppArmor restricts them "
    "(sysctl kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile that allows "
    "userns for bwrap); elsewhere check sysctl user.max_user_namespaces > 0 and, in a container, "
    "that its seccomp profile allows clone/unshare of namespaces"
)
UNCONFINED_ESCAPE = (
    "only NEXO['SHELL']['CONFINE'] = False (LocalSandbox(root, confine=False)) runs commands "
    "unconfined, as the worker's user with its files and network: see docs/sandboxes.md"
)


class ShellUnavailable(Exception):
    """Confinement cannot be set up: the shell runs nothing. The message names the fix."""


@dataclass(frozen=True)
class ShellPolicy:
    """How the local sandbox runs ``shell``. ``confine=False`` is today's unconfined shell."""

    confine: bool = True
    bwrap: str | None = None  # the bubblewrap binary; None: ``bwrap`` found on PATH
    network: tuple[str, ...] = ()  # hosts reachable through the egress proxy (fetch's syntax)
    read: tuple[str, ...] = ()  # more absolute paths visible read-only
    memory: int = 2 * 1024**3  # RLIMIT_AS, bytes of address space per process
    processes: int = 256  # RLIMIT_NPROC, processes of the sandbox's user
    file_size: int = 1024**3  # RLIMIT_FSIZE, bytes of the largest file a process writes
    cpu_seconds: int = 60  # RLIMIT_CPU, seconds of CPU per process
    tmp_size: int = 256 * 1024**2  # bytes of the private /tmp (and of /dev/shm)
    ports: tuple[int, ...] = (80, 443)  # ports the egress proxy connects to
    allow_private: bool = False  # the proxy may reach private addresses (never metadata)
    #: Interpreter of the in-sandbox forwarder (only with ``network``); None: this process's
    #: own, whose standard library is then bound read-only (its site-packages hidden).
    python: str | None = None
    #: ``resolver(host, port)`` for the proxy; None: the system's (an I/O seam for tests).
    resolve: Resolver | None = field(default=None, compare=False, repr=False)
    #: What runs the egress proxy (needed with ``network``): ``EgressProxy`` of
    #: ``nexo_django.core.tools.egress``; the agent and ``NEXO["SHELL"]`` set it.
    egress: EgressFactory | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("memory", "processes", "file_size", "cpu_seconds", "tmp_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"shell {name} must be a positive whole number, not {value!r}")
        if isinstance(self.network, str) or isinstance(self.read, str):
            raise ValueError("shell network and read must be lists, not a string")
        for path in self.read:
            if not isinstance(path, str) or not os.path.isabs(path):
                raise ValueError(f"shell read path {path!r} must be an absolute path")
            if os.path.realpath(path) in NEVER_READ or os.path.realpath(path) == "/":
                raise ValueError(f"shell read path {path!r} is never made visible")
        for host in self.network:
            # The full syntax is the fetch guard's, checked by the proxy (and by NEXO's check).
            if not isinstance(host, str) or not host.strip() or any(c in host for c in "/?#@\\ "):
                raise ValueError(f"shell network entry {host!r} must be a bare host name such as 'pypi.org'")

    def describe(self) -> str:
        """One line for people (the decision page): which confinement a command runs under."""
        if not self.confine:
            return (
                "NOT confined (NEXO['SHELL']['CONFINE'] = False): the command runs as the worker's "
                "user, with the worker's files and network (a fresh environment only)"
            )
        net = f"network only to {', '.join(self.network)} through the egress proxy" if self.network else "no network"
        extra = f"; also read-only: {', '.join(self.read)}" if self.read else ""
        return f"bubblewrap: the workspace read-write, system files read-only, {net}{extra}"

    def to_spec(self) -> dict[str, Any]:
        return {
            "confine": self.confine, "bwrap": self.bwrap, "network": list(self.network), "read": list(self.read),
            "memory": self.memory, "processes": self.processes, "file_size": self.file_size,
            "cpu_seconds": self.cpu_seconds, "tmp_size": self.tmp_size, "ports": list(self.ports),
            "allow_private": self.allow_private, "python": self.python,
        }

    @classmethod
    def from_spec(cls, spec: dict[str, Any], *, egress: EgressFactory | None = None) -> ShellPolicy:
        data: dict[str, Any] = {**spec, "egress": egress}
        for key in ("network", "read", "ports"):
            if key in data:
                data[key] = tuple(data[key])
        return cls(**data)


def find_bwrap(policy: ShellPolicy) -> str:
    """The bubblewrap binary to run, or :class:`ShellUnavailable` naming the fix."""
    given = policy.bwrap
    found = shutil.which(given or "bwrap")
    if found is None or not os.access(found, os.X_OK):
        what = f"{given!r} (NEXO['SHELL']['BWRAP'])" if given else "'bwrap' on PATH"
        raise ShellUnavailable(f"shell: refused to run: bubblewrap is needed to confine commands and {what} was not found; {BWRAP_FIX}")
    return found


@functools.cache
def _probe(bwrap: str) -> str | None:
    try:
        done = subprocess.run(
            [bwrap, "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
             "--die-with-parent", "--cap-drop", "ALL", "--ro-bind", "/", "/", "--proc", "/proc", "--", "/bin/true"],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=_START_TIMEOUT, close_fds=True, env={},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} cannot be run ({exc})"
    if done.returncode != 0:
        return f"{bwrap} cannot create its sandbox: {done.stderr.decode(errors='replace').strip() or f'exit {done.returncode}'}"
    return None


def bwrap_problem(policy: ShellPolicy) -> str | None:
    """Why confined commands cannot run here (a message naming the fix), or None. Runs ``true``
    in a minimal sandbox once per binary and process (the system check calls it)."""
    try:
        bwrap = find_bwrap(policy)
    except ShellUnavailable as exc:
        return str(exc)
    problem = _probe(bwrap)
    return None if problem is None else f"shell: refused to run: {problem}; {USERNS_FIX}"


# --- what the command sees -----------------------------------------------------------------------


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
        "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
    ]
    for key, value in sandbox_env(bool(egress_socket)).items():
        mounts.args += ["--setenv", key, value]
    _system(mounts)
    base = sandbox_base()
    _etc(mounts, base)
    mounts.args += [
        "--proc", "/proc", "--dev", "/dev",
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


# --- starting it ---------------------------------------------------------------------------------


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
        resource.prlimit(pid, which, (cap, cap))


def setup_failure(stderr: str) -> str:
    detail = stderr.strip().splitlines()[-1] if stderr.strip() else "no message"
    hint = USERNS_FIX if any(w in stderr for w in ("namespace", "uid map", "Operation not permitted", "setting up uid")) else (
        "check NEXO['SHELL'] (BWRAP, READ) and that the workspace is a plain folder the worker can write"
    )
    return f"shell: bubblewrap could not set up the sandbox, nothing ran ({detail}); {hint}"


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
