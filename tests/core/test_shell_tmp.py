"""The confined shell's own /tmp and /dev/shm, and the workspace quota held during a call (issue 45,
item 3). Real bubblewrap, through a worker process as in test_shell_confine.py: the worker's own
user (root on CI) and uid 65534. Each test does several checks in one or two calls (CPU budget),
and looks at the host afterwards: its /tmp, the workspace's size on disk, processes left."""

from __future__ import annotations

import os
from pathlib import Path

from nexo_django.core.sandboxes.confine import SANDBOX_UID
from nexo_django.core.sandboxes.quotawatch import FILE_SLACK
from tests.core import test_shell_confine as confine_tests
from tests.core.test_shell import none_running, unique_sleep
from tests.core.test_shell_confine import SYSTEM_PYTHON, run, text

who = confine_tests.who
ws = confine_tests.ws
outside = confine_tests.outside

MiB = 1024 * 1024
#: The margins docs/sandboxes.md states for one call past the quota ("The workspace quota").
BYTES_MARGIN = 24 * MiB
ENTRIES_MARGIN = 2000


def on_disk(folder: Path) -> tuple[int, int]:
    """(bytes on disk, entries) of ``folder`` as the quota counts them: blocks, links not followed."""
    size = entries = 0
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            entries += 1
            size += os.lstat(os.path.join(parent, name)).st_blocks * 512
    return size, entries


TEMPFILE = (
    "import os, tempfile\n"
    "with tempfile.NamedTemporaryFile() as f:\n"
    "    f.write(b'x'); f.flush(); print('tempfile', os.path.dirname(f.name))\n"
    "print('mkdtemp', os.path.isdir(tempfile.mkdtemp()))\n"
)


def test_tmp_and_dev_shm_are_the_commands_own_capped_and_gone_after_the_call(who: str, ws: Path) -> None:
    marker = f"nexo-tmp-{os.urandom(6).hex()}"
    (ws / "tmp.py").write_text(TEMPFILE)
    (ws / "tmp.py").chmod(0o644)
    first = (
        "echo hi > /tmp/a && cat /tmp/a; echo shm > /dev/shm/s && cat /dev/shm/s; echo home > $HOME/h && cat $HOME/h; "
        f"{SYSTEM_PYTHON} tmp.py; stat -c '%n %a %u' /tmp /dev/shm $HOME; "
        f"echo {marker} > /tmp/{marker}; echo {marker} > /dev/shm/{marker}; "
        # Past the 1 MiB cap: ENOSPC inside, for /tmp and for /dev/shm, and the call goes on.
        "head -c 2000000 /dev/zero > /tmp/big; echo tmp=$?; head -c 2000000 /dev/zero > /dev/shm/big; echo shm=$?; "
        "echo after"
    )
    second = f"ls -A /tmp /dev/shm; cat /tmp/{marker} || echo gone"
    one, two = run(who, ws, first, second, tmp_size=MiB, file_size=8 * MiB)
    lines = one["stdout"].splitlines()
    assert lines[:5] == ["hi", "shm", "home", "tempfile /tmp", "mkdtemp True"], text(one)
    owner = 0 if confine_tests.ROOT and who == "worker" else SANDBOX_UID  # a root worker's bubblewrap made them
    assert lines[5:8] == [f"/tmp 1777 {owner}", f"/dev/shm 1777 {owner}", f"/tmp/home 700 {SANDBOX_UID}"], text(one)
    assert lines[8:] == ["tmp=1", "shm=1", "after"], text(one)
    assert one["stderr"].count("No space left on device") == 2, one["stderr"]
    assert one["exit_code"] == 0 and "error" not in one
    # The next call has a fresh, empty /tmp (only its HOME, and the workspace's mount point when
    # the workspace lives under the host's /tmp) and an empty /dev/shm.
    assert marker not in two["stdout"] and "big" not in two["stdout"] and two["stdout"].endswith("gone\n"), text(two)
    # Nothing of it on the host.
    assert not (Path("/tmp") / marker).exists() and not (Path("/dev/shm") / marker).exists()
    assert not any(marker in name for name in os.listdir("/tmp"))


