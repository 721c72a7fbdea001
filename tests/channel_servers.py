"""Loopback stand-ins for the outside services of the channel tests, speaking their documented
wire formats: a Slack Web API (``POST /api/<method>``, JSON or form bodies, a bearer token, answers
``{"ok": true, ...}`` / ``{"ok": false, "error": ...}``, 429 with ``Retry-After``) and a webhook
receiver that verifies the app's signature and honours the idempotency key. Slack's modals too:
``views.open`` takes a click's ``trigger_id`` once within three seconds and checks the view as Slack
does; :meth:`SlackServer.submission` is the ``view_submission`` payload Slack posts back."""

from __future__ import annotations

import json
import secrets
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
        #: trigger_id -> when Slack gave it (with a click); views.open takes each once, within 3 s
        self.triggers: dict[str, float] = {}
        #: the modals views.open opened, by view id
        self.views: dict[str, dict[str, Any]] = {}

    def trigger(self) -> str:
        """A new ``trigger_id``, as Slack puts in the payload of a click."""
        with self.lock:
            trigger_id = f"{len(self.triggers) + 1}.{int(time.time())}.{secrets.token_hex(8)}"
            self.triggers[trigger_id] = time.monotonic()
            return trigger_id

    def submission(self, view_id: str, values: dict[str, Any], *, user: str = "U1", team: str = "T0001") -> dict[str, Any]:
        """The ``view_submission`` payload Slack posts when the person sends the modal
        ``view_id``: its ``callback_id`` and ``private_metadata`` as opened, ``state.values`` by
        block and action id."""
        view = self.views[view_id]
        return {"type": "view_submission", "team": {"id": team, "domain": "acme"},
                "user": {"id": user, "username": user.lower(), "team_id": team}, "api_app_id": "A0001",
                "token": "deprecated-verification-token", "trigger_id": self.trigger(),
                "view": {"id": view_id, "team_id": team, "type": "modal", "blocks": view["blocks"],
                         "private_metadata": view.get("private_metadata", ""), "callback_id": view.get("callback_id", ""),
                         "state": {"values": values}, "hash": f"{int(time.time())}.abc", "title": view["title"],
                         "root_view_id": view_id, "app_id": "A0001", "bot_id": "B0001"},
                "response_urls": []}

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
        if method == "views.open":
            return self._open_view(fields)
        if method in self.missing_scope:
            return {"ok": False, "error": "missing_scope", "needed": "channels:history", "provided": "chat:write"}
        if method in ("conversations.history", "conversations.replies"):
            return self._history(method, fields)
        if method == "users.info":
            user = self.users.get(fields.get("user", ""))
            return {"ok": True, "user": user} if user else {"ok": False, "error": "user_not_found"}
        return {"ok": False, "error": "unknown_method"}

    def _open_view(self, fields: dict[str, Any]) -> dict[str, Any]:
        """views.open as Slack documents it: a ``trigger_id`` from a click, used once within three
        seconds (``invalid_trigger_id`` / ``expired_trigger_id``), and a modal view Slack would
        take (``invalid_arguments`` with the reasons otherwise)."""
        trigger = fields.get("trigger_id")
        issued = self.triggers.get(trigger) if isinstance(trigger, str) else None
        if issued is None:
            return {"ok": False, "error": "invalid_trigger_id"}
        if issued < 0 or time.monotonic() - issued > 3:  # used before, or too late
            return {"ok": False, "error": "expired_trigger_id"}
        self.triggers[trigger] = -1.0
        view = fields.get("view")
        if isinstance(view, str):
            view = json.loads(view)
        problems = view_problems(view)
        if problems:
            return {"ok": False, "error": "invalid_arguments", "response_metadata": {"messages": problems}}
        view_id = f"V{len(self.views) + 1:08d}"
        self.views[view_id] = view
        return {"ok": True, "view": {"id": view_id, **view, "state": {"values": {}}}}

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


def view_problems(view: Any) -> list[str]:
    """What Slack refuses in a modal (its documented limits), as its ``[ERROR]`` messages."""
    if not isinstance(view, dict) or view.get("type") != "modal":
        return ["[ERROR] must be a modal view [json-pointer:/view/type]"]
    problems = []
    for key, limit in (("title", 24), ("submit", 24), ("close", 24)):
        text = view.get(key)
        if text is None and key != "title":
            continue
        if not isinstance(text, dict) or text.get("type") != "plain_text" or not 0 < len(text.get("text", "")) <= limit:
            problems.append(f"[ERROR] must be a plain_text of at most {limit} characters [json-pointer:/view/{key}]")
    blocks = view.get("blocks")
    if not isinstance(blocks, list) or not 0 < len(blocks) <= 100:
        return [*problems, "[ERROR] must hold 1 to 100 blocks [json-pointer:/view/blocks]"]
    ids = [b.get("block_id") for b in blocks if isinstance(b, dict) and b.get("block_id")]
    if len(ids) != len(set(ids)):
        problems.append("[ERROR] block_id must be unique [json-pointer:/view/blocks]")
    inputs = [b for b in blocks if isinstance(b, dict) and b.get("type") == "input"]
    if inputs and view.get("submit") is None:
        problems.append("[ERROR] a view with inputs needs submit [json-pointer:/view/submit]")
    for index, block in enumerate(inputs):
        label, element = block.get("label") or {}, block.get("element") or {}
        if label.get("type") != "plain_text" or not 0 < len(label.get("text", "")) <= 2000:
            problems.append(f"[ERROR] label must be plain_text of 1 to 2000 characters [json-pointer:/view/blocks/{index}]")
        if element.get("type") not in INPUT_ELEMENTS or not element.get("action_id"):
            problems.append(f"[ERROR] not a valid input element [json-pointer:/view/blocks/{index}/element]")
        for option in element.get("options") or []:
            if len(option.get("text", {}).get("text", "")) > 75 or len(option.get("value", "")) > 150:
                problems.append(f"[ERROR] an option's text or value is too long [json-pointer:/view/blocks/{index}]")
    if len(str(view.get("private_metadata", ""))) > 3000 or len(str(view.get("callback_id", ""))) > 255:
        problems.append("[ERROR] private_metadata or callback_id too long [json-pointer:/view]")
    return problems


#: the elements an input block takes (those the app uses among them)
INPUT_ELEMENTS = frozenset({"plain_text_input", "email_text_input", "url_text_input", "number_input", "datepicker",
                            "static_select", "radio_buttons", "checkboxes"})
