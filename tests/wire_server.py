"""A loopback HTTP server that plays scripted provider answers and records what it was sent.

Real sockets, real HTTP/1.1 with keep-alive, on 127.0.0.1 and an ephemeral port. Each request
takes the next scripted answer; when the script runs out the server answers 418 with a body
saying so, which the providers report as a non-retryable error and the test fails loudly.

``WireServer(rules=AnthropicRules())`` (or ``GeminiRules()``) also checks each request the way
that provider does and answers the provider's own 400 for one it would refuse (a thinking block
missing before a tool result, a changed signature, a tool call without its thought signature),
learning what it must see again from the answers it served. A refused request takes no answer
from the script.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import httpx


@dataclass
class Answer:
    status: int = 200
    body: Any = None  # dict/list → JSON, str/bytes → sent as is
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering (timeouts)
    #: a streamed answer: these Server-Sent Events, one chunk each (chunked transfer encoding)
    events: list[str] | None = None
    #: close the connection after the events, without the body's last chunk (a stream cut off)
    cut: bool = False

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


class Rules(Protocol):
    def refuse(self, body: Any) -> Answer | None: ...

    def served(self, answer: Answer) -> None: ...


THINKING_REQUIRED = (
    "messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{found}`. "
    "When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding "
    "the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks "
    "from previous turns. To avoid this requirement, disable `thinking`. Please consult our documentation "
    "at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)


def anthropic_error(message: str) -> Answer:
    return Answer(400, {"type": "error", "error": {"type": "invalid_request_error", "message": message},
                        "request_id": "req_011CWire400"})


class AnthropicRules:
    """What the Messages API refuses, as far as these tests reach: with ``thinking`` on, the last
    assistant turn before the final tool results must start with a thinking block; a thinking
    block must come back with the text and signature it was served with (redacted ones with their
    data); every ``tool_result`` answers a ``tool_use`` of the turn before; no empty text block."""

    def __init__(self) -> None:
        self.signatures: dict[str, str] = {}  # signature -> thinking text served with it
        self.redacted: set[str] = set()

    def served(self, answer: Answer) -> None:
        body = answer.body if isinstance(answer.body, dict) else {}
        for block in body.get("content") or ():
            if isinstance(block, dict) and block.get("type") == "thinking":
                self.signatures[str(block.get("signature"))] = str(block.get("thinking"))
            elif isinstance(block, dict) and block.get("type") == "redacted_thinking":
                self.redacted.add(str(block.get("data")))

    def refuse(self, body: Any) -> Answer | None:
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list):
            return anthropic_error("messages: Field required")
        for index, message in enumerate(messages):
            content = message.get("content")
            if not isinstance(content, list):
                continue
            for position, block in enumerate(content):
                kind = block.get("type")
                where = f"messages.{index}.content.{position}"
                if kind == "text" and not block.get("text"):
                    return anthropic_error("messages: text content blocks must be non-empty")
                if kind == "thinking" and self.signatures.get(str(block.get("signature"))) != block.get("thinking"):
                    return anthropic_error(f"{where}: Invalid `signature` in `thinking` block")
                if kind == "redacted_thinking" and block.get("data") not in self.redacted:
                    return anthropic_error(f"{where}: Invalid `data` in `redacted_thinking` block")
                if kind == "tool_result":
                    before = messages[index - 1].get("content") if index else None
                    uses = {b.get("id") for b in before or () if isinstance(b, dict) and b.get("type") == "tool_use"}
                    if block.get("tool_use_id") not in uses:
                        return anthropic_error(
                            f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: "
                            f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding "
                            "`tool_use` block in the previous message."
                        )
        thinking = body.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
            last_user = messages[-1] if messages else {}
            results = [b for b in last_user.get("content") or () if isinstance(b, dict) and b.get("type") == "tool_result"]
            if results and len(messages) >= 2:
                index = len(messages) - 2
                first = (messages[index].get("content") or [{}])[0]
                if first.get("type") not in ("thinking", "redacted_thinking"):
                    return anthropic_error(THINKING_REQUIRED.format(index=index, found=first.get("type")))
        return None


def gemini_error(message: str) -> Answer:
    # The OpenAI-compatible endpoint wraps Google's error object in a list.
    return Answer(400, [{"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}])


class GeminiRules:
    """Gemini's OpenAI-compatible endpoint: a tool call it served with a thought signature
    (``extra_content.google.thought_signature``) must come back with that same signature."""

    def __init__(self) -> None:
        self.signatures: dict[str, str] = {}  # tool call id -> signature

    def served(self, answer: Answer) -> None:
        body = answer.body if isinstance(answer.body, dict) else {}
        for choice in body.get("choices") or ():
            for call in (choice.get("message") or {}).get("tool_calls") or ():
                signature = ((call.get("extra_content") or {}).get("google") or {}).get("thought_signature")
                if signature:
                    self.signatures[str(call.get("id"))] = str(signature)

    def refuse(self, body: Any) -> Answer | None:
        for position, message in enumerate(body.get("messages") or ()):
            for call in message.get("tool_calls") or ():
                wanted = self.signatures.get(str(call.get("id")))
                got = ((call.get("extra_content") or {}).get("google") or {}).get("thought_signature")
                if wanted is not None and got != wanted:
                    name = (call.get("function") or {}).get("name")
                    return gemini_error(
                        "Function call is missing a thought_signature in functionCall parts. This is required "
                        "for tools to work correctly, and missing thought_signature may lead to degraded model "
                        f"performance. Additional data, function call `default_api:{name}` , position "
                        f"{position + 1}. Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures "
                        "for more details."
                    )
        return None


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
        if answer.events is not None:
            self._stream(answer)
            return
        data, content_type = answer.encode()
        self.send_response(answer.status)
        headers = {"content-type": content_type, **answer.headers}
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST

    def _stream(self, answer: Answer) -> None:
        """The events as a provider streams them: ``text/event-stream``, chunked, each event
        flushed on its own; with ``cut`` the connection is closed before the end of the body."""
        self.send_response(answer.status)
        for name, value in {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache",
                            "transfer-encoding": "chunked", **answer.headers}.items():
            self.send_header(name, value)
        self.end_headers()
        for event in answer.events or ():
            data = event.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        if answer.cut:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(b"0\r\n\r\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, rules: Rules | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.rules = rules
        self.lock = threading.Lock()
        self.script: list[Answer] = []
        self.requests: list[Received] = []
        self.connections: set[socket.socket] = set()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that stops reading a stream once it has what it needs resets the connection.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def track(self, connection: socket.socket) -> None:
        with self.lock:
            self.connections.add(connection)

    def next_answer(self, received: Received) -> Answer:
        with self.lock:
            self.requests.append(received)
            if self.rules is not None:
                refused = self.rules.refuse(received.body)
                if refused is not None:
                    return refused
            if self.script:
                answer = self.script.pop(0)
                if self.rules is not None:
                    self.rules.served(answer)
                return answer
        return Answer(418, {"error": {"message": "wire server: no scripted answer left", "type": "test"}})


class WireServer:
    """``with WireServer() as server: server.play(Answer(...)); ... server.requests``"""

    def __init__(self, rules: Rules | None = None) -> None:
        self._server = _Server(rules)
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


# --- streamed answers, event by event as each provider sends them -------------------------------


def sse_event(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def openai_stream(
    pieces: Sequence[str] = (),
    *, tool_calls: Sequence[dict[str, Any]] = (),
    finish: str = "stop", usage: dict[str, int] | None = None, model: str = "gpt-4.1-mini",
) -> list[str]:
    """Chat Completions chunks as OpenAI streams them with ``stream_options.include_usage``: a
    first chunk with the role, one per text piece, each tool call's name then its arguments in
    pieces, the finish reason, a last chunk with the usage and no choices, then ``[DONE]``."""
    head = {"id": "chatcmpl-wire", "object": "chat.completion.chunk", "created": 1764633600, "model": model,
            "system_fingerprint": "fp_wire"}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
        return sse_event({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                               "finish_reason": finish_reason}], "usage": None})

    events = [chunk({"role": "assistant", "content": "", "refusal": None})]
    events += [chunk({"content": piece}) for piece in pieces]
    for index, call in enumerate(tool_calls):
        events.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                             "function": {"name": call["name"], "arguments": ""}}]}))
        arguments = json.dumps(call["args"])
        for start in range(0, len(arguments), 7):
            events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[start:start + 7]}}]}))
    events.append(chunk({}, finish))
    usage = usage or {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    events.append(sse_event({**head, "choices": [], "usage": usage}))
    events.append(sse_event("[DONE]"))
    return events


def anthropic_stream(
    blocks: list[dict[str, Any]], *, stop_reason: str = "end_turn", input_tokens: int = 25, output_tokens: int = 15,
    model: str = "claude-sonnet-4-5",
) -> list[str]:
    """Messages API events as Anthropic streams them: ``message_start``, a ``ping``, for each block
    ``content_block_start``, its deltas (text in pieces, tool input as ``input_json_delta``
    pieces, thinking then its ``signature_delta``) and ``content_block_stop``, then
    ``message_delta`` with the stop reason and the output tokens, and ``message_stop``."""
    events = [sse_event({"type": "message_start", "message": {
        "id": "msg_wire", "type": "message", "role": "assistant", "content": [], "model": model,
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                  "output_tokens": 1}}}, "message_start"),
        sse_event({"type": "ping"}, "ping")]

    def delta(index: int, body: dict[str, Any]) -> str:
        return sse_event({"type": "content_block_delta", "index": index, "delta": body}, "content_block_delta")

    for index, block in enumerate(blocks):
        kind = block["type"]
        start = {"text": {"type": "text", "text": ""}, "thinking": {"type": "thinking", "thinking": "", "signature": ""},
                 "tool_use": {"type": "tool_use", "id": block.get("id"), "name": block.get("name"), "input": {}}}.get(kind, block)
        events.append(sse_event({"type": "content_block_start", "index": index, "content_block": start}, "content_block_start"))
        if kind == "text":
            text = block["text"]
            events += [delta(index, {"type": "text_delta", "text": text[i:i + 5]}) for i in range(0, len(text), 5)]
        elif kind == "thinking":
            events.append(delta(index, {"type": "thinking_delta", "thinking": block["thinking"]}))
            events.append(delta(index, {"type": "signature_delta", "signature": block["signature"]}))
        elif kind == "tool_use":
            arguments = json.dumps(block["input"])
            events.append(delta(index, {"type": "input_json_delta", "partial_json": ""}))
            events += [delta(index, {"type": "input_json_delta", "partial_json": arguments[i:i + 6]})
                       for i in range(0, len(arguments), 6)]
        events.append(sse_event({"type": "content_block_stop", "index": index}, "content_block_stop"))
    events.append(sse_event({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                             "usage": {"output_tokens": output_tokens}}, "message_delta"))
    events.append(sse_event({"type": "message_stop"}, "message_stop"))
    return events


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


#: the two ways a model object reaches a provider (the ``client`` fixture of the provider tests)
CLIENTS = ("own client", "shared client")


def provider_client(kind: str) -> Iterator[httpx.Client | None]:
    """A client of the caller's (its requests go through httpx's ``Client.send``), or none: the
    process's shared client, whose requests go straight to its transport (``ProviderHTTP._open``)."""
    if kind == "shared client":
        yield None
        return
    with httpx.Client() as http_client:
        yield http_client