def test_a_bubblewrap_without_a_tmpfs_size_cap_runs_nothing(who: str, ws: Path, outside: Path) -> None:
    # What bubblewrap before 0.7.0 says of --perms and --size (the message of its own parser).
    fake = outside / "bwrap"
    fake.write_text('#!/bin/sh\necho "bwrap: Unknown option --perms" >&2\nexit 1\n')
    fake.chmod(0o755)
    [result] = run(who, ws, "touch ran", bwrap=str(fake))
    assert result["error"].startswith("shell: bubblewrap could not set up the sandbox, nothing ran"), result
    assert "--size and --perms" in result["error"] and "0.7.0" in result["error"], result
    assert not (ws / "ran").exists()


#: 48 files of 1 MiB, one every 20 ms (about a second in all): the watch reads the counters every
#: 5 ms, so even a loaded machine that runs it late stops the writer long before the end. (A
#: writer at full speed may finish in less time than a loaded machine gives the watch: then the
#: check after the call reports it, as test_a_shell_call_over_the_quota... shows.)
WRITER = (
    "import time\n"
    "for i in range(48):\n"
    "    with open(f'f{i}', 'wb') as f: f.write(bytes(1 << 20))\n"
    "    time.sleep(0.02)\n"
    "print('wrote all')\n"
)


def test_48_mib_in_one_call_against_an_8_mib_quota_is_stopped_within_the_margin(who: str, ws: Path) -> None:
    marker = unique_sleep()
    (ws / "writer.py").write_text(WRITER)
    (ws / "writer.py").chmod(0o644)
    # One file of 48 MiB stops at what the quota has left (the per-file cap); 48 files of 1 MiB,
    # written as fast as one process can, are stopped by the watch; 200 setsid'd sleeps started
    # meanwhile die with the call.
    single = "head -c 50331648 /dev/zero > one; echo $?"
    many = f"for i in $(seq 200); do setsid sleep {marker} & done; {SYSTEM_PYTHON} writer.py"
    first, = run(who, ws, single, workspace_bytes=8 * MiB)
    assert "over its quota" in first["error"] and "workspace_max_bytes" in first["error"], text(first)
    # The kernel stopped the file at its cap (SIGXFSZ): a byte past the quota's remainder at most
    # FILE_SLACK. (The watch may kill the call before the shell could print head's status.)
    assert 8 * MiB - 64 * 1024 < (ws / "one").stat().st_size <= 8 * MiB + FILE_SLACK
    (ws / "one").unlink()

    second, = run(who, ws, many, workspace_bytes=8 * MiB)
    size, _ = on_disk(ws)
    assert "over its quota" in second["error"] and second["over_quota"], text(second)
    assert "stopped during the call" in second["note"] and "wrote all" not in second["stdout"]
    assert 8 * MiB < size <= 8 * MiB + BYTES_MARGIN, size / MiB
    assert none_running(marker)


def test_many_small_files_in_one_call_are_stopped_within_the_entry_margin(who: str, ws: Path) -> None:
    # One file a process (a fork and an exec each: a few ms), 3000 of them.
    many = "mkdir d && cd d && for i in $(seq 3000); do touch f$i; done; echo made"
    result, after = run(who, ws, many, "touch ran", workspace_entries=200)
    _, entries = on_disk(ws)
    assert "more than 200 entries" in result["error"] and result["over_quota"], text(result)
    assert "stopped during the call" in result["note"] and "made" not in result["stdout"]
    # (the quota counted the root's .git placeholder too, gone after the call: 200 left on disk
    # when the watch stopped it at the first entry past the quota)
    assert 200 <= entries <= 200 + ENTRIES_MARGIN, entries
    assert "refused to run, nothing ran" in after["error"] and not (ws / "ran").exists()
