"""Where tools act. A sandbox reads, lists and writes files under one root, and maybe runs shell.

Pure Python, no Django import. Paths given to a sandbox are untrusted model input: a path that
tries to leave the root raises :class:`~nexo_django.errors.SecurityError`.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from ..errors import SecurityError

#: Names never written, matched on the normalised relative path (fnmatch patterns).
DEFAULT_PROTECTED: tuple[str, ...] = (
    ".git/hooks/*",
    ".git/config",
    ".bashrc",
    ".bash_profile",
    ".profile",
    ".zshrc",
    ".zprofile",
    ".bash_login",
    ".envrc",
)


MAX_PATH_CHARS = 4096
MAX_NAME_CHARS = 255


#: paths :func:`normalize_relative` accepted -> their normal form (a pure function of the text:
#: a call's path is normalised about ten times between the model's reply and its result)
_normal: dict[str, str] = {}
NORMAL_KEPT = 4096


def normalize_relative(path: str) -> str:
    """The one place a model's path becomes ``a/b/c`` relative to a sandbox root, or is refused:
    empty, NUL bytes, absolute or ``~``, ``..`` anywhere, the root itself, a trailing ``/`` or
    ``/.``, over-long names and paths, names that are not valid file-name text. (Confinement itself is enforced by each
    sandbox on what it opens; this only refuses what can never be right.)"""
    if type(path) is not str:  # refused, or a subclass of str: not kept
        return _normalize_relative(path)
    normal = _normal.get(path)
    if normal is None:
        normal = _normalize_relative(path)
        if len(_normal) >= NORMAL_KEPT:
            _normal.clear()
        _normal[path] = normal
    return normal


def _normalize_relative(path: str) -> str:
    if not isinstance(path, str) or not path:
        raise SecurityError("a path must be a non-empty string")
    if "\x00" in path:
        raise SecurityError(f"path {path!r} contains a NUL byte")
    if len(path) > MAX_PATH_CHARS:
        raise SecurityError(f"path is longer than {MAX_PATH_CHARS} characters")
    if path.startswith(("/", "~")):
        raise SecurityError(f"path {path!r} is absolute; paths are relative to the sandbox root")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SecurityError(f"path {path!r} contains '..'; paths stay inside the sandbox")
    if not parts:
        raise SecurityError(f"path {path!r} names the sandbox root, not a file")
    if path.rsplit("/", 1)[-1] in ("", "."):
        # "app.py/" and "app.py/." name a folder; a gate predicate on "app.py" must not be
        # sidestepped by a spelling the file system would read as the file.
        raise SecurityError(f"path {path!r} ends with '/' or '/.'; name the file without it")
    for part in parts:
        try:
            encoded = os.fsencode(part)
        except UnicodeEncodeError as exc:
            raise SecurityError(f"path {path!r} is not valid text for a file name") from exc
        if len(part) > MAX_NAME_CHARS or len(encoded) > MAX_NAME_CHARS:
            raise SecurityError(f"a name in {path!r} is longer than {MAX_NAME_CHARS} bytes")
    return "/".join(parts)


@dataclass(frozen=True)
class FileRead:
    path: str  # normalised, relative to the root
    data: bytes  # at most the byte cap
    size: int  # the file's size when read
    truncated: bool
    version: str  # opaque; changes when the file changes


@dataclass(frozen=True)
class GlobResult:
    paths: list[str]  # normalised, relative, sorted
    truncated: bool
    reason: str = ""  # why it stopped early, if it did


#: (protected patterns, normalised path) that matched none of the patterns
_unprotected: set[tuple[tuple[str, ...], str]] = set()


class Sandbox(ABC):
    kind: str = ""
    can_write: bool = True
    can_shell: bool = False
    protected: tuple[str, ...] = DEFAULT_PROTECTED

    def check_writable(self, path: str) -> str:
        """Normalise ``path`` and refuse protected names; ``SecurityError`` otherwise."""
        rel = self.normalize(path)
        if any(part.casefold() == ".git" for part in rel.split("/")):
            # Whatever the protected list says: a hook, a config (core.fsmonitor, core.pager),
            # or a ".git" file pointing elsewhere runs code the next time someone uses git,
            # in any repository nested anywhere in the workspace. casefold: ".GIT" is ".git"
            # on a case-insensitive file system.
            raise SecurityError(f"{rel!r} is inside a .git folder (or is one) and is never written")
        protected = self.protected
        if (protected, rel) in _unprotected:
            return rel
        for pattern in protected:
            if fnmatch.fnmatchcase(rel, pattern) or fnmatch.fnmatchcase(posixpath.basename(rel), pattern):
                raise SecurityError(f"{rel!r} is a protected name ({pattern}) and is never written")
        if type(protected) is tuple:  # hashable, and fixed: its verdict on this path is kept
            if len(_unprotected) >= NORMAL_KEPT:
                _unprotected.clear()
            _unprotected.add((protected, rel))
        return rel

    def normalize(self, path: str) -> str:
        """The relative, normalised form of ``path``; ``SecurityError`` if it leaves the root."""
        return normalize_relative(path)

    @abstractmethod
    def read(self, path: str, max_bytes: int) -> FileRead:
        """Read a regular file, at most ``max_bytes`` bytes. ``FileNotFoundError`` if absent."""

    @abstractmethod
    def version(self, path: str) -> str | None:
        """The file's current version, or ``None`` when there is no such file."""

    @abstractmethod
    def write(self, path: str, data: bytes, *, expected_version: str | None) -> str:
        """Replace the file atomically and return its new version. ``expected_version`` is the
        version the caller saw (``None``: the file must not exist); a mismatch raises
        :class:`StaleWrite`."""

    @abstractmethod
    def glob(self, pattern: str, *, max_entries: int, max_depth: int, timeout: float) -> GlobResult:
        """Files matching ``pattern`` (``**`` crosses directories), bounded."""

    def shell(self, command: str, *, timeout: float, max_output: int) -> dict[str, Any]:
        return {"error": f"the {self.kind} sandbox has no shell"}

    @abstractmethod
    def spec(self) -> dict[str, Any]:
        """JSON that rebuilds this sandbox in another process (see :func:`from_spec`)."""


class StaleWrite(Exception):
    """The file changed between the read the model saw and the write."""
