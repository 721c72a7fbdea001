"""What a page loads of a stored JSON value: all of it when it is of a size a page can use, else
the head the database stored beside it, so a 50 MB argument is neither read into the web process
nor parsed to show its first lines (nor read by the database to cut it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db.models import Model
from django.http import HttpRequest
from django.utils.safestring import SafeString

from .. import models, run_pages
from ..bounded import MESSAGE_BYTES, bounded_json, bounded_text, message_view, preview
from ..models import AgentRun, RunMessage
from ..storable import RESERVED

#: HTML bytes of one call's arguments (and of its result) on a run's page.
CALL_CELL_BYTES = 8_000

#: Size of stored JSON past which a page reads the value's head instead of the value (a 3 MB
#: argument is still loaded, parsed and shown cut; past this, reading it is most of a page's time).
BIG_JSON = models.BIG_JSON


@dataclass
class Stored:
    """One stored JSON value as a page gets it: ``value`` when it is small, else ``prefix``, the
    first characters of its stored JSON text; ``size`` is the length of that text."""

    value: Any
    size: int
    prefix: str | None = None

    @property
    def big(self) -> bool:
        return self.prefix is not None


def load(model: type[Model], pk: Any, field: str) -> Stored:
    return load_many(model, [pk], field).get(pk, Stored(None, 0))


def load_many(model: type[Model], pks: list[Any], field: str) -> dict[Any, Stored]:
    """Each row's value of ``field`` by size: one query reads the sizes and heads the database
    stored beside the values when it wrote them (``models.stored_size``/``stored_head``: no big
    value is read), a second the values that are small enough to load."""
    rows = model._default_manager.filter(pk__in=pks)
    found: dict[Any, Stored] = {}
    small: dict[Any, int] = {}
    for pk, size, head in rows.values_list("pk", f"{field}_size", f"{field}_head"):
        if head is not None:
            found[pk] = Stored(None, int(size or 0), str(head))
        else:
            small[pk] = int(size or 0)
    if small:
        for pk, value in rows.filter(pk__in=list(small)).values_list("pk", field):
            found[pk] = Stored(value, small[pk])
    return found


def head_keys(head: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """The top-level ``keys`` of a JSON object that lie whole inside ``head``, the start of its
    stored text (a big value's head): members are read in order until the cut, so a value
    is never guessed from part of it. An escaped object (``storable``) yields nothing."""
    decoder = json.JSONDecoder()
    found: dict[str, Any] = {}
    at = _skip(head, 0)
    if head[at:at + 1] != "{":
        return found
    at = _skip(head, at + 1)
    try:
        while head[at:at + 1] == '"' and len(found) < len(keys):
            key, at = decoder.raw_decode(head, at)
            at = _skip(head, at)
            if head[at:at + 1] != ":" or key == RESERVED:
                break
            value, at = decoder.raw_decode(head, _skip(head, at + 1))
            if key in keys:
                found[key] = value
            at = _skip(head, at)
            if head[at:at + 1] != ",":
                break
            at = _skip(head, at + 1)
    except ValueError:  # the cut, inside a member
        pass
    return found


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\n\r":
        at += 1
    return at


def json_size(model: type[Model], pk: Any, field: str) -> int:
    size = model._default_manager.filter(pk=pk).values_list(f"{field}_size", flat=True)
    return int(size.first() or 0)


# --- shown on a page, by size --------------------------------------------------------------------


def transcript_context(model_admin: Any, request: HttpRequest, run: AgentRun) -> dict[str, Any]:
    """The transcript's last ``transcript_limit`` messages, or a window of as many from
    ``?transcript_from=<seq>`` (``?transcript=all``: from the first), never all of a long run."""
    start = 0 if request.GET.get("transcript") == "all" else run_pages.int_param(request, "transcript_from")
    found = run_pages.window(
        model_admin.get_transcript(request, run).defer("data"), "seq",
        limit=model_admin.transcript_limit, start=start, tail=True,
    )
    rows = found.rows
    stored = load_many(RunMessage, [m.pk for m in rows], "data")
    budget = run_pages.budget_each(run_pages.WINDOW_BYTES, len(rows), ceiling=MESSAGE_BYTES)
    return {
        # Each message bounded, and the window too: a page never shows megabytes.
        "transcript": [{"seq": m.seq, **message_shown(m, stored[m.pk], budget=budget)} for m in rows if m.pk in stored],
        "transcript_total": found.total,
        "transcript_hidden": found.total - len(rows),
        "transcript_window": found,
    }


def message_shown(row: RunMessage, stored: Stored, *, budget: int = MESSAGE_BYTES) -> dict[str, Any]:
    if not stored.big:
        return message_view(stored.value, budget=budget)
    # Too big to load into a page: the start of its stored JSON text, as stored.
    view = message_view({"role": row.role, "content": None})
    view["json"] = bounded_text(stored.prefix, keep="\n", budget=budget).html
    view["clipped"] = True
    return view


def preview_shown(stored: Stored | None) -> SafeString:
    if stored is None:
        return preview(None)
    return preview(stored.value) if not stored.big else bounded_text(stored.prefix, keep="", chars=79).html


def cell_shown(stored: Stored) -> SafeString:
    if stored.big:
        return bounded_text(stored.prefix, keep="\n", budget=CALL_CELL_BYTES).html
    return bounded_json(stored.value, budget=CALL_CELL_BYTES, string_chars=2_000).html


