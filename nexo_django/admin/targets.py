"""What a call acts on, named first wherever an approver scans calls (the inbox's rows): the file
of a file tool, the command of ``shell``, the host of ``fetch``, the server and tool of an MCP
tool. The argument dump comes after it: cut to a line, it may never reach the path (a ``write``
whose ``content`` comes first)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ..core.mcp import SEPARATOR

#: Characters of a target shown in a row (the decision page shows all of it).
TARGET_CHARS = 200

#: The argument that names each built-in tool's target, and what it is called.
TARGET_ARGS = {"read": ("path", "file"), "write": ("path", "file"), "glob": ("pattern", "files"),
               "shell": ("command", "command"), "fetch": ("url", "host"), "search": ("query", "search")}


def call_target(name: str, capability: str, args: Any, server: str = "") -> tuple[str, str]:
    """``(kind, target)`` of a call: ``("file", "notes/a.txt")``, ``("host", "example.com")``,
    ``("mcp", "github: create_issue")``; ``("", "")`` when it names none."""
    if capability == "mcp":
        if not server and SEPARATOR in name:
            server, name = name.split(SEPARATOR, 1)
        return "mcp", f"{server}: {name}" if server else name
    key, kind = TARGET_ARGS.get(name, ("", ""))
    value = args.get(key) if key and isinstance(args, dict) else None
    if not isinstance(value, str):
        return "", ""
    if name == "fetch":
        try:
            host = urlsplit(value.strip()).hostname
        except ValueError:
            host = None
        return (kind, host) if host else ("url", value)
    return kind, value


def short(target: str) -> str:
    return target if len(target) <= TARGET_CHARS else target[: TARGET_CHARS - 1] + "…"
