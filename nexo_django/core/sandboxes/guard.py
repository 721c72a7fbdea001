"""The workspace around one confined call: a complete survey before it, another after it.

Before a call, one walk of the whole workspace (links never followed) finds every ``.git`` and
every protected name, to be bound read-only, and every folder above one of them, to be bound
over itself (a mount point cannot be renamed: ``mv sub sub2 && mkdir -p sub/.git/hooks`` fails
with ``EBUSY``). The same walk counts entries and bytes against the workspace quota, drops
set-uid/set-gid bits, and, for a root worker, hands the workspace to the user the command runs as.
Whatever stops it from being complete (an unreadable folder, too many entries or bytes, too deep,
an entry that changed during the walk) refuses the call: protection is never partial, whatever
the tree holds. After the call the walk runs again (quota, set-id bits), and a workspace root
that the command made a bare git repository is neutralised and reported.

Concurrent calls in one workspace share a lock file (per worker user, in the temp dir): the
root's ``.git`` placeholder is removed only by the last call to finish.
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import functools
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field

#: Folder levels below the root the walk enters; deeper refuses the call.
WALK_DEPTH = 256
#: Protected entries (and folders above them) bound in one call; more refuses the call.
MAX_PROTECTED_MOUNTS = 2000
#: The longest path bubblewrap is given as a mount point.
MAX_MOUNT_PATH = 4000
#: What makes a folder a bare git repository to git's discovery (``HEAD`` a file or a link).
BARE_LAYOUT = ("HEAD", "objects", "refs")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
SET_ID = stat.S_ISUID | stat.S_ISGID


class WorkspaceRefused(Exception):
    """The workspace's protection or quota cannot be established: nothing runs. The message
    says why and what fixes it."""


@functools.lru_cache(maxsize=32)
def _matcher(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """The fnmatch patterns as one regular expression (what ``fnmatchcase`` does, per pattern)."""
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)) if patterns else None


def is_protected(rel: str, patterns: Sequence[str]) -> bool:
    base = rel.rsplit("/", 1)[-1]
    if base.casefold() == ".git":
        return True
    matcher = _matcher(tuple(patterns))
    return matcher is not None and (matcher.match(rel) is not None or matcher.match(base) is not None)


@dataclass
class Survey:
    entries: int = 0
    bytes: int = 0
    #: (relative path, O_PATH descriptor) of the protected entries, in walk order.
    protected: list[tuple[str, int]] = field(default_factory=list)
    #: relative folder -> O_PATH descriptor: folders holding a protected entry (bound over
    #: themselves so they cannot be renamed).
    holders: dict[str, int] = field(default_factory=dict)
    cleared: list[str] = field(default_factory=list)  # files whose set-id bits were dropped
    handed: int = 0  # entries given to the command's user

    def close(self) -> None:
        for _, fd in self.protected:
            with suppress(OSError):
                os.close(fd)
        for fd in self.holders.values():
            with suppress(OSError):
                os.close(fd)
        self.protected.clear()
        self.holders.clear()


@dataclass(frozen=True)
class Quota:
    max_bytes: int
    max_entries: int

    def over(self, survey: Survey) -> str | None:
        if survey.entries > self.max_entries:
            return f"it holds more than {self.max_entries} entries (NEXO['LIMITS']['workspace_max_entries'])"
        if survey.bytes > self.max_bytes:
            return f"it uses more than {self.max_bytes} bytes on disk (NEXO['LIMITS']['workspace_max_bytes'])"
        return None


class _Stop(Exception):
    pass


def _proc_path(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


class _Walker:
    def __init__(self, root: str, patterns: Sequence[str], quota: Quota, *, bind: bool,
                 owner: tuple[int, int] | None, strict: bool, clear: bool = True) -> None:
        self.root = root
        self.clear = clear  # drop set-id bits (not while the command runs: the walk only counts then)
        self.patterns = patterns
        self.quota = quota
        self.bind = bind
        self.owner = owner
        self.strict = strict  # refuse on what cannot be walked (before a call) or skip it (after)
        self.survey = Survey()
        self.problems: list[str] = []
        self.path: list[tuple[str, int]] = []  # (relative folder, descriptor) from the root down

    def refuse(self, reason: str) -> None:
        if self.strict:
            raise WorkspaceRefused(reason)
        self.problems.append(reason)

    def walk(self, fd: int, rel: str, depth: int, inside_protected: bool) -> None:
        try:
            with os.scandir(fd) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            self.refuse(f"the folder {rel or '.'!r} cannot be listed ({exc.strerror})")
            return
        for entry in entries:
            self.survey.entries += 1
            child = f"{rel}{entry.name}"
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                self.refuse(f"{child!r} changed while the workspace was walked ({exc.strerror})")
                continue
            self.survey.bytes += st.st_blocks * 512
            if self.quota.over(self.survey):
                raise _Stop
            protected = not inside_protected and is_protected(child, self.patterns)
            if not (inside_protected or protected):
                self.hand_over(fd, entry.name, child, st)
            if stat.S_ISLNK(st.st_mode):
                continue
            if self.clear and stat.S_ISREG(st.st_mode) and st.st_mode & SET_ID:
                self.drop_set_id(fd, entry.name, child)
            if protected and (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                self.protect(fd, entry.name, child)
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 > WALK_DEPTH:
                    self.refuse(f"{child!r} is deeper than {WALK_DEPTH} folder levels")
                    continue
                try:
                    sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    self.refuse(f"the folder {child!r} cannot be opened ({exc.strerror})")
                    continue
                self.path.append((child, sub))
                try:
                    if (os.fstat(sub).st_dev, os.fstat(sub).st_ino) != (st.st_dev, st.st_ino):
                        self.refuse(f"{child!r} changed while the workspace was walked")
                        continue
                    self.walk(sub, child + "/", depth + 1, inside_protected or protected)
                finally:
                    self.path.pop()
                    os.close(sub)

    def protect(self, dir_fd: int, name: str, rel: str) -> None:
        if not self.bind or rel == ".git":  # the root's .git is bound before the walk
            return
        if len(os.path.join(self.root, rel)) > MAX_MOUNT_PATH:
            self.refuse(f"the protected entry {rel!r} has a path longer than {MAX_MOUNT_PATH} characters")
            return
        try:
            fd = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            self.refuse(f"the protected entry {rel!r} cannot be opened ({exc.strerror})")
            return
        self.survey.protected.append((rel, fd))
        for folder, folder_fd in self.path:  # the folders above it, each walked through a descriptor
            if folder not in self.survey.holders:
                self.survey.holders[folder] = os.dup(folder_fd)
        if len(self.survey.protected) + len(self.survey.holders) > MAX_PROTECTED_MOUNTS:
            self.refuse(f"more than {MAX_PROTECTED_MOUNTS} protected entries and folders above them")

    def hand_over(self, dir_fd: int, name: str, rel: str, st: os.stat_result) -> None:
        """A root worker's workspace belongs to the command's user: entries of another owner are
        given to it, never through a link (and never a file with other hardlinks: it may be the
        same file as one outside the workspace)."""
        if self.owner is None or (st.st_uid, st.st_gid) == self.owner:
            return
        uid, gid = self.owner
        if stat.S_ISLNK(st.st_mode):
            with suppress(OSError):
                os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
                self.survey.handed += 1
            return
        if not (stat.S_ISDIR(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_nlink == 1)):
            return
        try:
            fd = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
        except OSError:
            return
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) and not stat.S_ISLNK(now.st_mode):
                os.chown(_proc_path(fd), uid, gid)  # the inode itself: no path is resolved again
                self.survey.handed += 1
        except OSError:
            pass
        finally:
            os.close(fd)

    def drop_set_id(self, dir_fd: int, name: str, rel: str) -> None:
        try:
            fd = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            self.refuse(f"the set-id file {rel!r} cannot be opened ({exc.strerror})")
            return
        try:
            now = os.fstat(fd)
            if stat.S_ISREG(now.st_mode) and now.st_mode & SET_ID:
                os.chmod(_proc_path(fd), stat.S_IMODE(now.st_mode) & ~SET_ID)
                self.survey.cleared.append(rel)
        except OSError as exc:
            self.refuse(f"the set-id bits of {rel!r} cannot be dropped ({exc.strerror})")
        finally:
            os.close(fd)


def survey(root: str, root_fd: int, patterns: Sequence[str], quota: Quota, *, bind: bool,
           owner: tuple[int, int] | None) -> Survey:
    """Before a call: the complete walk, or :class:`WorkspaceRefused` saying why not."""
    walker = _Walker(root, patterns, quota, bind=bind, owner=owner, strict=True)
    try:
        if owner is not None:
            _hand_over_root(root_fd, owner)
        walker.walk(root_fd, "", 0, False)
    except _Stop:
        walker.survey.close()
        raise WorkspaceRefused(f"the workspace is over its quota: {quota.over(walker.survey)}; remove files to go on") from None
    except BaseException:
        walker.survey.close()
        raise
    return walker.survey


def check_after(root: str, root_fd: int, patterns: Sequence[str], quota: Quota) -> tuple[list[str], str | None]:
    """After a call: set-id bits dropped and the quota checked, as far as the tree can be walked;
    the problems found (each makes the next call refuse), and the quota's, if it is over."""
    walker = _Walker(root, patterns, quota, bind=False, owner=None, strict=False)
    try:
        walker.walk(root_fd, "", 0, False)
    except _Stop:
        over = f"the workspace is over its quota: {quota.over(walker.survey)}"
        return [*walker.problems, over], over
    finally:
        walker.survey.close()
    return walker.problems, None


