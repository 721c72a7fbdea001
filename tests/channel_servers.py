"""Loopback stand-ins for the outside services of the channel tests, speaking their documented
wire formats: a Slack Web API (``POST /api/<method>``, JSON or form bodies, a bearer token, answers
``{"ok": true, ...}`` / ``{"ok": false, "error": ...}``, 429 with ``Retry-After``) and a webhook
receiver that verifies the app's signature and honours the idempotency key."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs

from nexo_django.channels.signing import SignatureError, verify_signature

from .servers import LOOPBACK, free_port


class _Loopback:
    """A threaded HTTP server on 127.0.0.1 (a port chosen now; ``start`` may come later: until
    then nothing listens there, as when the receiver is down)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def handle(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, str], bytes]:
        raise NotImplementedError

    def start(self) -> Self:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, headers, answer = owner.handle(self, body)
                self.send_response(status)
                for name, value in {"Content-Length": str(len(answer)), **headers}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer((LOOPBACK, self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SlackServer(_Loopback):
    """Slack's Web API on loopback: messages by (channel, ts), every request in ``requests``."""

    def __init__(self, token: str = "xoxb-test", port: int | None = None) -> None:
        super().__init__(port)
        self.token = token
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}
        self.ephemeral: list[dict[str, Any]] = []
        #: Slack user id -> the user object users.info answers
        self.users: dict[str, dict[str, Any]] = {}
        #: answer this many requests with 429 first
        self.rate_limited = 0
        #: the Web API methods answered ``{"ok": false, "error": "missing_scope"}`` (a scope not granted)
        self.missing_scope: set[str] = set()
        #: messages per page of conversations.history / .replies when the request gives no limit
        self.page_size = 100
        self._last_ts = 0.0

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/api/"

    def calls(self, method: str) -> list[dict[str, Any]]:
        with self.lock:
            return [fields for name, fields in self.requests if name == method]

    def handle(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, str], bytes]:
        method = handler.path.rsplit("/", 1)[-1]
        if handler.headers.get("Content-Type", "").startswith("application/json"):
            fields = json.loads(body or b"{}")
        else:
            fields = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        with self.lock:
            self.requests.append((method, fields))
            if self.rate_limited:
                self.rate_limited -= 1
                return 429, {"Retry-After": "1"}, b""
            answer = self._answer(method, fields, handler.headers.get("Authorization", ""))
        return 200, {"Content-Type": "application/json; charset=utf-8"}, json.dumps(answer).encode()

    def _answer(self, method: str, fields: dict[str, Any], auth: str) -> dict[str, Any]:
        if auth != f"Bearer {self.token}":
            return {"ok": False, "error": "invalid_auth"}
        if method == "chat.postMessage":
            if not fields.get("channel"):
                return {"ok": False, "error": "channel_not_found"}
            # Slack's ts: the post's Unix time in microseconds, unique in its channel.
            self._last_ts = max(time.time(), self._last_ts + 0.000001)
            ts = f"{self._last_ts:.6f}"
            self.messages[(fields["channel"], ts)] = fields
            return {"ok": True, "channel": fields["channel"], "ts": ts, "message": {"text": fields.get("text")}}
        if method == "chat.update":
            key = (fields.get("channel"), fields.get("ts"))
            if key not in self.messages:
                return {"ok": False, "error": "message_not_found"}
            self.messages[key] = {**self.messages[key], **fields}
            return {"ok": True, "channel": key[0], "ts": key[1], "text": fields.get("text")}
        if method == "chat.postEphemeral":
            self.ephemeral.append(fields)
            return {"ok": True, "message_ts": "1.1"}
        if method in self.missing_scope:
            return {"ok": False, "error": "missing_scope", "needed": "channels:history", "provided": "chat:write"}
        if method in ("conversations.history", "conversations.replies"):
            return self._history(method, fields)
        if method == "users.info":
            user = self.users.get(fields.get("user", ""))
            return {"ok": True, "user": user} if user else {"ok": False, "error": "user_not_found"}
        return {"ok": False, "error": "unknown_method"}

    def _history(self, method: str, fields: dict[str, Any]) -> dict[str, Any]:
        """conversations.history (the channel's messages, not the replies in threads) or
        .replies (a thread: its parent first, then replies, oldest first), as Slack answers them:
        ``oldest``/``latest`` bounds, ``limit``, a ``cursor`` from ``response_metadata.next_cursor``,
        ``has_more``, and each message's ``metadata`` only with ``include_all_metadata``."""
        channel = fields.get("channel")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        found = [(ts, m) for (c, ts), m in self.messages.items() if c == channel]
        if method == "conversations.history":
            found = [(ts, m) for ts, m in found if not m.get("thread_ts")]
            found.sort(key=lambda tm: float(tm[0]), reverse=True)
        else:
            parent = fields.get("ts")
            if (channel, parent) not in self.messages:
                return {"ok": False, "error": "thread_not_found"}
            found = [(ts, m) for ts, m in found if ts == parent or m.get("thread_ts") == parent]
            found.sort(key=lambda tm: float(tm[0]))
        oldest, latest = float(fields.get("oldest") or 0), float(fields.get("latest") or time.time() + 1)
        inclusive = str(fields.get("inclusive", "")).lower() in ("1", "true")
        found = [(ts, m) for ts, m in found
                 if (oldest <= float(ts) <= latest if inclusive else oldest < float(ts) < latest)]
        start = int(fields["cursor"].removeprefix("next_ts:")) if fields.get("cursor") else 0
        limit = int(fields.get("limit") or self.page_size)
        page = found[start:start + limit]
        metadata = str(fields.get("include_all_metadata", "")).lower() in ("1", "true")
        messages = []
        for ts, m in page:
            shown = {"type": "message", "ts": ts, "text": m.get("text", ""), "bot_id": "B0001"}
            if m.get("thread_ts"):
                shown["thread_ts"] = m["thread_ts"]
            if metadata and isinstance(m.get("metadata"), dict):
                shown["metadata"] = m["metadata"]
            messages.append(shown)
        more = start + limit < len(found)
        return {"ok": True, "messages": messages, "has_more": more, "pin_count": 0,
                "response_metadata": {"next_cursor": f"next_ts:{start + limit}" if more else ""}}


