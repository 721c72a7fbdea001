"""A tiny SMTP server on a free loopback port, for the one test that sends real mail (no
package for it is installed). It speaks enough of RFC 5321 for Django's SMTP backend: EHLO/HELO,
MAIL, RCPT, DATA (dot-unstuffed), RSET, NOOP, QUIT; every message is kept in ``messages``."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message


@dataclass
class Received:
    sender: str
    recipients: list[str]
    data: bytes

    def message(self) -> Message:
        return message_from_bytes(self.data)


@dataclass
class SMTPServer:
    host: str = "127.0.0.1"
    port: int = 0
    messages: list[Received] = field(default_factory=list)
    connections: int = 0

    def __post_init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((self.host, self.port))
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="test-smtp")

    def __enter__(self) -> SMTPServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(10)
                try:
                    self._session(conn.makefile("rb"), conn)
                except (OSError, ValueError):
                    continue

    def _session(self, reader: object, conn: socket.socket) -> None:
        def say(line: str) -> None:
            conn.sendall(line.encode("ascii") + b"\r\n")

        say("220 localhost test SMTP")
        sender, recipients = "", []
        for _ in range(1000):  # bounded: a session is a handful of commands
            raw = reader.readline(65536)  # type: ignore[attr-defined]
            if not raw:
                return
            command = raw.decode("utf-8", "replace").strip()
            verb = command[:4].upper()
            if verb in ("EHLO", "HELO"):
                say("250-localhost" if verb == "EHLO" else "250 localhost")
                if verb == "EHLO":
                    say("250 8BITMIME")
            elif verb == "MAIL":
                sender, recipients = command.split(":", 1)[1].strip().strip("<>").split(">")[0], []
                say("250 OK")
            elif verb == "RCPT":
                recipients.append(command.split(":", 1)[1].strip().strip("<>"))
                say("250 OK")
            elif verb == "DATA":
                say("354 End data with <CR><LF>.<CR><LF>")
                lines = []
                for _ in range(1_000_000):
                    line = reader.readline(1 << 20)  # type: ignore[attr-defined]
                    if not line or line in (b".\r\n", b".\n"):
                        break
                    lines.append(line[1:] if line.startswith(b"..") else line)
                self.messages.append(Received(sender, recipients, b"".join(lines)))
                say("250 OK queued")
            elif verb == "QUIT":
                say("221 Bye")
                return
            elif verb in ("RSET", "NOOP"):
                say("250 OK")
            else:
                say("502 Command not implemented")
