"""The workspace quota held while a confined command runs (docs/sandboxes.md, "The workspace quota").

Two parts. Each file a process of the command writes stops at what the quota has left when the
call starts, plus :data:`FILE_SLACK` (``RLIMIT_FSIZE``, set by :func:`file_cap`): synchronous, the
kernel's own check. Across files, :class:`QuotaWatch` reads the workspace filesystem's free-block
and free-inode counters every :data:`CHECK_INTERVAL` seconds (one ``fstatvfs``: cheap, and on
ext4, XFS and tmpfs it counts a write as soon as it is buffered); when they have grown by more
than the quota has left, it walks the workspace, and over the quota it kills the sandbox. A
periodic walk (:data:`BACKSTOP`) also catches growth those counters hide (another process
freeing space on the same filesystem at the same time). No filesystem-level cap is used: none
can be had by an unprivileged worker on an ordinary filesystem.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from .guard import Quota, Survey, measure

#: Seconds between two reads of the filesystem's counters during a call.
CHECK_INTERVAL = 0.005
#: Bytes one file may pass the quota's remainder by: a file stopped there leaves the workspace
#: over its quota, so the call is reported over it, never silently cut at exactly the limit.
FILE_SLACK = 4096
#: Seconds between walks done whatever the counters say (at least; see ``_gap``).
BACKSTOP = 1.0
#: A walk costs at most about 1/WALK_SHARE of the time between two walks (a big workspace on a
#: busy filesystem is not walked continuously).
WALK_SHARE = 10


def file_cap(policy_file_size: int, quota: Quota, before: Survey) -> int:
    """``RLIMIT_FSIZE`` for this call: the policy's per-file cap, or what the quota has left."""
    return max(1, min(policy_file_size, quota.max_bytes - before.bytes + FILE_SLACK))


def _usage(fd: int) -> tuple[int, int]:
    st = os.fstatvfs(fd)
    return (st.f_blocks - st.f_bfree) * st.f_frsize, (st.f_files - st.f_ffree) if st.f_files else 0


class QuotaWatch:
    """A thread that kills the call (``kill()``) once the workspace is over ``quota``; ``over``
    then says why. ``before`` is the survey taken before the call (its counts)."""

    def __init__(self, root: str, root_fd: int, quota: Quota, before: Survey, kill: Callable[[], None]) -> None:
        self.root = root
        # A descriptor of our own: the walk reads the folder's position, shared by dup()s.
        self.fd = os.open(f"/proc/self/fd/{root_fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.quota = quota
        self.left_bytes = quota.max_bytes - before.bytes
        self.left_entries = quota.max_entries - before.entries
        self.kill = kill
        self.over: str | None = None
        self.walks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="nexo-quota-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the command has ended); idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _watch(self) -> None:
        used, inodes = _usage(self.fd)
        last_walk, gap = time.monotonic(), BACKSTOP
        walk_cost = 0.0
        while not self._stop.wait(CHECK_INTERVAL):
            try:
                now_used, now_inodes = _usage(self.fd)
            except OSError:
                continue
            now = time.monotonic()
            grown = now_used - used > self.left_bytes or now_inodes - inodes > self.left_entries
            if not (grown and now - last_walk >= WALK_SHARE * walk_cost) and now - last_walk < gap:
                continue
            try:
                found, complete, over = measure(self.root, self.fd, self.quota)
            except OSError:
                continue
            self.walks += 1
            walk_cost = time.monotonic() - now
            last_walk, gap = time.monotonic(), max(BACKSTOP, WALK_SHARE * walk_cost)
            if over is not None:
                self.over = over
                self.kill()
                return
            if complete:
                self.left_bytes = self.quota.max_bytes - found.bytes
                self.left_entries = self.quota.max_entries - found.entries
            else:
                # Part of the tree could not be walked (a folder the command made unreadable):
                # what it holds stays charged by the counters, never forgiven by the walk.
                self.left_bytes -= now_used - used
                self.left_entries -= now_inodes - inodes
            used, inodes = now_used, now_inodes


__all__ = ["BACKSTOP", "CHECK_INTERVAL", "FILE_SLACK", "QuotaWatch", "file_cap"]
