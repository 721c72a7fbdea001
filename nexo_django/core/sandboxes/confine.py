"""Confining one ``shell`` command with bubblewrap: what the command sees, and what it may use.

Pure Python, no Django import: the Django side fills a :class:`ShellPolicy` from
``NEXO["SHELL"]`` and ``NEXO["LIMITS"]`` and hands it to ``LocalSandbox(root, shell=...)``.

The command runs in new PID, network, IPC, UTS and cgroup namespaces with no capabilities,
``no_new_privs`` and a seccomp filter, in its own session, as PID 1 (no bubblewrap init beside
it): for an unprivileged worker in a user namespace as uid/gid 65534 (the worker outside); for a
root worker as the unprivileged host user ``ShellPolicy.uid``/``gid`` (setpriv drops to it). Its root is
an empty read-only tmpfs holding only: the system's programs and libraries (read-only), a short
list of ``/etc`` files programs need (never ``shadow``, ``gshadow`` or ``sudoers``), a private
``/tmp`` and ``/dev/shm`` (size-capped tmpfs, mode 1777, gone with the call), its own ``/proc`` and a minimal ``/dev``, the workspace read-write at its
own path, with ``.git`` and the other protected names read-only, and the ``READ`` paths
read-only. Resource caps are set by the sandbox's first process on itself (util-linux's
``prlimit``) before anything of the command runs. This module: the
policy and whether bubblewrap works here; :mod:`.mounts`: what the command sees;
:mod:`.confined`: running it. docs/sandboxes.md states what is and is not confined.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .seccomp import SeccompUnavailable, filter_program, program_fd, seccomp_problem

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
#: The host user a root worker's commands run as (a nobody-like id), unless NEXO["SHELL"] says.
HOST_UID = 65534
HOST_GID = 65534
_START_TIMEOUT = 10.0

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


TMPFS_FIX = (
    "the confined shell gives each command its own size-capped /tmp and /dev/shm with bubblewrap's "
    "--size and --perms (bubblewrap 0.7.0 or later; Debian 12 ships 0.8.0): upgrade bubblewrap or set "
    "NEXO['SHELL']['BWRAP'] to a newer one"
)
#: what bubblewrap says of an option it does not know (an older release than TMPFS_FIX names)
UNKNOWN_OPTION = "Unknown option"


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
    workspace_bytes: int = 4 * 1024**3  # bytes on disk the workspace may use (checked around each call)
    workspace_entries: int = 100_000  # entries the workspace may hold (files, folders, links...)
    #: The host uid and gid a root worker's command runs as (an unprivileged worker's run as it).
    uid: int = HOST_UID
    gid: int = HOST_GID
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
        for name in ("memory", "processes", "file_size", "cpu_seconds", "tmp_size", "workspace_bytes", "workspace_entries",
                     "uid", "gid"):
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
            "cpu_seconds": self.cpu_seconds, "tmp_size": self.tmp_size, "workspace_bytes": self.workspace_bytes,
            "workspace_entries": self.workspace_entries, "uid": self.uid, "gid": self.gid, "ports": list(self.ports),
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


def _probe_user(uid: int, gid: int) -> list[str]:
    if os.geteuid() == 0:  # as run_confined: no user namespace, setpriv drops to the shell's user
        return ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--cap-drop", "ALL",
                "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    return ["--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--disable-userns", "--cap-drop", "ALL"]


def _probe_drop(uid: int, gid: int) -> list[str]:
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin") or "/usr/bin/setpriv"
    return [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]


@functools.cache
def _probe(bwrap: str, uid: int, gid: int) -> str | None:
    try:
        program = filter_program()
    except SeccompUnavailable as exc:
        return str(exc)
    seccomp_fd = program_fd(program)
    try:
        done = subprocess.run(
            [bwrap, *_probe_user(uid, gid), "--as-pid-1", "--die-with-parent",
             "--ro-bind", "/", "/", "--proc", "/proc", "--perms", "1777", "--size", "65536", "--tmpfs", "/tmp", "--seccomp", str(seccomp_fd), "--", *_probe_drop(uid, gid), "/bin/true"],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=_START_TIMEOUT, close_fds=True, env={},
            pass_fds=(seccomp_fd,),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} cannot be run ({exc})"
    finally:
        os.close(seccomp_fd)
    if done.returncode != 0:
        return f"{bwrap} cannot create its sandbox: {done.stderr.decode(errors='replace').strip() or f'exit {done.returncode}'}"
    return None


def bwrap_problem(policy: ShellPolicy) -> str | None:
    """Why confined commands cannot run here (a message naming the fix), or None. Runs ``true``
    in a minimal sandbox, with the seccomp filter and as the user commands run as, once per
    binary and process (the system check calls it)."""
    try:
        bwrap = find_bwrap(policy)
    except ShellUnavailable as exc:
        return str(exc)
    seccomp = seccomp_problem()
    if seccomp is not None:
        return f"shell: refused to run: {seccomp}"
    problem = _probe(bwrap, policy.uid, policy.gid)
    return None if problem is None else f"shell: refused to run: {problem}; {USERNS_FIX}"
