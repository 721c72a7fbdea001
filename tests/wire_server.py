"""A loopback HTTP server that plays scripted provider answers and records what it was sent.

Real sockets, real HTTP/1.1 with keep-alive, on 127.0.0.1 and an ephemeral port. Each request
takes the next scripted answer; when the script runs out the server answers 418 with a body
saying so, which the providers report as a non-retryable error and the test fails loudly.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Answer:
    status: int = 200
    body: Any = None  # dict/list → JSON, str/bytes → sent as is
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering (timeouts)

    def encode(self) -> tuple[bytes, str]:
        if isinstance(self.body, bytes):
            return self.body, "application/octet-stream"
        if isinstance(self.body, str):
            return self.body.encode(), "text/plain; charset=utf-8"
        return json.dumps(self.body).encode(), "application/json"


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # decoded JSON, or the raw text when it is not JSON
    client_port: int


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so connection reuse is observable
    timeout = 10  # an idle keep-alive connection does not pin a thread forever
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection)

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        received = Received(
            method="POST",
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            client_port=self.client_address[1],
        )
        answer = self.server.next_answer(received)
        if answer.delay:
            time.sleep(answer.delay)
        data, content_type = answer.encode()
        self.send_response(answer.status)
        headers = {"content-type": content_type, **answer.headers}
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.script: list[Answer] = []
        self.requests: list[Received] = []
        self.connections: set[socket.socket] = set()

    def track(self, connection: socket.socket) -> None:
        with self.lock:
            self.connections.add(connection)

    def next_answer(self, received: Received) -> Answer:
        with self.lock:
            self.requests.append(received)
            if self.script:
                return self.script.pop(0)
        return Answer(418, {"error": {"message": "wire server: no scripted answer left", "type": "test"}})


class WireServer:
    """``with WireServer() as server: server.play(Answer(...)); ... server.requests``"""

    def __init__(self) -> None:
        self._server = _Server()
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[Received]:
        with self._server.lock:
            return list(self._server.requests)

    @property
    def remaining(self) -> int:
        with self._server.lock:
            return len(self._server.script)

    def play(self, *answers: Answer) -> None:
        with self._server.lock:
            self._server.script.extend(answers)

    def __enter__(self) -> WireServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        with self._server.lock:
            connections = list(self._server.connections)
        for connection in connections:
            # Wake handler threads blocked on idle keep-alive connections.
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        self._thread.join(timeout=5)


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
