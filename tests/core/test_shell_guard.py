"""The confined shell, hardened (issue 31): each attack tried as an attacker would, through a
worker process as in test_shell_confine.py (the worker's own user, root on CI, and uid 65534),
and the host checked afterwards: no host handle through PID 1, the seccomp filter (one test per
denied call), protection that fails closed ((a)-(e): git run on the host does not run what the
command planted), no set-id bit, no keyring secret, the process cap and the workspace quota."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from nexo_django.core.sandboxes.local import LocalSandbox
from tests.core import test_shell_confine as confine_tests
from tests.core.test_shell_confine import (
    ROOT,
    SECRET,
    SYSTEM_PYTHON,
    finish,
    run,
    start,
    text,
    uid_for,
)

# The fixtures of test_shell_confine.py: the worker's own user and uid 65534, their workspace.
who = confine_tests.who
ws = confine_tests.ws

pyseccomp = pytest.importorskip("pyseccomp")  # the `test` extra installs it: never skipped there


def host_git(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """git as a person on the host would run it, trusting the folder (``safe.directory``: else git
    refuses a workspace owned by the shell's user, which would hide whether planted code runs)."""
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", str(folder), *args], capture_output=True,
                          text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "HOME": str(folder), "GIT_CONFIG_NOSYSTEM": "1"})