class WebhookReceiver(_Loopback):
    """Accepts the app's events: verifies the signature, keeps each idempotency key once."""

    def __init__(self, secret: str, port: int | None = None) -> None:
        super().__init__(port)
        self.secret = secret
        self.received: dict[str, dict[str, Any]] = {}
        self.posts: list[dict[str, Any]] = []
        self.refused: list[str] = []

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/hook"

    def handle(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, str], bytes]:
        try:
            verify_signature(self.secret, handler.headers.get("X-Nexo-Signature"), body)
        except SignatureError as exc:
            with self.lock:
                self.refused.append(str(exc))
            return 401, {}, b"bad signature"
        event = json.loads(body)
        with self.lock:
            self.posts.append(event)
            self.received.setdefault(handler.headers["Idempotency-Key"], event)
        return 204, {}, b""


def wait_for(predicate: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out waiting")


class RawListener:
    """A TCP listener on 127.0.0.1 that counts the connections it accepts and answers each with
    ``script``: raw bytes sent at once (``b""``: it reads the request and never answers) or, with
    ``drip``, one byte every ``drip`` seconds (a receiver that answers slowly byte by byte).
    The attack tests assert on ``connections`` that nothing reached it."""

    def __init__(self, script: bytes = b"", drip: float | None = None, hold: float = 30.0) -> None:
        self.script = script
        self.drip = drip
        self.hold = hold  # how long a connection is kept open at most (bounded)
        self.connections = 0
        self.requests: list[bytes] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((LOOPBACK, 0))
        self.port = int(self._sock.getsockname()[1])

    def url(self, host: str = LOOPBACK, path: str = "/hook") -> str:
        return f"http://{host}:{self.port}{path}"

    def __enter__(self) -> Self:
        self._sock.listen(16)
        self._sock.settimeout(0.1)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        deadline = time.monotonic() + self.hold
        with conn:
            conn.settimeout(0.2)
            request = b""
            while b"\r\n\r\n" not in request and time.monotonic() < deadline and not self._stop.is_set():
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not chunk:
                    break
                request += chunk
            with self.lock:
                self.requests.append(request)
            try:
                if self.drip is None and self.script:
                    conn.sendall(self.script)
                    return  # answered: the connection closes (each attempt is a connection of its own)
                else:
                    for byte in self.script:
                        if self._stop.wait(self.drip) or time.monotonic() > deadline:
                            return
                        conn.sendall(bytes([byte]))
                # Keep the connection open (no answer, or the rest of a slow one) until told to stop.
                self._stop.wait(max(0.0, deadline - time.monotonic()))
            except OSError:
                return
