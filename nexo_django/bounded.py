"""What a page shows of a value the model produced: escaped, hidden characters made visible, and
never more than a budget of HTML, whatever the value's size.

A model can send a 50 MB argument, 300 kB of zero-width characters (each would become a marker
of some 80 bytes) or JSON nested thousands of levels deep (each level indents every line below
it). Every piece here stops at its budget and says, in markup of our own (never inside the
model's text, where it could be imitated), what it left out; the full value is one click away,
on a view that sends it as a download.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from .display import is_hidden, marker

#: HTML bytes of one block (the arguments, one transcript message, one diff).
BLOCK_BYTES = 160_000
#: Characters of one string shown inside a JSON value.
STRING_CHARS = 8_000
#: Levels of nesting shown; deeper values are summarised.
DEPTH = 12
#: Items of one list or object shown.
ITEMS = 200
INDENT = "  "


#: Characters checked at once for hidden ones (at C speed) before looking one by one.
CHUNK = 64


def _clean(text: str, keep: str = "") -> bool:
    """Whether ``text`` holds no hidden character (``keep`` aside), decided at C speed:
    ``str.isprintable`` is false exactly for the categories ``display.is_hidden`` names, and the
    few invisible characters it prints are one regular-expression class."""
    for char in keep:
        if char in text:
            text = text.replace(char, "")
    return text.isprintable() and (text.isascii() or not _EXTRA.search(text))


class _Full(Exception):
    """The block's budget is spent."""


@dataclass
class Shown:
    html: SafeString
    clipped: bool  # something was left out: say so and offer the full value


def _omitted(text: str) -> str:
    return str(format_html('<span class="nexo-clipped">{}</span>', text))


