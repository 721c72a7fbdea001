"""``read``, ``glob``, ``write``: the file tools, over whatever sandbox the run has."""

from __future__ import annotations

from typing import Any

from ..errors import SecurityError
from ..sandboxes.base import Sandbox, StaleWrite, normalize_relative
from .base import Tool, ToolContext, error


def _read(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    cap = ctx.limits.read_max_bytes
    try:
        got = ctx.sandbox.read(args["path"], cap)
    except FileNotFoundError:
        return error(f"read: no file {args['path']!r}")
    except IsADirectoryError:
        return error(f"read: {args['path']!r} is a directory; use glob to list it")
    text = got.data.decode("utf-8", errors="replace")
    result: dict[str, Any] = {"path": got.path, "size": got.size, "version": got.version}
    if got.truncated:
        text += f"\n[... truncated: showed {len(got.data)} of {got.size} bytes]"
    result["content"] = text
    result["truncated"] = got.truncated
    ctx.versions[got.path] = got.version
    return result


def _glob(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    limits = ctx.limits
    found = ctx.sandbox.glob(
        args["pattern"],
        max_entries=limits.glob_max_entries,
        max_depth=limits.glob_max_depth,
        timeout=limits.glob_timeout,
    )
    result: dict[str, Any] = {"pattern": args["pattern"], "matches": found.paths, "truncated": found.truncated}
    if found.truncated:
        result["note"] = f"stopped early: {found.reason}"
    return result


def _write(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    path = args["path"]
    rel = ctx.sandbox.normalize(path)
    current = ctx.sandbox.version(path)
    approved = ctx.approved_version
    if approved is not None:
        if (current or "") != approved:
            what = "was created" if not approved else ("was removed" if current is None else "changed")
            return error(
                f"write: {rel!r} {what} after the approver saw it (when the approval was made); nothing was "
                "written. Read it again, then propose the write again"
            )
    elif current is not None:
        seen = ctx.versions.get(rel)
        if seen is None:
            return error(f"write: {rel!r} exists; read it before overwriting it")
        if seen != current:
            return error(f"write: {rel!r} changed since you read it; read it again before writing")
    data = args["content"].encode("utf-8")
    try:
        version = ctx.sandbox.write(path, data, expected_version=current)
    except StaleWrite:
        return error(f"write: {rel!r} changed while writing; read it again")
    except IsADirectoryError:
        return error(f"write: {rel!r} is a directory")
    ctx.versions[rel] = version
    return {"path": rel, "bytes_written": len(data), "created": current is None, "version": version}


def gate_path(sandbox: Sandbox, path: Any) -> Any:
    """What the gate sees of a file path: the sandbox's normalised path, rooted at ``/``
    (``./notes//a.txt`` is ``/notes/a.txt``). A path the sandbox refuses is passed as given:
    should the gate let the call through, it fails with ``SecurityError`` when it runs."""
    try:
        return "/" + sandbox.normalize(path)
    except SecurityError:
        return path


class PathTool(Tool):
    """A tool whose ``path`` argument names a file in the sandbox (``read``, ``write``).

    Its arguments carry the normalised path from validation on, so the inbox, the audit and the
    call that runs see one path; the gate (``ask_when``, ``on_ask``) sees it rooted:
    ``/notes/a.txt``."""

    def validate(self, args: Any) -> dict[str, Any]:
        args = super().validate(args)
        try:
            path = normalize_relative(args["path"])
        except SecurityError:
            return args  # refused, loudly and audited, when the call runs
        return {**args, "path": path}

    def detail(self, args: dict[str, Any]) -> Any:
        try:
            return "/" + normalize_relative(args["path"])
        except (KeyError, SecurityError):
            return args.get("path")

    def gate(self, args: dict[str, Any], ctx: ToolContext) -> None:
        ctx.permissions.authorize(self.capability, gate_path(ctx.sandbox, args.get("path")))


READ = PathTool(
    "read",
    "Read a text file in the workspace. Large files are cut at a byte cap and say so.",
    {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "Path relative to the workspace."}},
        "required": ["path"],
        "additionalProperties": False,
    },
    capability="read",
    idempotent=True,
    run=_read,
)

GLOB = Tool(
    "glob",
    "List files matching a glob pattern (`*` within a folder, `**` across folders).",
    {
        "type": "object",
        "properties": {"pattern": {"type": "string", "description": "For example `**/*.py`."}},
        "required": ["pattern"],
        "additionalProperties": False,
    },
    capability="glob",
    idempotent=True,
    run=_glob,
    detail=lambda args: args.get("pattern"),
)

WRITE = PathTool(
    "write",
    "Create or replace a text file. An existing file must be read first; "
    "the write is refused if it changed since.",
    {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Path relative to the workspace."},
            "content": {"type": "string", "description": "The whole new content."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    capability="write",
    idempotent=False,
    run=_write,
)
