"""What a page loads of a stored JSON value: all of it when it is of a size a page can use, else
a prefix cut by the database, so a 50 MB argument is neither read into the web process nor parsed
to show its first lines. The size is the stored JSON text's length, asked of the database first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import F, Func, IntegerField, Model, TextField
from django.db.models.functions import Cast, Substr
from django.http import HttpRequest
from django.utils.safestring import SafeString

from ..bounded import MESSAGE_BYTES, bounded_json, bounded_text, message_view, preview
from ..models import AgentRun, RunMessage

#: HTML bytes of one call's arguments (and of its result) on a run's page.
CALL_CELL_BYTES = 8_000

#: Size of stored JSON past which a page loads a prefix instead of the value (a 3 MB argument
#: is still loaded, parsed and shown cut; past this, reading it is most of a page's time).
BIG_JSON = 4_000_000
#: Characters of stored JSON text loaded for a value past BIG_JSON.
PREFIX_CHARS = 64_000


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


def _text(field: str) -> Cast:
    return Cast(F(field), output_field=TextField())


class _Size(Func):
    """The stored size of a JSON column: SQLite reads a BLOB's length without decoding UTF-8
    (``length()`` of TEXT counts characters, a scan of the value); elsewhere its text length."""

    function = "LENGTH"
    output_field = IntegerField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))", **extra)


def _size(field: str) -> Func:
    return _Size(_text(field))


def load(model: type[Model], pk: Any, field: str) -> Stored:
    return load_many(model, [pk], field).get(pk, Stored(None, 0))


def load_many(model: type[Model], pks: list[Any], field: str) -> dict[Any, Stored]:
    """Each row's value of ``field`` by size: one query reads every size with its prefix (one
    read of a big value), a second the values that are small enough to load."""
    rows = model._default_manager.filter(pk__in=pks)
    cut = rows.annotate(nexo_size=_size(field), nexo_prefix=Substr(_text(field), 1, PREFIX_CHARS))
    found: dict[Any, Stored] = {}
    small: dict[Any, int] = {}
    for pk, size, prefix in cut.values_list("pk", "nexo_size", "nexo_prefix"):
        if int(size or 0) > BIG_JSON:
            found[pk] = Stored(None, int(size), str(prefix or ""))
        else:
            small[pk] = int(size or 0)
    if small:
        for pk, value in rows.filter(pk__in=list(small)).values_list("pk", field):
            found[pk] = Stored(value, small[pk])
    return found


def json_size(model: type[Model], pk: Any, field: str) -> int:
    size = model._default_manager.filter(pk=pk).annotate(nexo_size=_size(field)).values_list("nexo_size", flat=True)
    return int(size.first() or 0)


# --- shown on a page, by size --------------------------------------------------------------------


def transcript_context(model_admin: Any, request: HttpRequest, run: AgentRun) -> dict[str, Any]:
    show_all = request.GET.get("transcript") == "all"
    messages_qs = model_admin.get_transcript(request, run)
    total = messages_qs.count()
    messages_qs = messages_qs.defer("data")
    rows = list(messages_qs) if show_all else list(reversed(messages_qs.reverse()[: model_admin.transcript_limit]))
    stored = load_many(RunMessage, [m.pk for m in rows], "data")
    return {
        # Each message bounded: a page shows the transcript's last messages, never megabytes.
        "transcript": [{"seq": m.seq, **message_shown(m, stored[m.pk])} for m in rows if m.pk in stored],
        "transcript_total": total,
        "transcript_hidden": total - len(rows),
    }


def message_shown(row: RunMessage, stored: Stored) -> dict[str, Any]:
    if not stored.big:
        return message_view(stored.value)
    # Too big to load into a page: the start of its stored JSON text, as stored.
    view = message_view({"role": row.role, "content": None})
    view["json"] = bounded_text(stored.prefix, keep="\n", budget=MESSAGE_BYTES).html
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