class _Writer:
    def __init__(self, budget: int, keep: str) -> None:
        self.parts: list[str] = []
        self.left = budget
        self.keep = keep
        self.clipped = False
        self.full = False

    def _put(self, html: str) -> None:
        if len(html) > self.left:
            self.clipped = self.full = True
            raise _Full
        self.parts.append(html)
        self.left -= len(html)

    def mark(self, text: str) -> None:
        """Markup of our own: what was left out."""
        self.clipped = True
        self._put(_omitted(text))

    def text(self, text: str) -> None:
        """Model text: escaped; a run of one hidden character becomes one marker with a count."""
        # Every character is at least one byte of HTML: what lies past the budget is never looked at.
        text = text[: self.left + 1]
        start = index = 0
        size = len(text)
        while index < size:
            end = min(size, index + CHUNK)
            if _clean(text[index:end], self.keep):
                index = end  # the common case, at C speed: no hidden character in this stretch
                continue
            char = text[index]
            if not is_hidden(char, keep=self.keep):
                index += 1
                continue
            if start < index:
                self._plain(text[start:index])
            run = index + 1
            while run < size and text[run] == char:
                run += 1
            count = run - index
            self._put(str(marker(char)) + (f"<small>×{count:,}</small>" if count > 1 else ""))
            start = index = run
        if start < size:
            self._plain(text[start:])

    def _plain(self, text: str) -> None:
        html = str(escape(text))
        if len(html) <= self.left:
            self._put(html)
            return
        # Cut inside the text: as much as fits, on a character boundary of the escaped form.
        fit = text[: max(0, self.left // 6)]
        self.parts.append(str(escape(fit)))
        self.left = 0
        self.clipped = self.full = True
        raise _Full

    def html(self, rest: str | None) -> Shown:
        if rest is not None and self.full:
            self.parts.append(_omitted(rest))
        # Every piece of model text went through escape(); the rest is our own markup.
        return Shown(mark_safe("".join(self.parts)), self.clipped)  # noqa: S308


def bounded_text(value: Any, *, budget: int = BLOCK_BYTES, keep: str = "\n\t", chars: int | None = None) -> Shown:
    """``value`` as text, at most ``budget`` bytes of HTML (and ``chars`` characters of it)."""
    text = "" if value is None else str(value)
    writer = _Writer(budget, keep)
    try:
        if chars is not None and len(text) > chars:
            writer.text(text[:chars])
            writer.mark(f"… {len(text) - chars:,} more characters")
        else:
            writer.text(text)
    except _Full:
        pass
    return writer.html(f"… cut here: {len(text):,} characters in all")


def bounded_json(value: Any, *, budget: int = BLOCK_BYTES, string_chars: int = STRING_CHARS) -> Shown:
    """``value`` as indented JSON, at most ``budget`` bytes of HTML: long strings, long lists
    and deep nesting are cut where they are, with a note of what is missing."""
    writer = _Writer(budget, "\n")

    def walk(item: Any, depth: int) -> None:
        pad = INDENT * (depth + 1)
        if isinstance(item, dict):
            if not item:
                writer.text("{}")
                return
            if depth >= DEPTH:
                writer.mark(f"{{… {len(item):,} keys, nested too deep to show here}}")
                return
            writer.text("{\n")
            for number, (key, child) in enumerate(item.items()):
                if number >= ITEMS:
                    writer.text(pad)
                    writer.mark(f"… {len(item) - number:,} more keys")
                    writer.text("\n")
                    break
                writer.text(pad)
                string(str(key))
                writer.text(": ")
                walk(child, depth + 1)
                writer.text(",\n" if number < len(item) - 1 else "\n")
            writer.text(INDENT * depth + "}")
        elif isinstance(item, (list, tuple)):
            if not item:
                writer.text("[]")
                return
            if depth >= DEPTH:
                writer.mark(f"[… {len(item):,} items, nested too deep to show here]")
                return
            writer.text("[\n")
            for number, child in enumerate(item):
                if number >= ITEMS:
                    writer.text(pad)
                    writer.mark(f"… {len(item) - number:,} more items")
                    writer.text("\n")
                    break
                writer.text(pad)
                walk(child, depth + 1)
                writer.text(",\n" if number < len(item) - 1 else "\n")
            writer.text(INDENT * depth + "]")
        elif isinstance(item, str):
            string(item)
        else:
            writer.text(json.dumps(item, ensure_ascii=False, default=str))

    def string(text: str) -> None:
        if len(text) <= string_chars:
            writer.text(json.dumps(text, ensure_ascii=False))
            return
        writer.text(json.dumps(text[:string_chars], ensure_ascii=False)[:-1])
        writer.mark(f"… {len(text) - string_chars:,} more characters")
        writer.text('"')

    with contextlib.suppress(_Full):
        walk(value, 0)
    return writer.html("… the rest is not shown here")


#: HTML bytes of one transcript message on a page (a page shows up to ``transcript_limit``).
MESSAGE_BYTES = 12_000
#: Multi-line string arguments shown again as text, and the bytes of each.
LONG_STRINGS = 3
LONG_STRING_BYTES = 48_000


def message_view(data: dict[str, Any], *, budget: int = MESSAGE_BYTES) -> dict[str, Any]:
    """One transcript message as safe, bounded pieces for a template (``clipped`` says whether
    anything was left out)."""
    content = data.get("content")
    view: dict[str, Any] = {
        "role": str(data.get("role", "")),
        "name": bounded_text(data.get("name") or "", budget=400, chars=100).html,
        "text": None,
        "json": None,
        "calls": [],
        "clipped": False,
    }
    left = budget
    if isinstance(content, str):
        shown = bounded_text(content, budget=left)
        view["text"] = shown.html
    elif content is not None:
        shown = bounded_json(content, budget=left, string_chars=2_000)
        view["json"] = shown.html
    else:
        shown = Shown(mark_safe(""), False)  # noqa: S308
    view["clipped"] = shown.clipped
    left = max(2_000, left - len(shown.html))
    calls = data.get("tool_calls") or ()
    for number, call in enumerate(calls):
        if number >= 20 or left <= 0:
            view["more_calls"] = len(calls) - number
            view["clipped"] = True
            break
        args = bounded_json(call.get("args"), budget=left, string_chars=2_000)
        left -= len(args.html)
        view["clipped"] = view["clipped"] or args.clipped
        view["calls"].append({
            "id": bounded_text(call.get("id", ""), budget=400, chars=100).html,
            "name": bounded_text(call.get("name", ""), budget=400, chars=100).html,
            "args": args.html,
        })
    return view


def long_strings(args: Any, min_lines: int = 2) -> list[tuple[SafeString, Shown]]:
    """Top-level string arguments with several lines (file content, a script), shown as text:
    the first few, each bounded."""
    if not isinstance(args, dict):
        return []
    found = [
        (bounded_text(key, budget=400, chars=100).html, bounded_text(value, budget=LONG_STRING_BYTES))
        for key, value in args.items()
        if isinstance(value, str) and value.count("\n") + 1 >= min_lines
    ]
    return found[:LONG_STRINGS]


def _clip(value: Any, limit: int, depth: int = 0) -> Any:
    # Enough of a value for a one-line preview of ``limit`` characters, whatever its size.
    if isinstance(value, str):
        return value[: limit + 1]
    if depth >= 4:
        return "…"
    if isinstance(value, dict):
        return {str(k)[: limit + 1]: _clip(v, limit, depth + 1) for k, v in list(value.items())[:limit]}
    if isinstance(value, (list, tuple)):
        return [_clip(v, limit, depth + 1) for v in value[:limit]]
    return value


def preview(value: Any, limit: int = 80) -> SafeString:
    """A one-line, shortened view of a JSON value for lists; costs the same for any size."""
    text = json.dumps(_clip(value, limit), ensure_ascii=False, default=str)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return bounded_text(text, keep="", budget=4_000).html


#: Characters counted one by one for the hidden-character warning; past it the count is a floor.
COUNT_CHARS = 2_000_000


def _strings(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict) and depth < 200:
        for key, child in value.items():
            yield str(key)
            yield from _strings(child, depth + 1)
    elif isinstance(value, (list, tuple)) and depth < 200:
        for child in value:
            yield from _strings(child, depth + 1)


def count_hidden(value: Any, *, keep: str = "\n\t") -> tuple[int, bool]:
    """Hidden characters in the strings of ``value`` and whether that count is exact. Clean
    stretches cost a C-speed scan; a stretch with hidden characters is counted by its distinct
    characters. Past :data:`COUNT_CHARS` characters of such stretches the count is a floor."""
    found, budget = 0, COUNT_CHARS
    for text in _strings(value):
        if _clean(text, keep):
            continue
        for start in range(0, len(text), 4096):
            part = text[start : start + 4096]
            if _clean(part, keep):
                continue
            if budget <= 0:
                return max(found, 1), False
            budget -= len(part)
            found += sum(part.count(char) for char in set(part) if is_hidden(char, keep=keep))
    return found, True


# Ranges, not single characters: a class of 250 single supplementary characters scans slowly.
_EXTRA = re.compile("[\u034f\u115f\u1160\u17b4\u17b5\u2800\u3164\uffa0\ufe00-\ufe0f\U000e0100-\U000e01ef]")