def git_init(folder: Path, who: str) -> None:
    done = subprocess.run(["git", "init", "-q", str(folder)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    uid = uid_for(who)
    if uid is not None:
        for path in [folder, *folder.rglob("*")]:
            os.chown(path, uid, uid)


def planted(marker: Path) -> str:
    """A git config value that runs code: touching ``marker`` if git ever runs it."""
    return f'"touch {marker}; false"'


# --- 1. never host root; PID 1 holds no host handle -------------------------------------------------


def test_the_command_is_never_root_on_the_host(who: str, ws: Path) -> None:
    [result] = run(who, ws, "id -u; touch made; cat /proc/self/uid_map")
    assert result["stdout"].split()[0] == "65534"
    owner = (ws / "made").stat().st_uid
    assert owner != 0 and owner == (65534 if ROOT else os.getuid())


def test_pid_1_holds_no_host_handle_over_300_races(who: str, ws: Path) -> None:
    # bubblewrap's own PID 1 held the host's /proc (fd 3) until it had started the command, and
    # was dumpable with the command's uid: `exec 9</proc/1/fd/3` won in 1-3 % of calls, and gave
    # the host's processes (and, for a root worker, /proc/sys/kernel/core_pattern). The race
    # exists once per sandbox start: 150 calls per worker, 300 in all, each racing 20 times.
    probe = (
        "w=0; i=0; while [ $i -lt 20 ]; do for n in 3 4 5 6 7 8 9; do "
        f"[ -e /proc/1/fd/$n/{os.getpid()} ] && w=$((w+1)); "
        "done; i=$((i+1)); done; echo $w"
    )
    # PID 1's descriptors are listed by a child shell that makes its own redirections: a pipeline or
    # a glob of PID 1's own would show the pipe or the directory PID 1 holds for that moment.
    first = ("tr '\\0' ' ' < /proc/1/cmdline; echo; sh -c 'ls /proc/1/fd > fds.txt'; tr '\\n' ' ' < fds.txt; echo; "
             "sh -c 'for fd in /proc/1/fd/*; do readlink $fd; done'")
    pid_1, *results = run(who, ws, first, *[probe] * 150, timeout=10)
    # Deterministic: PID 1 is the command itself (the caps' prlimit exec'd into it), not a
    # bubblewrap init, and it holds only its stdin, stdout and stderr (/dev/null and two pipes).
    cmdline, fds, *targets = pid_1["stdout"].splitlines()
    assert cmdline.startswith("/bin/sh -c tr") and "bwrap" not in cmdline, pid_1
    assert fds.split() == ["0", "1", "2"], pid_1
    assert targets[0] == "/dev/null" and all(t.startswith("pipe:") for t in targets[1:]), pid_1
    # And the race itself, 300 times in all: never won.
    wins = [r for r in results if r.get("stdout") != "0\n"]
    assert len(results) == 150 and wins == []


# --- 2. the seccomp filter: one test per denied call ---------------------------------------------------

#: probe -> (system call, Python arguments of syscall() after its number, what it answered WITHOUT
#: the filter on the development machine: where that is not EPERM, the EPERM seen shows the filter,
#: not a missing capability; only pivot_root and clone(CLONE_NEWNS) answer EPERM either way).
PROBES: dict[str, tuple[str, str, str]] = {
    "keyctl": ("keyctl", "0, -3, 0", "success"),  # KEYCTL_GET_KEYRING_ID of the session keyring
    "add_key": ("add_key", "b'user', b'nexo', b'x', 1, -3", "success"),
    "request_key": ("request_key", "b'user', b'nexo-none', 0, 0", "ENOKEY"),
    "ptrace": ("ptrace", "2, 999999, 0, 0", "ESRCH"),  # PTRACE_PEEKDATA
    "process_vm_readv": ("process_vm_readv", "999999, 0, 0, 0, 0, 0", "EINVAL"),
    "process_vm_writev": ("process_vm_writev", "999999, 0, 0, 0, 0, 0", "EINVAL"),
    "mount": ("mount", "1, 1, 1, 0, 0", "EFAULT"),
    "umount2": ("umount2", "1, 0", "EFAULT"),
    "pivot_root": ("pivot_root", "1, 1", "EPERM without CAP_SYS_ADMIN"),
    "unshare": ("unshare", "0", "success"),
    "setns": ("setns", "-1, 0", "EBADF"),
    "bpf": ("bpf", "9999, 0, 0", "EINVAL"),
    "perf_event_open": ("perf_event_open", "0, 0, -1, -1, 0", "EFAULT"),
    "userfaultfd": ("userfaultfd", "1", "success"),  # UFFD_USER_MODE_ONLY
    "kexec_load": ("kexec_load", "0, 0, 0, 0", "ENOSYS here (no kexec in this kernel)"),
    "kexec_file_load": ("kexec_file_load", "-1, -1, 0, 0, 0", "ENOSYS here"),
    "open_by_handle_at": ("open_by_handle_at", "-1, 0, 0", "EFAULT"),
    "io_uring_setup": ("io_uring_setup", "0, 0", "EFAULT"),
    "io_uring_enter": ("io_uring_enter", "-1, 0, 0, 0, 0, 0", "EBADF"),
    "io_uring_register": ("io_uring_register", "-1, 0, 0, 0", "EINVAL"),
    "clone_newuser": ("clone", "0x10000000 | 17, 0, 0, 0, 0", "a child in a new user namespace"),
    "clone_newns": ("clone", "0x00020000 | 17, 0, 0, 0, 0", "EPERM without CAP_SYS_ADMIN"),
    "ioctl_tiocsti": ("ioctl", "0, 0x5412, ctypes.byref(ctypes.c_char(b'x'))", "ENOTTY (stdin is /dev/null)"),
    "ioctl_tiocsti_high_bits": ("ioctl", "0, 0x100005412, ctypes.byref(ctypes.c_char(b'x'))", "ENOTTY"),
    "ioctl_tioclinux": ("ioctl", "0, 0x541C, ctypes.byref(ctypes.c_char(b'\\x0b'))", "ENOTTY"),
    "chmod_setuid": ("chmod", "b'own', 0o4755", "success"),
    "chmod_setgid": ("chmod", "b'own', 0o2755", "success"),
    "fchmod_setuid": ("fchmod", "os.open('own', os.O_RDONLY), 0o4755", "success"),
    "fchmodat_setuid": ("fchmodat", "-100, b'own', 0o4755", "success"),  # AT_FDCWD
    "fchmodat2_setgid": ("fchmodat2", "-100, b'own', 0o2755, 0", "success"),
    "open_creat_setuid": ("open", "b'new1', os.O_CREAT | os.O_WRONLY, 0o4755", "success"),
    "openat_creat_setuid": ("openat", "-100, b'new2', os.O_CREAT | os.O_WRONLY, 0o4755", "success"),
    "creat_setgid": ("creat", "b'new3', 0o2755", "success"),
    "mknod_setuid": ("mknod", "b'new4', 0o100000 | 0o4755, 0", "success"),
}
#: Allowed calls beside them: the filter is not a blanket denial.
CONTROLS = {
    "chmod_plain": ("chmod", "b'own', 0o755"),
    "ioctl_tcgets": ("ioctl", "0, 0x5401, ctypes.create_string_buffer(64)"),  # ENOTTY, not EPERM
    "clone3": ("clone3", "0, 0"),  # ENOSYS
    "openat2": ("openat2", "-100, b'own', 0, 0"),  # ENOSYS
}


@pytest.fixture(scope="module")
def syscall_answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """Every probe and control in one confined call (one sandbox start): name -> errno (0: it worked)."""
    folder = tmp_path_factory.mktemp("seccomp")
    os.chmod(folder, 0o755)
    calls = {name: call for name, (call, *_) in [*PROBES.items(), *CONTROLS.items()]}
    numbers = {name: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, call) for name, call in calls.items()}
    lines = ["import ctypes, os, json", "libc = ctypes.CDLL(None, use_errno=True)",
             "libc.syscall.restype = ctypes.c_long", "open('own', 'w').close()", "out = {}"]
    for name, (_, args, _) in PROBES.items():
        lines.append(f"ctypes.set_errno(0); r = libc.syscall({numbers[name]}, {args})")
        lines.append("if r == 0 and " + ("True" if name.startswith("clone") else "False") + ": os._exit(0)")
        lines.append(f"out[{name!r}] = ctypes.get_errno() if r < 0 else 0")
    for name, (_, args) in CONTROLS.items():
        lines.append(f"ctypes.set_errno(0); r = libc.syscall({numbers[name]}{', ' if args else ''}{args})")
        lines.append(f"out[{name!r}] = ctypes.get_errno() if r < 0 else 0")
    lines.append("print(json.dumps(out))")
    (folder / "probe.py").write_text("\n".join(lines) + "\n")
    result = LocalSandbox(folder).shell(f"{SYSTEM_PYTHON} probe.py", timeout=30, max_output=100_000)
    assert result.get("exit_code") == 0, result
    answers: dict[str, int] = json.loads(result["stdout"])
    return answers


@pytest.mark.parametrize("name", sorted(PROBES))
def test_the_seccomp_filter_denies(name: str, syscall_answers: dict[str, int]) -> None:
    assert syscall_answers[name] == errno.EPERM, (name, PROBES[name][2], syscall_answers[name])


def test_the_seccomp_filter_allows_the_same_calls_without_the_dangerous_arguments(syscall_answers: dict[str, int]) -> None:
    assert syscall_answers["chmod_plain"] == 0
    assert syscall_answers["ioctl_tcgets"] == errno.ENOTTY


def test_clone3_and_openat2_answer_enosys_so_callers_fall_back(syscall_answers: dict[str, int]) -> None:
    # Their flags are in a struct the filter cannot read: ENOSYS makes the C library use clone
    # and openat, whose arguments are checked (fork still works: the probe itself ran in a shell).
    assert syscall_answers["clone3"] == syscall_answers["openat2"] == errno.ENOSYS


# --- 3. protection fails closed: (a)-(e), and git run on the host afterwards --------------------------------


def test_a_entries_before_git_never_leave_it_writable_nor_a_set_id_bit(who: str, ws: Path) -> None:
    # (a) 20,001 entries that sort before ".git" exhausted the walk's budget: the root .git was
    # left writable, and past the same bound the after-call sweep missed a `chmod 4755`. Now the
    # root .git is bound first, the walk is complete or refuses, and the seccomp filter refuses
    # the set-id bits whatever the tree holds.
    git_init(ws, who)
    config = (ws / ".git" / "config").read_text()
    marker = ws.parent / f"{ws.name}-planted"
    flood = (
        "mkdir f && cd f && seq 20001 | sed 's/^/+/' | xargs touch && cd .. && ls f | wc -l; "
        "cp /bin/sh zsh && chmod 4755 zsh; "
        f"{SYSTEM_PYTHON} -c \"import os; os.close(os.open('zsh2', os.O_CREAT | os.O_WRONLY, 0o6755))\""
    )
    attack = (f"echo 'touch {marker}' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit; "
              f"printf '[core]\\n\\tfsmonitor = {planted(marker)}\\n' >> .git/config; echo done")
    flooded, attacked = run(who, ws, flood, attack)
    assert flooded["stdout"] == "20001\n" and flooded["stderr"].count("Operation not permitted") == 2
    assert attacked["stdout"] == "done\n" and attacked["stderr"].count("cannot create") == 2  # read-only (or root's)
    assert not (ws / ".git" / "hooks" / "pre-commit").exists() and (ws / ".git" / "config").read_text() == config
    for path in (ws / "zsh", *ws.iterdir()):
        if path.is_file():
            assert path.stat().st_mode & 0o6000 == 0, path
    host_git(ws, "status")
    assert not marker.exists()


def test_a_walk_past_the_entry_quota_refuses_the_next_call(who: str, ws: Path) -> None:
    first, second = run(who, ws, "seq 300 | xargs touch; echo made", "touch ran", workspace_entries=200)
    # (the watch may stop the command during the call, before its echo: tests/core/test_shell_tmp.py)
    assert "more than 200 entries" in first["error"] and first["over_quota"]
    assert "refused to run, nothing ran" in second["error"] and "more than 200 entries" in second["error"]
    assert not (ws / "ran").exists()


def test_b_an_unreadable_folder_never_hides_a_nested_git(who: str, ws: Path) -> None:
    # (b) `chmod 000 sub` made sub/.git unopenable and the walk skipped it silently.
    git_init(ws / "sub", who)
    config = (ws / "sub" / ".git" / "config").read_text()
    marker = ws.parent / f"{ws.name}-planted"
    attack = f"chmod 755 sub; printf '[core]\\n\\tfsmonitor = {planted(marker)}\\n' >> sub/.git/config; echo done"
    hide, second = run(who, ws, "chmod 000 sub; echo hidden", attack)
    assert hide["stdout"] == "hidden\n"
    if ROOT and who == "worker":
        # Root walks it anyway: sub/.git is found and bound read-only.
        assert second["stdout"] == "done\n" and "cannot create sub/.git/config" in second["stderr"]
    else:
        assert "refused to run, nothing ran" in second["error"] and "'sub'" in second["error"]
    os.chmod(ws / "sub", 0o755)
    assert (ws / "sub" / ".git" / "config").read_text() == config
    host_git(ws / "sub", "status")
    assert not marker.exists()


def neutralised_and_harmless(who: str, ws: Path, attack: str, planted_at: Path, marker: Path) -> dict[str, Any]:
    """Run ``attack`` (which ends with ``echo done``) then a second call; check that what it
    planted at ``planted_at`` was renamed aside (``<name>.nexo-disabled-*``), that the next call
    runs, and that git on the host runs nothing planted. Then put the planted entry back and check
    that git on the host does run it: the checks can fail. The first call's result."""
    first, second = run(who, ws, attack, "echo again")
    assert first["stdout"] == "done\n"
    disabled = list(planted_at.parent.glob(f"{planted_at.name}.nexo-disabled-*"))
    assert not planted_at.exists() and len(disabled) == 1
    assert second == {"exit_code": 0, "stdout": "again\n", "stderr": "", "truncated": False}
    host_git(ws, "status")
    assert not marker.exists()
    disabled[0].rename(planted_at)
    host_git(ws, "status")
    assert marker.exists()
    return first


def test_c_a_bare_repository_at_the_root_is_neutralised_and_flagged(who: str, ws: Path) -> None:
    # (c) HEAD, objects/, refs/ and a config at the root: git on the host would use the root as a
    # repository and run its core.fsmonitor.
    marker = ws.parent / f"{ws.name}-planted"
    attack = (
        "mkdir -p objects refs/heads && echo 'ref: refs/heads/main' > HEAD && "
        f"printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n\\tworktree = .\\n\\tfsmonitor = {planted(marker)}\\n' > config; "
        "echo done"
    )
    first = neutralised_and_harmless(who, ws, attack, ws / "HEAD", marker)
    assert "bare git repository" in first["error"] and "HEAD.nexo-disabled-" in first["error"]
    marker.unlink()


def test_c_a_registered_submodule_never_checked_out_gets_no_git_that_the_root_would_run(who: str, ws: Path) -> None:
    # The root registers `sub` (a gitlink in its index) but it was never checked out: no sub/.git
    # to protect before the call. git status at the root recurses into a submodule with a .git.
    done = subprocess.run(["git", "init", "-q", str(ws)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    done = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(ws), "update-index", "--add", "--cacheinfo",
                           f"160000,{'1' * 40},sub"], capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    uid = uid_for(who)
    if uid is not None:
        for path in [ws, *ws.rglob("*")]:
            os.chown(path, uid, uid)
    marker = ws.parent / f"{ws.name}-planted"
    attack = (
        "mkdir -p sub/.git/objects sub/.git/refs/heads && echo 'ref: refs/heads/main' > sub/.git/HEAD && "
        f"printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = {planted(marker)}\\n' > sub/.git/config; "
        "echo done"
    )
    first = neutralised_and_harmless(who, ws, attack, ws / "sub" / ".git", marker)
    assert "submodule 'sub'" in first["error"] and "sub/.git.nexo-disabled-" in first["error"]
    marker.unlink()


def test_d_a_folder_above_a_protected_entry_cannot_be_renamed(who: str, ws: Path) -> None:
    # (d) `mv sub sub-moved && mkdir -p sub/.git/hooks` replaced a protected nested repository.
    git_init(ws / "sub", who)
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "b" / ".envrc").write_text("# mine\n")
    if uid_for(who) is not None:
        for path in [ws / "a", ws / "a" / "b", ws / "a" / "b" / ".envrc"]:
            os.chown(path, 65534, 65534)
    marker = ws.parent / f"{ws.name}-planted"
    attack = (
        f"mv sub sub-moved; mkdir -p sub/.git/hooks; echo 'touch {marker}' > sub/.git/hooks/pre-commit; "
        "mv a a2; mv a/b a/b2; rm -f a/b/.envrc; echo evil > a/b/.envrc; echo done"
    )
    [result] = run(who, ws, attack)
    assert result["stdout"] == "done\n"
    assert result["stderr"].count("Device or resource busy") >= 4
    assert not (ws / "sub-moved").exists() and not (ws / "a2").exists()
    assert not (ws / "sub" / ".git" / "hooks" / "pre-commit").exists()
    assert (ws / "a" / "b" / ".envrc").read_text() == "# mine\n"
    host_git(ws / "sub", "status")
    assert not marker.exists()


def test_e_concurrent_calls_never_remove_each_others_git_placeholder(who: str, ws: Path) -> None:
    # (e) the first call to end removed the .git placeholder the second call's sandbox relied on:
    # the second then made .git/hooks on the host.
    wait = "i=0; while [ ! -e {0} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done"
    first = start(who, ws, f"{wait.format('b-started')}; touch a-done")
    second = start(who, ws, f"touch b-started; {wait.format('a-done')}; sleep 0.5; "
                            "mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit; echo done")
    [a], [b] = finish(who, first), finish(who, second)
    assert a["exit_code"] == 0 and b["stdout"] == "done\n"
    assert "Read-only file system" in b["stderr"]
    assert not (ws / ".git").exists()  # the last call to end removed the placeholder


# --- 4-6. no set-id bit, no keyring secret, the process cap, the quota --------------------------------------


KEYRING_PRELUDE = f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
assert libc.syscall(250, 1, None) > 0  # KEYCTL_JOIN_SESSION_KEYRING: a fresh one, not the host's
serial = libc.syscall(248, b"user", b"nexo-secret", {SECRET.encode()!r}, {len(SECRET)}, -3)
assert serial > 0, ctypes.get_errno()
open(os.path.join(spec["ws"], "serial"), "w").write(str(serial))
os.chmod(os.path.join(spec["ws"], "serial"), 0o644)
"""

KEYRING_PROBE = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
serial = int(open("serial").read())
buf = ctypes.create_string_buffer(4096)
for args in ((11, serial, buf, 4096), (0, -3, 0), (10, -3, b"user", b"nexo-secret", 0)):
    r = libc.syscall(250, *args); print(r, ctypes.get_errno(), buf.raw[:64].rstrip(b"\\0"))
"""


def test_the_workers_session_keyring_is_not_readable(who: str, ws: Path) -> None:
    (ws / "probe.py").write_text(KEYRING_PROBE)
    (ws / "probe.py").chmod(0o644)
    confined, = run(who, ws, f"{SYSTEM_PYTHON} probe.py; cat /proc/keys", prelude=KEYRING_PRELUDE)
    assert SECRET not in text(confined)
    assert [line.split()[:2] for line in confined["stdout"].splitlines()[:3]] == [["-1", str(errno.EPERM)]] * 3
    if who == "worker":  # unconfined, the same probe reads it: the test can tell (once is enough)
        unconfined, = run(who, ws, f"{SYSTEM_PYTHON} probe.py", prelude=KEYRING_PRELUDE, confine=False)
        assert SECRET in text(unconfined)


def test_the_workspace_byte_quota_fails_the_call_and_refuses_the_next(who: str, ws: Path) -> None:
    write = "for i in 1 2 3 4; do head -c 600000 /dev/zero > big$i; done; echo wrote"
    first, second = run(who, ws, write, "touch ran", workspace_bytes=2 * 1024 * 1024)
    # (the watch may stop the command during the call, before its echo: tests/core/test_shell_tmp.py)
    assert "over its quota" in first["error"] and "workspace_max_bytes" in first["error"] and first["over_quota"]
    assert "refused to run, nothing ran" in second["error"] and "workspace_max_bytes" in second["error"]
    assert not (ws / "ran").exists()
