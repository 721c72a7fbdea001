"""The egress proxy of a confined shell: the only way out of its empty network namespace.

It lives with the tools, next to the guard it reuses, and reaches the sandbox as
``ShellPolicy(egress=EgressProxy)`` (the sandboxes import no tool).

The worker runs it for the length of one call, on a Unix socket bound into the sandbox (an
in-sandbox forwarder listens on 127.0.0.1:3128 and relays to it; ``http_proxy`` and
``https_proxy`` point there). It speaks HTTP ``CONNECT host:port`` (for TLS, which it never
opens) and plain HTTP with an absolute URL. Every request is judged by fetch's guard
(:mod:`nexo_django.tools.netguard`): the host must be on ``NEXO["SHELL"]["NETWORK"]``, the port on
the allowed list, and the name is resolved *here*, at connect time, and refused unless every
address it resolves to is public (loopback and private ones only with ``shell_allow_private``;
link-local/metadata never). The connection then goes to that exact address.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time
from contextlib import suppress

from ..sandboxes.confine import ShellPolicy
from . import netguard
from .netguard import AllowList, FetchRefused, Guard, canonical_host

_HEAD_MAX = 16 * 1024
_MAX_CONNECTIONS = 32
_CONNECT_TIMEOUT = 10.0
PRIVATE_HINT = "set NEXO['LIMITS']['shell_allow_private'] = True to reach private addresses"


class EgressProxy:
    """One call's proxy. ``log`` records each decision: ``("allowed"|"refused", target, why)``."""

    def __init__(self, policy: ShellPolicy, path: str, *, deadline: float) -> None:
        self.policy = policy
        self.path = path
        self.deadline = deadline
        self.allow = AllowList.parse(policy.network)
        self.log: list[tuple[str, str, str]] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._slots = threading.BoundedSemaphore(_MAX_CONNECTIONS)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._server.bind(self.path)
        os.chmod(self.path, 0o600)  # the sandbox connects as the worker's own uid
        self._server.listen(_MAX_CONNECTIONS)
        self._thread = threading.Thread(target=self._accept, name="nexo-egress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        with suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        with self._lock:
            for sock in list(self._open):
                with suppress(OSError):
                    sock.close()
        if self._thread is not None:
            self._thread.join(2)
        with suppress(FileNotFoundError):
            os.unlink(self.path)

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._open.add(sock)
        return sock

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                client.close()
                continue
            threading.Thread(target=self._serve, args=(self._track(client),), name="nexo-egress-conn", daemon=True).start()

    def _left(self) -> float:
        return self.deadline - time.monotonic()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            client.settimeout(max(0.1, min(_CONNECT_TIMEOUT, self._left())))
            head = _read_head(client)
            if head is None:
                return
            method, target, rest = _parse(head)
            try:
                if method == "CONNECT":
                    host, port = _split_authority(target)
                    upstream = self._connect(host, port, f"CONNECT {target}")
                    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    forward = rest
                else:
                    host, port, path = _split_url(target)
                    upstream = self._connect(host, port, f"{method} {target}")
                    forward = _origin_request(method, path, head, rest)
            except FetchRefused as exc:
                _refuse(client, str(exc))
                return
            if forward:
                upstream.sendall(forward)
            self._relay(client, upstream)
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with self._lock:
                        self._open.discard(sock)
                    with suppress(OSError):
                        sock.close()
            self._slots.release()

    def _connect(self, raw_host: str, port: int, what: str) -> socket.socket:
        try:
            host = canonical_host(raw_host)
            if port not in self.policy.ports:
                allowed = ", ".join(map(str, self.policy.ports))
                raise FetchRefused(f"port {port} is not allowed (allowed: {allowed}; NEXO['LIMITS']['shell_ports'])")
            if not self.allow.allows(host):
                raise FetchRefused(f"host {host!r} is not in NEXO['SHELL']['NETWORK'] ({self.allow.shown})")
            guard = Guard(
                self.allow,
                allow_private=self.policy.allow_private,
                resolve=self.policy.resolve or netguard.resolver,
                deadline=time.monotonic() + max(0.1, min(_CONNECT_TIMEOUT, self._left())),
                timeout=_CONNECT_TIMEOUT,
                private_hint=PRIVATE_HINT,
            )
            addresses = guard.addresses(host, port)
        except FetchRefused as exc:
            why = str(exc).removeprefix("fetch refused: ")
            self.log.append(("refused", what, why))
            raise FetchRefused(f"the sandbox's egress proxy refused {what}: {why}") from None
        failure: OSError | None = None
        for ip in addresses:
            try:
                sock = socket.create_connection((str(ip), port), timeout=max(0.1, min(_CONNECT_TIMEOUT, self._left())))
            except OSError as exc:
                failure = exc
                continue
            self.log.append(("allowed", what, str(ip)))
            return self._track(sock)
        self.log.append(("refused", what, f"no address accepted a connection ({failure})"))
        raise FetchRefused(f"the sandbox's egress proxy could not connect to {host}:{port} ({failure})")

    def _relay(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        with selectors.DefaultSelector() as selector:
            for sock in peers:
                sock.setblocking(True)
                sock.settimeout(None)
                selector.register(sock, selectors.EVENT_READ)
            while not self._closed:
                left = self._left()
                if left <= 0:
                    return
                for key, _ in selector.select(min(left, 1.0)):
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = src.recv(65536)
                    if not data:
                        return
                    peers[src].sendall(data)


def _read_head(sock: socket.socket) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > _HEAD_MAX:
            _refuse(sock, "request head too long", status=b"431 Request Header Fields Too Large")
            return None
        chunk = sock.recv(4096)
        if not chunk:
            return None
        data += chunk
    return data


def _parse(head: bytes) -> tuple[str, str, bytes]:
    text, _, rest = head.partition(b"\r\n\r\n")
    first = text.split(b"\r\n", 1)[0].decode("latin-1")
    parts = first.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise OSError("not an HTTP request")
    return parts[0].upper(), parts[1], rest


def _split_authority(authority: str) -> tuple[str, int]:
    host, sep, port = authority.rpartition(":")
    if not sep or not port.isdigit():
        raise FetchRefused(f"CONNECT needs host:port, not {authority!r}")
    return host.strip("[]"), int(port)


def _split_url(url: str) -> tuple[str, int, str]:
    if not url.lower().startswith("http://"):
        raise FetchRefused(
            f"only absolute http:// URLs are proxied as plain requests, not {url[:80]!r} (https goes through CONNECT)"
        )
    rest = url[7:]
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        raise FetchRefused("a URL with credentials (user info before '@') is not proxied")
    if authority.startswith("["):
        host, _, port_text = authority[1:].partition("]")
        port_text = port_text.removeprefix(":")
    else:
        host, _, port_text = authority.partition(":")
    if port_text and not port_text.isdigit():
        raise FetchRefused(f"bad port in {url[:80]!r}")
    return host, int(port_text) if port_text else 80, "/" + path if slash else "/"


def _origin_request(method: str, path: str, head: bytes, rest: bytes) -> bytes:
    """The request as the origin server expects it: origin-form path, no proxy headers, one
    request per connection (a second request could not be checked)."""
    lines = head.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]
    kept = [line for line in lines if not line.lower().startswith((b"proxy-", b"connection:", b"keep-alive:"))]
    first = f"{method} {path} HTTP/1.1".encode("latin-1")
    return b"\r\n".join([first, *kept, b"Connection: close"]) + b"\r\n\r\n" + rest


def _refuse(sock: socket.socket, why: str, status: bytes = b"403 Forbidden") -> None:
    body = (why + "\n").encode("utf-8", "replace")
    with suppress(OSError):
        sock.sendall(
            b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
