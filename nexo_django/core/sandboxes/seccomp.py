"""The seccomp filter of every confined command: what namespaces do not isolate is denied.

Built with ``pyseccomp`` (ctypes over the system's libseccomp2; the ``shell`` extra installs it)
and handed to bubblewrap as a BPF program (``--seccomp FD``): bubblewrap loads it, after
``no_new_privs``, just before it starts the command, so everything the command starts inherits
it. In the spirit of Docker's default profile and Codex's Linux sandbox: the calls below return
``EPERM`` (``clone3`` returns ``ENOSYS``, so the C library falls back to ``clone``, whose
namespace flags are checked); system calls of another ABI (32-bit ``int 0x80``, x32) kill the
process, since the filter is written for the native one. When it cannot be built, nothing runs.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from typing import Any

#: Denied outright (EPERM): the kernel's keyrings are not namespaced (the worker's session keyring
#: would be readable); ptrace and cross-process memory; mounts, new namespaces and entering
#: others; BPF, perf, userfaultfd and io_uring (where most recent kernel escapes were found);
#: kexec and modules; file handles (``open_by_handle_at`` reaches files outside any mount).
DENIED = (
    "keyctl", "add_key", "request_key",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr",
    "unshare", "setns",
    "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "open_by_handle_at", "name_to_handle_at",
    "acct", "swapon", "swapoff", "reboot", "quotactl", "syslog", "personality", "uselib",
)
#: ``ENOSYS``: its arguments are in a struct a filter cannot read; callers fall back to the
#: older call (``clone``, ``openat``), whose arguments are checked.
UNSUPPORTED = ("clone3", "openat2")
#: ``clone`` with any of these flags (a new namespace) is denied.
CLONE_NAMESPACES = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
#: ioctl requests denied on any descriptor: pushing characters into a terminal's input.
IOCTLS = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C}
#: Calls whose mode argument (index) may not carry the set-uid or set-gid bit.
MODE_ARGUMENT = {
    "chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2,
    "open": 2, "openat": 3, "creat": 1, "mknod": 1, "mknodat": 2,
}
SET_ID_BITS = (stat.S_ISUID, stat.S_ISGID)

SECCOMP_FIX = (
    "the confined shell needs libseccomp2 (Debian/Ubuntu: apt-get install libseccomp2; Fedora: dnf "
    "install libseccomp) and the pyseccomp package (pip install 'nexo-django[shell]')"
)


class SeccompUnavailable(Exception):
    """The filter cannot be built here: the message names the fix."""


def _library() -> Any:
    try:
        import pyseccomp
    except ImportError as exc:  # not installed
        raise SeccompUnavailable(f"pyseccomp is not installed ({exc}); {SECCOMP_FIX}") from exc
    except (RuntimeError, OSError) as exc:  # installed, but libseccomp is missing
        raise SeccompUnavailable(f"libseccomp cannot be loaded ({exc}); {SECCOMP_FIX}") from exc
    return pyseccomp


def _build() -> bytes:
    sc = _library()
    eperm = sc.ERRNO(errno.EPERM)
    rules = sc.SyscallFilter(sc.ALLOW)
    rules.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)

    def add(action: int, name: str, *args: Any) -> None:
        number = sc.resolve_syscall(sc.Arch.NATIVE, name)
        if number < 0:
            return  # not a call of this architecture (umount, open, creat... on arm64)
        rules.add_rule(action, name, *args)

    for name in DENIED:
        add(eperm, name)
    for name in UNSUPPORTED:
        add(sc.ERRNO(errno.ENOSYS), name)
    for flag in CLONE_NAMESPACES.values():
        add(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for request in IOCTLS.values():
        # The kernel reads the request as 32 bits: compare only those (0x1_0000_5412 is TIOCSTI too).
        add(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    for name, index in MODE_ARGUMENT.items():
        for bit in SET_ID_BITS:
            add(eperm, name, sc.Arg(index, sc.MASKED_EQ, bit, bit))
    read_fd, write_fd = os.pipe()
    try:
        with os.fdopen(write_fd, "wb", closefd=True) as out:
            rules.export_bpf(out)
        chunks = []
        while chunk := os.read(read_fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(read_fd)
    program = b"".join(chunks)
    if not program or len(program) % 8:
        raise SeccompUnavailable(f"libseccomp exported an invalid program ({len(program)} bytes); {SECCOMP_FIX}")
    return program


@functools.cache
def _cached() -> bytes | str:
    try:
        return _build()
    except SeccompUnavailable as exc:
        return str(exc)
    except (OSError, ValueError) as exc:
        return f"the seccomp filter could not be built ({exc}); {SECCOMP_FIX}"


def filter_program() -> bytes:
    """The BPF program (``struct sock_filter`` array) bubblewrap loads; built once per process.
    Raises :class:`SeccompUnavailable` naming the fix."""
    program = _cached()
    if isinstance(program, str):
        raise SeccompUnavailable(program)
    return program


def seccomp_problem() -> str | None:
    """Why the filter cannot be built here (a message naming the fix), or None."""
    program = _cached()
    return program if isinstance(program, str) else None


def program_fd(program: bytes) -> int:
    """A descriptor to read ``program`` from, for ``--seccomp FD`` (a memfd: no pipe to fill)."""
    fd = os.memfd_create("nexo-seccomp", os.MFD_CLOEXEC)
    try:
        view = memoryview(program)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


__all__ = ["DENIED", "SeccompUnavailable", "filter_program", "program_fd", "seccomp_problem"]
