"""rq jobs the queue benchmark runs beside nexo runs, on the same workers."""

from __future__ import annotations


def noop() -> None:
    """The baseline: a job that does nothing (no database, no import)."""
