"""Values written into a statement's SQL as literals (issue 34).

A partial index (``WHERE status = 'pending_approval'``) serves a query whose own condition implies
the index's. SQLite plans a statement before its values are bound, so with ``status = ?`` it can
only use such an index by planning the statement again once the value is bound, and then does so
at every execution (each bind expires the plan): measured on the approval cycle, that cost more
CPU than the index pages it saved. The durable layer's own statements (:mod:`.sql`) compare the
status as a literal instead, given as :class:`Fixed`.
"""

from __future__ import annotations

import re
from typing import Any

from ..models import CallStatus


class Fixed(str):
    """A value compared as a literal in the statement's SQL (``"status" = 'pending_approval'``), not
    bound. Only a word of lowercase letters and underscores, as the models' status values are:
    nothing to quote, nothing from outside."""

    __slots__ = ()

    def __new__(cls, value: str) -> Fixed:
        if not _WORD.fullmatch(value):
            raise ValueError(f"{value!r}: a fixed value is a word of lowercase letters and underscores")
        return super().__new__(cls, value)


_WORD = re.compile(r"[a-z_]{1,64}")

#: a call waiting for a person: what ToolCall's partial indexes hold (``models.ToolCall.Meta``)
PENDING_APPROVAL = Fixed(CallStatus.PENDING_APPROVAL)


def values(where: dict[str, Any]) -> tuple[str, ...]:
    """The fixed values of ``where``, in order: part of a statement's key (they are in its SQL)."""
    return tuple(v for v in where.values() if type(v) is Fixed)