def measure(root: str, root_fd: int, quota: Quota) -> tuple[Survey, bool, str | None]:
    """While a call runs: the workspace counted, nothing changed. Returns the count (as far as it
    got: it stops once over), whether the walk saw everything, and the quota's reason if over."""
    walker = _Walker(root, (), quota, bind=False, owner=None, strict=False, clear=False)
    try:
        walker.walk(root_fd, "", 0, False)
    except _Stop:
        return walker.survey, not walker.problems, f"the workspace is over its quota: {quota.over(walker.survey)}"
    finally:
        walker.survey.close()
    return walker.survey, not walker.problems, None


def _hand_over_root(root_fd: int, owner: tuple[int, int]) -> None:
    st = os.fstat(root_fd)
    if (st.st_uid, st.st_gid) != owner:
        os.chown(_proc_path(root_fd), *owner)
    if stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
        os.chmod(_proc_path(root_fd), stat.S_IMODE(st.st_mode) | 0o700)


def neutralise_bare_root(root_fd: int) -> str | None:
    """If the root has git's bare-repository layout (``HEAD``, ``objects/``, ``refs/``), git run
    there would use it, its ``config`` (``core.fsmonitor``...) and its hooks: ``HEAD`` is renamed
    aside so that git no longer sees a repository. Returns what was done, or None."""
    try:
        head = os.stat("HEAD", dir_fd=root_fd, follow_symlinks=False)
        objects = os.stat("objects", dir_fd=root_fd, follow_symlinks=False)
        refs = os.stat("refs", dir_fd=root_fd, follow_symlinks=False)
    except OSError:
        return None
    if not ((stat.S_ISREG(head.st_mode) or stat.S_ISLNK(head.st_mode)) and stat.S_ISDIR(objects.st_mode)
            and stat.S_ISDIR(refs.st_mode)):
        return None
    aside = f"HEAD.nexo-disabled-{secrets.token_hex(4)}"
    os.rename("HEAD", aside, src_dir_fd=root_fd, dst_dir_fd=root_fd)
    return (
        "the workspace root had become a bare git repository (HEAD, objects/, refs/), whose config and "
        f"hooks git run there would use: its HEAD was renamed to {aside}"
    )


