"""An in-memory tree: the default sandbox. No shell; nothing on disk is ever touched."""

from __future__ import annotations

import fnmatch
import hashlib
import time
from typing import Any

from ..errors import SecurityError
from .base import (
    DEFAULT_PROTECTED,
    FileRead,
    GlobResult,
    Sandbox,
    StaleWrite,
)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


class VirtualSandbox(Sandbox):
    kind = "virtual"
    can_write = True
    can_shell = False

    def __init__(
        self, files: dict[str, str | bytes] | None = None, *, protected: tuple[str, ...] = DEFAULT_PROTECTED
    ) -> None:
        self.protected = tuple(protected)
        self.files: dict[str, bytes] = {}
        for path, content in (files or {}).items():
            self.files[self.normalize(path)] = (
                content.encode("utf-8", "surrogateescape") if isinstance(content, str) else content
            )

    def read(self, path: str, max_bytes: int) -> FileRead:
        rel = self.normalize(path)
        if rel not in self.files:
            if any(name.startswith(rel + "/") for name in self.files):
                raise IsADirectoryError(rel)
            raise FileNotFoundError(rel)
        data = self.files[rel]
        return FileRead(rel, data[:max_bytes], len(data), len(data) > max_bytes, _digest(data))

    def version(self, path: str) -> str | None:
        data = self.files.get(self.normalize(path))
        return None if data is None else _digest(data)

    def write(self, path: str, data: bytes, *, expected_version: str | None) -> str:
        rel = self.check_writable(path)
        if self.version(rel) != expected_version:
            raise StaleWrite(rel)
        if any(name.startswith(rel + "/") for name in self.files):
            raise IsADirectoryError(rel)
        self.files[rel] = bytes(data)
        return _digest(self.files[rel])

    def glob(self, pattern: str, *, max_entries: int, max_depth: int, timeout: float) -> GlobResult:
        if "\x00" in pattern or ".." in pattern.split("/") or pattern.startswith(("/", "~")):
            raise SecurityError(f"glob pattern {pattern!r} leaves the sandbox")
        deadline = time.monotonic() + timeout
        found: list[str] = []
        for name in sorted(self.files):
            if time.monotonic() > deadline:
                return GlobResult(found, True, "time limit")
            if name.count("/") >= max_depth:
                continue
            if _glob_match(name, pattern):
                found.append(name)
                if len(found) >= max_entries:
                    return GlobResult(found, True, f"more than {max_entries} entries")
        return GlobResult(found, False)

    def spec(self) -> dict[str, Any]:
        return {
            "kind": "virtual",
            "files": {k: v.decode("utf-8", "surrogateescape") for k, v in self.files.items()},
            "protected": list(self.protected),
        }


def _glob_match(name: str, pattern: str) -> bool:
    """``*`` stays within one directory; ``**/`` matches any number of directories."""
    return _match_parts(name.split("/"), [p for p in pattern.split("/") if p not in ("", ".")])


def _match_parts(parts: list[str], pats: list[str]) -> bool:
    if not pats:
        return not parts
    if pats[0] == "**":
        return any(_match_parts(parts[i:], pats[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pats[0]) and _match_parts(parts[1:], pats[1:])
