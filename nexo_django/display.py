"""Showing model-produced text to a person: escaped, with invisible and bidi characters made visible.

Everything the model wrote (arguments, transcript, results) is untrusted. These helpers escape it
first and only then insert markers of our own, so what is returned is safe HTML whose every
character of model text is shown literally: a right-to-left override appears as ``⟦U+202E⟧``, not
as reversed text.
"""

from __future__ import annotations

import difflib
import json
import unicodedata
from typing import Any

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

#: Characters that render as nothing (or nearly) but are neither format nor control characters.
_INVISIBLE_EXTRA = frozenset(
    {0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x2800, 0x3164, 0xFFA0}
    | set(range(0xFE00, 0xFE10))  # variation selectors: data can hide in them
    | set(range(0xE0100, 0xE01F0))  # variation selectors supplement
)
# Cf holds the bidi controls (U+202A-E, U+2066-9, U+061C, U+200E/F), zero-width characters
# (U+200B-D, U+2060, U+FEFF), soft hyphen and tag characters; Cc the C0/C1 controls.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"})


def is_hidden(char: str, *, keep: str = "") -> bool:
    """Whether a character would be invisible, look like another, or reorder text around it."""
    if char in keep:
        return False
    category = unicodedata.category(char)
    if category in _HIDDEN_CATEGORIES:
        return True
    if category == "Zs":
        return char != " "
    return ord(char) in _INVISIBLE_EXTRA


def count_hidden(text: str, *, keep: str = "\n\t") -> int:
    return sum(1 for c in text if is_hidden(c, keep=keep))


def marker(char: str) -> SafeString:
    code = f"U+{ord(char):04X}"
    name = unicodedata.name(char, "unnamed character").title()
    return format_html('<span class="nexo-hidden-char" title="{} {}">⟦{}⟧</span>', code, name, code)


def reveal(text: Any, *, keep: str = "\n\t") -> SafeString:
    """Escape ``text`` and replace every hidden character with a visible marker."""
    text = "" if text is None else str(text)
    parts: list[str] = []
    start = 0
    for index, char in enumerate(text):
        if is_hidden(char, keep=keep):
            parts.append(escape(text[start:index]))
            parts.append(marker(char))
            start = index + 1
    parts.append(escape(text[start:]))
    # Every piece of ``text`` went through escape(); the markers are our own markup.
    return mark_safe("".join(parts))  # noqa: S308


def mark_hidden(text: Any, *, keep: str = "") -> str:
    """Plain text with hidden characters replaced by ``⟦U+XXXX⟧``, for places that take no HTML
    (page titles, messages built from exception text). Still to be escaped by the template."""
    return "".join(f"⟦U+{ord(c):04X}⟧" if is_hidden(c, keep=keep) else c for c in str(text))


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def reveal_json(value: Any) -> SafeString:
    # json.dumps already writes C0 controls (newlines included) as escapes inside strings.
    return reveal(pretty_json(value), keep="\n")


def json_for_editor(value: Any) -> str:
    """Pretty JSON whose hidden characters are written as ``\\uXXXX`` escapes: still valid JSON,
    and an approver editing it in a plain textarea sees them."""
    out: list[str] = []
    for char in pretty_json(value):
        if char != "\n" and is_hidden(char):
            code = ord(char)
            if code > 0xFFFF:
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def preview(value: Any, limit: int = 80) -> SafeString:
    """A one-line, shortened view of a JSON value for changelists."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return reveal(text, keep="")


def long_strings(args: Any, min_lines: int = 2) -> list[tuple[str, SafeString]]:
    """Top-level string arguments with several lines (file content, a script), shown as text."""
    if not isinstance(args, dict):
        return []
    return [
        (str(key), reveal(value))
        for key, value in args.items()
        if isinstance(value, str) and value.count("\n") + 1 >= min_lines
    ]


def message_view(data: dict[str, Any]) -> dict[str, Any]:
    """One transcript message as safe pieces for a template."""
    content = data.get("content")
    view: dict[str, Any] = {
        "role": str(data.get("role", "")),
        "name": reveal(data.get("name") or ""),
        "text": None,
        "json": None,
        "calls": [],
    }
    if isinstance(content, str):
        view["text"] = reveal(content)
    elif content is not None:
        view["json"] = reveal_json(content)
    for call in data.get("tool_calls") or ():
        view["calls"].append(
            {"id": reveal(call.get("id", "")), "name": reveal(call.get("name", "")),
             "args": reveal_json(call.get("args"))}
        )
    return view


def json_diff(old: Any, new: Any) -> list[tuple[str, SafeString]]:
    """Line diff of two JSON values: ``(kind, line)`` with kind ``"+"``, ``"-"``, ``" "`` or ``"@"``."""
    lines = difflib.unified_diff(
        json_for_editor(old).splitlines(), json_for_editor(new).splitlines(), "stored", "edited",
        lineterm="", n=3,
    )
    out: list[tuple[str, SafeString]] = []
    for line in lines:
        if line.startswith(("---", "+++")):
            continue
        kind = line[:1] if line[:1] in "+- @" else " "
        out.append((kind, reveal(line, keep="")))
    return out
