"""What a pending call would do, for its decision page: the workspace it acts in and, for a
``write``, the difference from the file as it is now. Read through the run's own sandbox, so a
path the model made up never reads outside the workspace; everything shown is escaped."""

from __future__ import annotations

import difflib
import html
import re
from dataclasses import dataclass, field
from typing import Any

from django.utils.html import format_html, strip_tags
from django.utils.safestring import SafeString

from ..bounded import bounded_text
from ..core.errors import NexoError, SecurityError
from ..core.sandboxes import Sandbox
from ..durable.runs import build_agent
from ..models import AgentRun, ToolCall
from . import loading

#: Bytes of the current file (and of the proposed content) compared; the rest is not shown.
DIFF_MAX_BYTES = 256 * 1024
#: Lines of diff shown at most.
DIFF_MAX_LINES = 500
#: Characters and HTML bytes of one diff line shown; HTML bytes of the whole diff.
LINE_CHARS = 2_000
LINE_BYTES = 16_000
DIFF_MAX_HTML = 200_000


@dataclass
class CallPreview:
    workspace: str  # where the call acts, in words
    # "new" | "changed" | "unchanged" (every byte equal) | "same_prefix" (equal as far as compared,
    # the rest not compared) | "unavailable" | "" (not a write)
    kind: str = ""
    diff: list[tuple[str, SafeString]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was capped, why nothing is shown
    confinement: str = ""  # for a shell call: what the command will run under, and may reach
    #: the version of the file the diff was made from ("": no file), None when nothing was read;
    #: the page posts it with Approve, binding the approval to it
    version: str | None = None


def describe_workspace(sandbox: Sandbox) -> str:
    if sandbox.kind == "local":
        return f"the folder {getattr(sandbox, 'root', '?')} on the worker's machine"
    if sandbox.kind == "virtual":
        return "an in-memory tree stored with the run (nothing on disk)"
    return f"a {sandbox.kind or type(sandbox).__name__} sandbox"


def describe_confinement(sandbox: Sandbox) -> str:
    describe = getattr(sandbox, "describe_shell", None)
    if callable(describe):
        return str(describe())
    return f"the {sandbox.kind or type(sandbox).__name__} sandbox runs no shell command" if not sandbox.can_shell else "unknown"


_UNDECODED = re.compile("[\udc80-\udcff]")


def _text(data: bytes) -> str:
    # Undecodable bytes become lone surrogates (U+DC80-U+DCFF), which the page shows as markers
    # naming each byte: two different invalid bytes never look the same.
    return data.decode("utf-8", errors="surrogateescape")


def _lines(text: str) -> list[str]:
    """Lines split at ``\n`` only, each keeping its ending: a CR, a ``\v``, a U+2028 stay inside
    the line (and are shown), so texts whose bytes differ never diff as equal."""
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def _shown_line(line: str) -> SafeString:
    kind = line[:1] if line[:1] in "+-@" else " "
    body = line[1:] if kind != "@" else line
    if kind != "@" and body.endswith("\n"):
        return bounded_text(kind + body[:-1], keep="", budget=LINE_BYTES, chars=LINE_CHARS).html
    if kind == "@":
        return bounded_text(line.rstrip("\n"), keep="", budget=LINE_BYTES, chars=LINE_CHARS).html
    # The last line of a text without a final newline: said, since it is a difference in bytes.
    text = bounded_text(kind + body, keep="", budget=LINE_BYTES, chars=LINE_CHARS).html
    return format_html('{}<span class="nexo-clipped"> ⟦no newline at end of file⟧</span>', text)


def _first_difference(old: bytes, new: bytes) -> int:
    for index, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            return index
    return min(len(old), len(new))


def write_diff(sandbox: Sandbox, path: Any, content: Any, *, content_chars: int | None = None) -> CallPreview:
    """The difference ``write(path, content)`` would make. ``content_chars`` is the full length
    of a content given cut (its first characters only): past the cut nothing is called equal."""
    preview = CallPreview(describe_workspace(sandbox))
    if not isinstance(path, str) or not isinstance(content, str):
        preview.kind = "unavailable"
        preview.notes.append("The arguments are not a path and a text, so there is nothing to compare.")
        return preview
    old_name = path
    cut = False  # whether either side was compared only in part
    try:
        current = sandbox.read(path, DIFF_MAX_BYTES)
    except FileNotFoundError:
        preview.kind, old_bytes, old_name, preview.version = "new", b"", "/dev/null", ""
    except (SecurityError, OSError, NexoError) as exc:
        preview.kind = "unavailable"
        preview.notes.append(f"The current file cannot be read: {exc}")
        return preview
    else:
        old_bytes = current.data[:DIFF_MAX_BYTES]
        if current.truncated or len(current.data) > DIFF_MAX_BYTES:
            cut = True
            preview.notes.append(
                f"The current file is {current.size:,} bytes: only the first {DIFF_MAX_BYTES // 1024} KiB are compared."
            )
        preview.kind, preview.version = "changed", current.version
    new_bytes = content.encode("utf-8", errors="surrogatepass")
    given_cut = content_chars is not None and content_chars > len(content)
    if len(new_bytes) > DIFF_MAX_BYTES or given_cut:
        cut = True
        size = f"{content_chars:,} characters" if given_cut else f"{len(new_bytes):,} bytes"
        preview.notes.append(
            f"The proposed content is {size}: only the first {DIFF_MAX_BYTES // 1024} KiB are compared."
        )
        new_bytes = new_bytes[:DIFF_MAX_BYTES]
    if preview.kind == "changed" and old_bytes == new_bytes:
        # Equal bytes, and nothing past a cut: only then is the file said to be unchanged.
        preview.kind = "same_prefix" if cut else "unchanged"
        return preview
    old, new = _text(old_bytes), _text(new_bytes)
    if _UNDECODED.search(old) or _UNDECODED.search(new):
        preview.notes.append(
            "Some bytes are not valid UTF-8: each is shown as ⟦U+DCxx⟧, where xx is the byte in hex."
        )
    lines = list(difflib.unified_diff(_lines(old), _lines(new), old_name, path, n=3))
    body = [line for line in lines if not line.startswith(("---", "+++"))]
    if preview.kind == "changed" and not body:
        # A safety net: whatever the decoding did, different bytes are never called equal.
        preview.notes.append(
            f"The bytes differ (first at byte {_first_difference(old_bytes, new_bytes):,}) in a way no line shows."
        )
    if len(body) > DIFF_MAX_LINES:
        preview.notes.append(f"The diff has {len(body):,} lines: the first {DIFF_MAX_LINES} are shown.")
        body = body[:DIFF_MAX_LINES]
    shown: list[tuple[str, SafeString]] = []
    left = DIFF_MAX_HTML
    for line in body:
        html = _shown_line(line)
        left -= len(html)
        if left < 0:
            preview.notes.append(f"The diff is long: {len(shown):,} of its {len(body):,} lines are shown.")
            break
        shown.append((line[:1] if line[:1] in "+-@" else " ", html))
    preview.diff = shown
    return preview


def call_preview(run: AgentRun, call: ToolCall) -> CallPreview:
    """The workspace of ``call`` and, for a ``write``, its diff. Never raises: what cannot be
    worked out is said in ``notes``."""
    try:
        agent = build_agent(run)
    except Exception as exc:  # an agent that no longer imports must not hide the decision page
        return CallPreview(f"unknown: the agent cannot be rebuilt ({type(exc).__name__}: {exc})", "unavailable")
    try:
        if call.capability != "write" or call.name != "write":
            preview = CallPreview(describe_workspace(agent.workspace))
            if call.capability == "shell":
                preview.confinement = describe_confinement(agent.workspace)
            return preview
        if "args" in call.get_deferred_fields():
            # The page that loaded the arguments by size says it; else the database is asked.
            size = getattr(call, "nexo_args_size", None) or loading.json_size(ToolCall, call.pk, "args")
            if size > loading.BIG_JSON:
                # Reading tens of megabytes to diff their first 256 KiB would be most of the page's
                # time: said instead, and never called unchanged.
                return CallPreview(describe_workspace(agent.workspace), "unavailable", notes=[
                    f"The arguments are {size:,} bytes of JSON: too large to compare on this page; "
                    "download them to read the content."
                ])
        if isinstance(call.args, dict):
            return write_diff(agent.workspace, call.args.get("path"), call.args.get("content"))
        return CallPreview(describe_workspace(agent.workspace))
    finally:
        agent.close()


def preview_text(call: ToolCall) -> str:
    """:func:`call_preview` as plain text: what a reviewer agent is sent (durable.policy.reviewer)."""
    preview = call_preview(call.run, call)
    lines = [f"workspace: {preview.workspace}", *preview.notes]
    lines += [html.unescape(strip_tags(line)) for _, line in preview.diff]
    return "\n".join(lines)
