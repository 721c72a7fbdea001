"""A client of a run's event stream (``runs/<id>/stream/``) for the tests of live progress:
it reads the Server-Sent Events in a thread, as a browser's ``EventSource`` would."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx

#: Seconds a stream, or a wait on it, lasts at most.
WAIT = 20.0


class Stream(threading.Thread):
    """Reads ``url`` as an event stream in a thread: the events (id, type) it got, until
    ``event: end`` or until ``drop_after`` events (then it closes the connection, as a dropped
    network would). ``saw(type)`` waits until an event of that type came."""

    def __init__(self, url: str, session: str, *, last_id: int | None = None, drop_after: int | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.session, self.last_id, self.drop_after = url, session, last_id, drop_after
        self.events: list[tuple[int, str]] = []
        #: the model's text as it came (event: delta), with how many events came before each piece
        self.deltas: list[tuple[int, str]] = []
        #: the text so far the stream sent first (event: delta with "so_far"), and the statuses
        self.so_far: list[str] = []
        self.statuses: list[str] = []
        self.status: int | None = None
        self.ended = False
        #: the stream's first line (the retry hint) came: it is subscribed to the run
        self.opened = False
        self.error: BaseException | None = None
        self._changed = threading.Condition()

    def run(self) -> None:
        headers = {"Accept": "text/event-stream"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = str(self.last_id)
        try:
            with httpx.Client(cookies={"sessionid": self.session}, timeout=httpx.Timeout(WAIT)) as client, \
                    client.stream("GET", self.url, headers=headers) as response:
                self.status = response.status_code
                fields: dict[str, str] = {}
                for line in response.iter_lines():
                    if line:
                        name, _, value = line.partition(":")
                        fields[name] = value.removeprefix(" ")
                        continue
                    if self._dispatch(fields):
                        return
                    fields = {}
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            with self._changed:
                self._changed.notify_all()

    def _dispatch(self, fields: dict[str, str]) -> bool:
        """Record one event; True to stop reading."""
        if fields.get("event") == "end":
            self.ended = True
            return True
        if "retry" in fields:
            with self._changed:
                self.opened = True
                self._changed.notify_all()
            return False
        if fields.get("event") == "delta":  # the model's text: no id, not stored
            delta = json.loads(fields["data"])
            with self._changed:
                if delta.get("so_far"):
                    self.so_far.append(delta["text"])
                self.deltas.append((len(self.events), delta["text"]))
                self._changed.notify_all()
            return False
        if fields.get("event") == "status":  # the run's status as the stream read it: no id
            with self._changed:
                self.statuses.append(json.loads(fields["data"])["status"])
                self._changed.notify_all()
            return False
        if "id" not in fields:
            return False  # a comment or the retry hint
        data = json.loads(fields["data"])
        assert data["id"] == int(fields["id"]) and data["type"] == fields["event"]
        with self._changed:
            self.events.append((int(fields["id"]), fields["event"]))
            self._changed.notify_all()
        return self.drop_after is not None and len(self.events) >= self.drop_after

    def saw(self, type: str, count: int = 1) -> None:
        with self._changed:
            ok = self._changed.wait_for(
                lambda: sum(t == type for _, t in self.events) >= count or not self.is_alive(), WAIT
            )
        assert ok and sum(t == type for _, t in self.events) >= count, (self.events, self.error)

    def wait_for(self, ready: Any) -> None:
        """Wait until ``ready()`` (called under the lock as events come) is true."""
        with self._changed:
            ok = self._changed.wait_for(lambda: ready() or not self.is_alive(), WAIT)
        assert ok and ready(), (self.events, self.statuses, self.error)

    def wait_open(self) -> None:
        with self._changed:
            ok = self._changed.wait_for(lambda: self.opened or not self.is_alive(), WAIT)
        assert ok and self.opened, (self.status, self.error)

    def last(self) -> int:
        return self.events[-1][0]
