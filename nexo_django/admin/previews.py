"""What a pending call would do, for its decision page: the workspace it acts in and, for a
``write``, the difference from the file as it is now. Read through the run's own sandbox, so a
path the model made up never reads outside the workspace; everything shown is escaped."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from django.utils.safestring import SafeString

from ..core.errors import NexoError, SecurityError
from ..core.sandboxes import Sandbox
from ..display import reveal
from ..durable.runs import build_agent
from ..models import AgentRun, ToolCall

#: Bytes of the current file (and of the proposed content) compared; the rest is not shown.
DIFF_MAX_BYTES = 256 * 1024
#: Lines of diff shown at most.
DIFF_MAX_LINES = 500


@dataclass
class CallPreview:
    workspace: str  # where the call acts, in words
    kind: str = ""  # "new" | "changed" | "unchanged" | "unavailable" | "" (not a write)
    diff: list[tuple[str, SafeString]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was capped, why nothing is shown
    #: the version of the file the diff was made from ("": no file), None when nothing was read;
    #: the page posts it with Approve, binding the approval to it
    version: str | None = None


def describe_workspace(sandbox: Sandbox) -> str:
    if sandbox.kind == "local":
        return f"the folder {getattr(sandbox, 'root', '?')} on the worker's machine"
    if sandbox.kind == "virtual":
        return "an in-memory tree stored with the run (nothing on disk)"
    return f"a {sandbox.kind or type(sandbox).__name__} sandbox"


def _text(data: bytes, what: str, notes: list[str]) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        notes.append(f"{what} is not valid UTF-8; undecodable bytes are shown as \N{REPLACEMENT CHARACTER}.")
        return data.decode("utf-8", errors="replace")


def _capped(text: str, what: str, notes: list[str]) -> str:
    data = text.encode("utf-8")
    if len(data) <= DIFF_MAX_BYTES:
        return text
    notes.append(f"{what} is {len(data):,} bytes: only the first {DIFF_MAX_BYTES // 1024} KiB are compared.")
    return data[:DIFF_MAX_BYTES].decode("utf-8", errors="ignore")


def write_diff(sandbox: Sandbox, path: Any, content: Any) -> CallPreview:
    preview = CallPreview(describe_workspace(sandbox))
    if not isinstance(path, str) or not isinstance(content, str):
        preview.kind = "unavailable"
        preview.notes.append("The arguments are not a path and a text, so there is nothing to compare.")
        return preview
    old_name = path
    try:
        current = sandbox.read(path, DIFF_MAX_BYTES)
    except FileNotFoundError:
        preview.kind, old, old_name, preview.version = "new", "", "/dev/null", ""
    except (SecurityError, OSError, NexoError) as exc:
        preview.kind = "unavailable"
        preview.notes.append(f"The current file cannot be read: {exc}")
        return preview
    else:
        if current.truncated:
            preview.notes.append(
                f"The current file is {current.size:,} bytes: only the first {DIFF_MAX_BYTES // 1024} KiB are compared."
            )
        old = _text(current.data, "The current file", preview.notes)
        preview.kind, preview.version = "changed", current.version
    new = _capped(content, "The proposed content", preview.notes)
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, path, lineterm="", n=3))
    if preview.kind == "changed" and not lines:
        preview.kind = "unchanged"
    body = [line for line in lines if not line.startswith(("---", "+++"))]
    if len(body) > DIFF_MAX_LINES:
        preview.notes.append(f"The diff has {len(body):,} lines: the first {DIFF_MAX_LINES} are shown.")
        body = body[:DIFF_MAX_LINES]
    preview.diff = [(line[:1] if line[:1] in "+-@" else " ", reveal(line, keep="")) for line in body]
    return preview


def call_preview(run: AgentRun, call: ToolCall) -> CallPreview:
    """The workspace of ``call`` and, for a ``write``, its diff. Never raises: what cannot be
    worked out is said in ``notes``."""
    try:
        agent = build_agent(run)
    except Exception as exc:  # an agent that no longer imports must not hide the decision page
        return CallPreview(f"unknown: the agent cannot be rebuilt ({type(exc).__name__}: {exc})", "unavailable")
    try:
        if call.capability == "write" and call.name == "write" and isinstance(call.args, dict):
            return write_diff(agent.workspace, call.args.get("path"), call.args.get("content"))
        return CallPreview(describe_workspace(agent.workspace))
    finally:
        agent.close()
