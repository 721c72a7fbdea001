"""Submodules the root repository registers but that were never checked out.

git run at the workspace root recurses into every submodule that has a ``.git``: it reads that
``.git``'s config (``core.fsmonitor``, ``core.hooksPath``...) and runs what it names. A submodule
the root's index registers (a *gitlink*, mode 160000) but that was never checked out has no
``.git`` to protect before a call, so a command could give it one. The confined shell therefore
reads the root's index before each call (:func:`registered`), notes which of those have no
``.git`` (:func:`absent`), and after the call renames aside any ``.git`` that appeared there
(:func:`neutralise_new`), before anyone can run git on the host. Plain Python: the index is parsed
here (versions 2 to 4), git is never run on the workspace.
"""

from __future__ import annotations

import os
import secrets
import stat
import struct
from collections.abc import Sequence

#: an index bigger than this is not read (the gitlinks of such a repository are not looked for)
MAX_INDEX_BYTES = 64 * 1024 * 1024
GITLINK = 0o160000
#: the gitlinks of the indexes read lately, by the index file's identity and version
_parsed: dict[tuple[int, ...], tuple[str, ...]] = {}
PARSED_MAX = 64


def _hash_size(root_fd: int) -> int:
    """20 (SHA-1), or 32 for a repository whose config says ``objectFormat = sha256``."""
    try:
        fd = os.open(".git/config", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
    except OSError:
        return 20
    with os.fdopen(fd, "rb") as config:
        text = config.read(1024 * 1024).decode("utf-8", "replace").lower().replace(" ", "").replace("\t", "")
    return 32 if "objectformat=sha256" in text else 20


def parse_index(data: bytes, hash_size: int = 20) -> list[str]:
    """The gitlink paths of a git index (versions 2, 3 and 4); ``ValueError`` if it is not one."""
    if len(data) < 12 or data[:4] != b"DIRC":
        raise ValueError("not a git index")
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3, 4):
        raise ValueError(f"git index version {version}")
    found: list[str] = []
    at, previous = 12, b""
    fixed = 40 + hash_size + 2  # ctime, mtime, dev, ino, mode, uid, gid, size; the hash; the flags
    for _ in range(count):
        if at + fixed > len(data):
            raise ValueError("git index cut short")
        mode = struct.unpack(">I", data[at + 24:at + 28])[0]
        flags = struct.unpack(">H", data[at + fixed - 2:at + fixed])[0]
        start = at + fixed + (2 if version >= 3 and flags & 0x4000 else 0)
        if version == 4:  # the path: strip N bytes of the previous one, then a NUL-terminated suffix
            byte = data[start]
            strip, start = byte & 0x7F, start + 1
            while byte & 0x80:
                byte = data[start]
                strip, start = ((strip + 1) << 7) | (byte & 0x7F), start + 1
            end = data.index(b"\0", start)
            path = previous[:len(previous) - strip] + data[start:end]
            at = end + 1
        else:
            end = data.index(b"\0", start)
            path = data[start:end]
            at += (end - at + 8) & ~7  # the entry, padded with 1 to 8 NULs to a multiple of 8
        previous = path
        if stat.S_IFMT(mode) == GITLINK:
            found.append(path.decode("utf-8", "surrogateescape"))
    return found


def registered(root_fd: int) -> list[str]:
    """The gitlinks of the root repository's index ([] without a readable ``.git/index``)."""
    try:
        fd = os.open(".git/index", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as index:
        st = os.fstat(index.fileno())
        if st.st_size > MAX_INDEX_BYTES:
            return []
        # Parsed once per version of the index (a big one costs ~1 µs an entry), not every call.
        version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if version in _parsed:
            return list(_parsed[version])
        data = index.read()
    try:
        paths = parse_index(data, _hash_size(root_fd))
    except (ValueError, IndexError, struct.error):
        paths = []
    found = [p for p in paths if p and not p.startswith("/") and ".." not in p.split("/")]
    if len(_parsed) >= PARSED_MAX:
        _parsed.clear()
    _parsed[version] = tuple(found)
    return found


def _folder(root_fd: int, path: str) -> int | None:
    """A descriptor of the folder ``path`` below the root, never through a symbolic link."""
    fd = os.dup(root_fd)
    try:
        for part in path.split("/"):
            if part in ("", "."):
                continue
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError:
        os.close(fd)
        return None
    return fd


def _holds_git(fd: int) -> bool:
    """Whether the folder ``fd`` holds a ``.git`` (of any kind, a symbolic link included)."""
    try:
        os.stat(".git", dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _has_git(root_fd: int, path: str) -> bool:
    fd = _folder(root_fd, path)
    if fd is None:
        return False
    try:
        return _holds_git(fd)
    finally:
        os.close(fd)


def absent(root_fd: int, paths: Sequence[str]) -> list[str]:
    """Those of ``paths`` that have no ``.git`` now."""
    return [p for p in paths if not _has_git(root_fd, p)]


def neutralise_new(root_fd: int, paths: Sequence[str]) -> list[str]:
    """After a call: each ``.git`` that appeared in one of ``paths`` (registered submodules that
    had none) is renamed aside; what was done, one sentence each."""
    done: list[str] = []
    for path in paths:
        fd = _folder(root_fd, path)
        if fd is None:
            continue
        try:
            if not _holds_git(fd):
                continue
            aside = f".git.nexo-disabled-{secrets.token_hex(4)}"
            os.rename(".git", aside, src_dir_fd=fd, dst_dir_fd=fd)
            done.append(f"the command gave the submodule {path!r}, which the root repository registers but was "
                        f"never checked out, a .git that git run at the root would use: it was renamed to {path}/{aside}")
        except OSError as exc:
            done.append(f"the command gave the submodule {path!r} a .git that could not be renamed aside ({exc}): "
                        "do not run git at the root before removing it")
        finally:
            os.close(fd)
    return done


__all__ = ["absent", "neutralise_new", "parse_index", "registered"]
