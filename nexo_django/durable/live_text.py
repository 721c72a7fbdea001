"""The model's text so far in a run's current turn, kept for a page opened (or reloaded) mid-turn.

Deltas travel to the pages that listen when they are written (``durable.live``); a page that
starts listening mid-turn missed the start. So the worker also keeps the current turn's text,
here, and a new stream sends it first. Kept where the run's worker and its pages both reach:

- a Redis queue: on the queue's Redis, two keys per run (``nexo_django:text:<run>``: the text of
  the turn and attempt ``nexo_django:text-of:<run>`` names), appended by one script per piece
  (atomic: a reader gets whole pieces), expiring :data:`TTL` seconds after the last piece;
- an inline queue: in this process (the run runs in the process that serves its pages).

Each piece's *end* (the kept text's size once it is added: bytes on Redis, characters in the
process) goes with its delta, so a stream that sent the text so far skips the pieces it held.
The worker's side is ``live.publish_delta``: on Redis through its publisher's client (the same
timeout and pause as the pieces it publishes), here in the process otherwise. Live text is a
courtesy, the transcript is the record.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from . import dispatch

log = logging.getLogger("nexo_django.live")

#: Seconds the kept text lives after its last piece (a turn that stalls longer is read from the
#: transcript once it ends, as before).
TTL = 600
#: Characters kept of one turn at most (a longer turn's page shows the start, then the rest as it
#: comes); past it, pieces are still sent on but not kept.
MAX_CHARS = 200_000
#: Runs whose text one process keeps at most (an inline queue's process), the oldest dropped first.
MAX_RUNS = 1_000

# KEYS: the text, the turn's name; ARGV: the turn's name ("turn:attempt"), the piece, the TTL,
# the most bytes kept. Returns the text's size in bytes once the piece is added (-1: not kept).
_APPEND = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3])
  redis.call('DEL', KEYS[1])
else
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
if redis.call('STRLEN', KEYS[1]) + string.len(ARGV[2]) > tonumber(ARGV[4]) then return -1 end
local size = redis.call('APPEND', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return size
"""


def _keys(run_id: Any) -> tuple[str, str]:
    return f"nexo_django:text:{run_id}", f"nexo_django:text-of:{run_id}"


def _in_process() -> bool:
    try:
        return bool(dispatch.is_inline())
    except Exception:  # a misnamed queue: the checks say so
        return True


class _Local:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: run id -> [turn, attempt, pieces, size]
        self.turns: dict[str, list[Any]] = {}

    def add(self, run_id: str, turn: int, attempt: int, text: str) -> int | None:
        with self.lock:
            kept = self.turns.get(run_id)
            if kept is None or kept[:2] != [turn, attempt]:
                if kept is None and len(self.turns) >= MAX_RUNS:
                    del self.turns[next(iter(self.turns))]  # the run that started longest ago
                kept = self.turns[run_id] = [turn, attempt, [], 0]
            if kept[3] + len(text) > MAX_CHARS:
                return None
            kept[2].append(text)
            kept[3] += len(text)
            return int(kept[3])

    def get(self, run_id: str) -> dict[str, Any] | None:
        with self.lock:
            kept = self.turns.get(run_id)
            if kept is None:
                return None
            return {"turn": kept[0], "attempt": kept[1], "text": "".join(kept[2]), "end": kept[3]}

    def forget(self, run_id: str) -> None:
        with self.lock:
            self.turns.pop(run_id, None)


_local = _Local()


def in_process() -> bool:
    """Whether the text is kept in this process (an inline queue), not on the queue's Redis."""
    return _in_process()


def keep_here(run_id: Any, turn: int, attempt: int, text: str) -> int | None:
    """Add ``text`` to the kept text of ``run_id``'s turn, in this process (a new turn or attempt
    starts it afresh); returns the kept text's end, or None if it is not kept (too long)."""
    return _local.add(str(run_id), turn, attempt, text) if text else None


def keep_on(client: Any, run_id: Any, turn: int, attempt: int, text: str) -> int | None:
    """:func:`keep_here` on the queue's Redis through ``client`` (one script, one round trip;
    the caller handles Redis errors). The end is in bytes."""
    size = int(client.register_script(_APPEND)(keys=_keys(run_id), args=[f"{turn}:{attempt}", text, TTL, MAX_CHARS * 4]))
    return size if size >= 0 else None


def size(text: str) -> int:
    """``text``'s size in the unit of the ends :func:`keep` returns."""
    return len(text) if _in_process() else len(text.encode("utf-8"))


def so_far(run_id: Any) -> dict[str, Any] | None:
    """The kept text of the run's latest turn: ``{"turn", "attempt", "text", "end"}``, or None.
    (The page's side: the queue's own Redis connection, whose reads wait as the queue's do.)"""
    if _in_process():
        return _local.get(str(run_id))
    text_key, turn_key = _keys(run_id)
    try:
        connection = dispatch.get_queue().connection
        with connection.pipeline(transaction=True) as pipe:
            name, raw = pipe.get(turn_key).get(text_key).execute()
    except Exception as exc:  # Redis away: the page shows the text from the next piece on
        log.debug("run %s: its text so far not read: %s", run_id, exc)
        return None
    if not name or raw is None:
        return None
    turn, _, attempt = (name.decode() if isinstance(name, bytes) else str(name)).partition(":")
    data = raw if isinstance(raw, bytes) else str(raw).encode()
    return {"turn": int(turn), "attempt": int(attempt or 0), "text": data.decode("utf-8", "replace"), "end": len(data)}


def forget(run_id: Any) -> None:
    """Drop the kept text of a run of this process (the Redis keys expire on their own)."""
    _local.forget(str(run_id))