class WorkspaceLock:
    """Shared by every call running in one workspace (for one worker user): the root's ``.git``
    placeholder is made by the first call that needs it and removed only by a call that finds
    itself the last one (an exclusive lock, tried without waiting)."""

    def __init__(self, root_fd: int) -> None:
        st = os.fstat(root_fd)
        name = f"nexo-shell-{os.geteuid()}-{st.st_dev}-{st.st_ino}.lock"
        self.path = os.path.join(tempfile.gettempdir(), name)
        self.root_fd = root_fd
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(self.fd)
            raise

    def placeholder(self) -> bool:
        """Make the root's ``.git`` placeholder if there is no ``.git``; True if there is one now."""
        try:
            os.mkdir(".git", 0o555, dir_fd=self.root_fd)
        except FileExistsError:
            return True
        st = os.stat(".git", dir_fd=self.root_fd, follow_symlinks=False)
        record = f"{st.st_dev} {st.st_ino}\n".encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, record, 0)
        return True

    def release(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                raise
            os.close(self.fd)  # another call runs: the last one removes the placeholder
            return
        try:
            record = os.pread(self.fd, 100, 0).split()
            if len(record) == 2:
                with suppress(OSError):
                    st = os.stat(".git", dir_fd=self.root_fd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode) and [str(st.st_dev).encode(), str(st.st_ino).encode()] == record:
                        os.rmdir(".git", dir_fd=self.root_fd)  # rmdir: only while still empty
                os.ftruncate(self.fd, 0)
        finally:
            os.close(self.fd)


__all__ = ["Quota", "Survey", "WorkspaceLock", "WorkspaceRefused", "check_after", "measure", "neutralise_bare_root",
           "survey"]
