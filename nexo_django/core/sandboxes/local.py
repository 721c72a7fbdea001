"""A workspace folder on disk. Confinement is enforced on file descriptors, never on path strings.

Every operation opens the root (canonicalised once, at construction) and walks the path one
component at a time with ``O_NOFOLLOW``, relative to the directory descriptor it already holds.
A symbolic link anywhere on the way is refused, so whatever changed on disk since a path was
checked (a directory swapped for a link while a call waited for approval), the descriptor that is
finally read or written is inside the root. The shell is NOT confined: see docs/sandboxes.md.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import os
import secrets
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from ..errors import ConfigurationError, SecurityError
from .base import DEFAULT_PROTECTED, MAX_PATH_CHARS, FileRead, GlobResult, Sandbox, StaleWrite
from .shell import run_shell
from .virtual import _glob_match

__all__ = ["LocalSandbox"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the lstat must not block the open; O_NOCTTY: a terminal
# device must never become our controlling terminal.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | _CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
_CHUNK = 64 * 1024


def _version(st: os.stat_result) -> str:
    # ctime as well as mtime: an in-place edit that restores mtime (touch -d) still changes ctime.
    key = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


class LocalSandbox(Sandbox):
    kind = "local"
    can_write = True
    can_shell = True

    def __init__(self, root: str | os.PathLike[str], *, protected: tuple[str, ...] = DEFAULT_PROTECTED) -> None:
        given = os.fspath(root)
        # Resolved once: a symlink in front of the root is followed now and never again.
        self.root: str = os.path.realpath(given)
        try:
            st = os.stat(self.root, follow_symlinks=False)
        except OSError as exc:
            raise ConfigurationError(
                f"the local sandbox root {given!r} ({self.root}) does not exist: create the folder first"
            ) from exc
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigurationError(f"the local sandbox root {given!r} ({self.root}) is not a directory")
        self._root_id = (st.st_dev, st.st_ino)
        self.protected: tuple[str, ...] = tuple(protected)

    def __repr__(self) -> str:
        return f"LocalSandbox({self.root!r})"

    # --- paths -----------------------------------------------------------------------------

    # --- descriptors ---------------------------------------------------------------------------

    def _open_root(self) -> int:
        try:
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise SecurityError(
                f"the workspace root {self.root} cannot be opened as a plain directory ({exc.strerror}); "
                "it was removed or replaced by a link: build a new sandbox"
            ) from exc
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != self._root_id:
            os.close(fd)
            raise SecurityError(
                f"the workspace root {self.root} was replaced after the sandbox was created: build a new sandbox"
            )
        return fd

    def _refuse(self, parent: int, name: str, rel: str, exc: OSError) -> OSError | SecurityError:
        """Explain why ``name`` could not be opened as a directory: a link is a SecurityError."""
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            st = None
        if exc.errno == errno.ELOOP or (st is not None and stat.S_ISLNK(st.st_mode)):
            return SecurityError(f"{rel!r} is a symbolic link; the workspace never follows links")
        if exc.errno == errno.ENOTDIR:
            return NotADirectoryError(errno.ENOTDIR, "not a directory", rel)
        return exc

    def _open_dir(self, parent: int, name: str, rel: str, *, create: bool) -> int:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            raise self._refuse(parent, name, rel, exc) from exc
        # mkdir never follows a link: a dangling link in the way fails with EEXIST.
        with suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent)
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            raise self._refuse(parent, name, rel, exc) from exc

    @contextmanager
    def _parent(self, rel: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """The descriptor of the directory holding ``rel`` (walked without links) and its name."""
        parts = rel.split("/")
        fd = self._open_root()
        try:
            for index, name in enumerate(parts[:-1]):
                child = self._open_dir(fd, name, "/".join(parts[: index + 1]), create=create)
                os.close(fd)
                fd = child
            yield fd, parts[-1]
        finally:
            os.close(fd)

    def _lstat(self, parent: int, name: str, rel: str) -> os.stat_result:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise SecurityError(f"{rel!r} is a symbolic link; the workspace never follows links")
        return st

    def _special(self, rel: str, mode: int) -> SecurityError:
        return SecurityError(f"{rel!r} is {_kind(mode)}; only regular files are read or written")

    # --- files -----------------------------------------------------------------------------

    def read(self, path: str, max_bytes: int) -> FileRead:
        rel = self.normalize(path)
        with self._parent(rel) as (parent, name):
            # lstat first so a FIFO or a device is never even opened ...
            st = self._lstat(parent, name, rel)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "is a directory", rel)
            if not stat.S_ISREG(st.st_mode):
                raise self._special(rel, st.st_mode)
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=parent)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise SecurityError(f"{rel!r} is a symbolic link; the workspace never follows links") from exc
                raise
        try:
            # ... and the descriptor decides: the entry may have been swapped since the lstat.
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "is a directory", rel)
            if not stat.S_ISREG(st.st_mode):
                raise self._special(rel, st.st_mode)
            # Never trust st_size (a growing file, /proc): read one byte past the cap to know.
            chunks: list[bytes] = []
            remaining = max_bytes + 1
            while remaining > 0:
                chunk = os.read(fd, min(remaining, _CHUNK))
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        truncated = len(data) > max_bytes
        size = max(st.st_size, len(data)) if truncated else len(data)
        return FileRead(rel, data[:max_bytes], size, truncated, _version(st))

    def version(self, path: str) -> str | None:
        rel = self.normalize(path)
        try:
            with self._parent(rel) as (parent, name):
                st = self._lstat(parent, name, rel)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISDIR(st.st_mode):
            return None
        if not stat.S_ISREG(st.st_mode):
            raise self._special(rel, st.st_mode)
        return _version(st)

    def write(self, path: str, data: bytes, *, expected_version: str | None) -> str:
        rel = self.check_writable(path)  # protected names, from the base class
        with self._parent(rel, create=True) as (parent, name):
            try:
                st: os.stat_result | None = self._lstat(parent, name, rel)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "is a directory", rel)
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise self._special(rel, st.st_mode)
            if (None if st is None else _version(st)) != expected_version:
                raise StaleWrite(rel)
            # Permission bits only: setuid/setgid never carry over to new content.
            mode = 0o644 if st is None else stat.S_IMODE(st.st_mode) & 0o777
            return self._replace(parent, name, data, mode)

    def _replace(self, parent: int, name: str, data: bytes, mode: int) -> str:
        """Write a temp file next to ``name`` and rename it over the entry.

        The rename replaces whatever entry is there (a hardlink to an outside file, a link
        swapped in since the check) instead of writing through it."""
        tmp = f".nexo-{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, _TEMP_FLAGS, 0o600, dir_fd=parent)
        try:
            try:
                os.fchmod(fd, mode)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
                os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                with suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
                raise
            os.fsync(parent)
            # After the rename: it changes the inode's ctime, which is part of the version.
            return _version(os.fstat(fd))
        finally:
            os.close(fd)

    # --- glob ------------------------------------------------------------------------------

    def glob(self, pattern: str, *, max_entries: int, max_depth: int, timeout: float) -> GlobResult:
        if not isinstance(pattern, str) or not pattern:
            raise SecurityError("a glob pattern must be a non-empty string")
        if "\x00" in pattern or ".." in pattern.split("/") or pattern.startswith(("/", "~")):
            raise SecurityError(f"glob pattern {pattern!r} leaves the workspace")
        if len(pattern) > MAX_PATH_CHARS:
            raise SecurityError(f"glob pattern is longer than {MAX_PATH_CHARS} characters")
        pats = [p for p in pattern.split("/") if p not in ("", ".")]
        walk = _Walk(pattern, pats, max_entries, max_depth, time.monotonic() + timeout)
        root = self._open_root()
        try:
            walk.visit(root, [])
        except _Stop:
            pass
        finally:
            os.close(root)
        return GlobResult(sorted(walk.found), bool(walk.reason), walk.reason)

    # --- shell -----------------------------------------------------------------------------

    def shell(self, command: str, *, timeout: float, max_output: int) -> dict[str, Any]:
        """Run ``/bin/sh -c command`` in the root. Not a sandbox: it limits, it does not confine."""
        fd = self._open_root()  # refuses a root that was swapped since construction
        os.close(fd)
        return run_shell(command, self.root, timeout, max_output)

    def spec(self) -> dict[str, Any]:
        return {"kind": "local", "root": self.root, "protected": list(self.protected)}

    def identity(self) -> dict[str, Any]:
        """The root's real path and identity (``st_dev``, ``st_ino``), as resolved at construction:
        a durable run pins them when it starts and refuses to act in another workspace."""
        return {"root": self.root, "dev": self._root_id[0], "ino": self._root_id[1]}


class _Stop(Exception):
    pass


def _may_hold_matches(parts: list[str], pats: list[str]) -> bool:
    """Whether a file below the directory ``parts`` could match ``pats`` (prunes the walk)."""
    if not pats:
        return False
    if pats[0] == "**" or not parts:
        return True
    return fnmatch.fnmatchcase(parts[0], pats[0]) and _may_hold_matches(parts[1:], pats[1:])


class _Walk:
    """A bounded walk over directory descriptors: links are neither followed nor listed."""

    def __init__(self, pattern: str, pats: list[str], max_entries: int, max_depth: int, deadline: float) -> None:
        self.pattern = pattern
        self.pats = pats
        self.max_entries = max_entries
        self.max_depth = max_depth
        self.deadline = deadline
        self.found: list[str] = []
        self.reason = ""

    def _stop(self, reason: str) -> None:
        self.reason = reason
        raise _Stop

    def visit(self, fd: int, parts: list[str]) -> None:
        with os.scandir(fd) as entries:
            # Sorted, so that a truncated answer is the same on every run.
            listed = []
            for entry in entries:
                if time.monotonic() > self.deadline:
                    self._stop("time limit")
                listed.append(entry)
        listed.sort(key=lambda e: e.name)
        for entry in listed:
            if time.monotonic() > self.deadline:
                self._stop("time limit")
            child = [*parts, entry.name]
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                if not _may_hold_matches(child, self.pats):
                    continue
                if len(child) >= self.max_depth:
                    # Files below would sit deeper than max_depth: say so instead of hiding it.
                    self.reason = self.reason or f"deeper than {self.max_depth} levels"
                    continue
                try:
                    sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue  # removed, or swapped for a link, since it was listed
                try:
                    self.visit(sub, child)
                finally:
                    os.close(sub)
            elif entry.is_file(follow_symlinks=False):
                rel = "/".join(child)
                if _glob_match(rel, self.pattern):
                    if len(self.found) >= self.max_entries:
                        self._stop(f"more than {self.max_entries} entries")
                    self.found.append(rel)
