"""The one HTTP path every model provider uses: a shared httpx client and a bounded retry.

Retried: 408, 429, every 5xx and transport errors (connect, read, timeouts), at most
``max_retries`` times. The wait is the server's ``Retry-After`` (seconds or an HTTP date;
``retry-after-ms`` first, as OpenAI sends it) when given, else exponential backoff with jitter.
A server asking for a longer wait than ``max_retry_wait`` fails at once instead of blocking a
worker. Any other status is a :class:`ProviderError` naming the provider, the status and the
provider's own message. The API key never appears in an error.
"""

from __future__ import annotations

import atexit
import contextlib
import email.utils
import functools
import json
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from ..errors import ConfigurationError, ModelError
from .sse import StreamError, iter_sse

__all__ = ["Endpoint", "ProviderError", "Retry", "check_base_url", "endpoint", "set_max_connections", "shared_client"]

RETRY_STATUSES = frozenset({408, 429})  # and every status >= 500
MESSAGE_CHARS = 600
USER_AGENT = "nexo-django/0.1"


class ProviderError(ModelError):
    """A provider call failed; ``status`` is the HTTP status, or ``None`` when none arrived."""

    def __init__(self, provider: str, message: str, *, status: int | None = None) -> None:
        super().__init__(f"{provider}: {message}")
        self.provider = provider
        self.status = status


@dataclass(frozen=True)
class Retry:
    """How often and how long to retry. ``sleep`` is injectable so tests need not wait."""

    max_retries: int = 3
    base: float = 0.5
    cap: float = 8.0
    max_retry_wait: float = 60.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    def backoff(self, attempt: int) -> float:
        # Jitter spreads the retries of many workers hit by the same outage.
        return min(self.cap, self.base * 2**attempt) * random.uniform(0.5, 1.0)


# --- the shared client ---------------------------------------------------------------------

_lock = threading.Lock()
#: The process's clients: one, or (past 50 connections) one per connection, each made when a
#: thread first needs it (``None`` until then).
_clients: list[httpx.Client | None] = []
_next_shard = 0
_local = threading.local()
#: The TLS context the clients share past 50 (each would load the CA certificates again).
_tls: Any = None
# Clients inherited across fork(): kept referenced so the child never finalises (and so never
# touches) sockets that belong to its parent's pool.
_inherited: list[httpx.Client] = []


#: Connections the shared client opens at most (:func:`set_max_connections`).
_max_connections = 50
#: Connections one client holds at most past 50: httpcore looks through every connection of its
#: pool when a request starts and when it ends, with a ``poll()`` of each idle one (every one lets
#: go of the interpreter's lock, for hundreds of threads to contend for), so a pool of 500 cost a
#: third of the concurrent worker's CPU, and one of 50 a sixth. Past 50, each thread keeps to a
#: client of its own.
SHARD_CONNECTIONS = 1


def set_max_connections(count: int) -> None:
    """Let the process open up to ``count`` provider connections at once (50 by default). A
    process carrying many runs at once (the concurrent worker) gives each run in flight its own,
    so no run waits for another's model request to end. Takes effect for clients not yet made."""
    global _max_connections
    if count < 1:
        raise ValueError(f"max connections must be at least 1, not {count}")
    with _lock:
        _max_connections = count


def shared_client() -> httpx.Client:
    """The process's pooled client for this thread, so turns and runs reuse provider connections:
    one client of 50 connections, or past 50 one of ``max connections / SHARD_CONNECTIONS``
    clients, each thread keeping to the one it was first given (round robin)."""
    global _next_shard
    shard = getattr(_local, "shard", None)
    clients = _clients
    if shard is not None and shard < len(clients):
        client = clients[shard]
        if client is not None:
            return client
    with _lock:
        if not _clients:
            _clients.extend([None] * _shards()[0])
        if shard is None or shard >= len(_clients):
            shard = _local.shard = _next_shard % len(_clients)
            _next_shard += 1
        client = _clients[shard]
        if client is None:
            client = _clients[shard] = _make_client()
        return client


def _shards() -> tuple[int, int]:
    """How many clients, and the connections of each."""
    if _max_connections <= 50:
        return 1, _max_connections
    shards = -(-_max_connections // SHARD_CONNECTIONS)
    return shards, -(-_max_connections // shards)


def _make_client() -> httpx.Client:
    global _tls
    shards, each = _shards()
    # Past the default, every connection is kept alive: the runs in flight reuse them.
    keepalive = 20 if _max_connections <= 50 else each
    limits = httpx.Limits(max_connections=each, max_keepalive_connections=keepalive, keepalive_expiry=30.0)
    if shards > 1 and _tls is None:
        _tls = httpx.create_ssl_context()
    return httpx.Client(headers={"user-agent": USER_AGENT}, limits=limits, verify=_tls if shards > 1 else True)


def _after_fork_in_child() -> None:
    # rq forks a work horse per job: the child must open its own connections.
    global _lock, _local
    _inherited.extend(client for client in _clients if client is not None)
    _clients.clear()
    _lock = threading.Lock()
    _local = threading.local()


def _close_at_exit() -> None:
    for client in _clients:
        if client is not None:
            client.close()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_at_exit)


# --- helpers -------------------------------------------------------------------------------


def check_base_url(provider: str, base_url: str, setting: str) -> str:
    url = base_url.strip().rstrip("/")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ConfigurationError(f"{provider}: base URL {base_url!r} is not a URL ({exc}); fix {setting}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigurationError(
            f"{provider}: base URL {base_url!r} must be an http:// or https:// URL; fix {setting}"
        )
    return url


@functools.lru_cache(maxsize=64)
def _parsed(url: str) -> httpx.URL:
    """A provider URL parsed once (a URL is immutable): parsing is a fifth of a request's CPU."""
    return httpx.URL(url)


def host_of(url: str) -> str:
    return _parsed(url).host.lower()


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asks us to wait, or ``None`` when it does not say (or says nonsense)."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            value = float(millis) / 1000
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def error_message(payload: Any, text: str) -> str:
    """The provider's own words for an error, from the body shapes servers actually send."""
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict):
            message = error.get("message")
            kind = error.get("type") or error.get("code")
            if message:
                return f"{kind}: {message}" if kind else str(message)
        if isinstance(error, str) and error:
            return error  # Ollama's and llama.cpp's older shape
        for key in ("message", "detail"):  # vLLM, FastAPI-based servers
            if payload.get(key):
                return str(payload[key])
    text = text.strip()
    return text if text else "(empty response body)"


def _shorten(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + "…"


def _display(url: str) -> str:
    # A base URL may carry credentials in its userinfo; errors never show them.
    return str(httpx.URL(url).copy_with(username=None, password=None))


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


# --- the request ---------------------------------------------------------------------------


class ProviderHTTP:
    """Posts JSON to a provider with the shared retry policy."""

    def __init__(
        self,
        provider: str,
        *,
        client: httpx.Client | None = None,
        timeout: float = 60.0,
        retry: Retry | None = None,
        secret: str | None = None,
    ) -> None:
        self.provider = provider
        self._client = client
        self.timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))
        self.retry = retry or Retry()
        self._secret = secret

    @property
    def client(self) -> httpx.Client:
        return self._client if self._client is not None else shared_client()

    @contextlib.contextmanager
    def _open(self, url: str, headers: Mapping[str, str], body: dict[str, Any]) -> Iterator[httpx.Response]:
        """Send the POST; the response, its body not read yet, is closed on leaving.

        A client given by the caller gets the request through its own ``send`` (its auth, event
        hooks, cookies, redirects). The shared client, which has none of those, hands it straight
        to the transport for its URL (proxies from the environment included), with the body
        encoded as httpx encodes ``json=`` and the client's default headers: the client's own
        layers cost about a quarter of a request's CPU, which a worker carrying hundreds of runs
        pays twice a run."""
        client = self.client
        if self._client is not None:
            request = client.build_request("POST", url, json=body, headers=dict(headers), timeout=self.timeout)
            response = client.send(request, stream=True)
        else:
            target = _parsed(url)
            content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
            merged = httpx.Headers(client.headers)
            merged["content-type"] = "application/json"
            merged.update(headers)
            request = httpx.Request("POST", target, headers=merged, content=content,
                                    extensions={"timeout": self.timeout.as_dict()})
            response = client._transport_for_url(target).handle_request(request)
            response.request = request
        try:
            yield response
        finally:
            response.close()

    def _fail(self, message: str, status: int | None = None) -> ProviderError:
        if self._secret:
            message = message.replace(self._secret, "[redacted]")
        return ProviderError(self.provider, _shorten(message), status=status)

    def post(
        self,
        url: str,
        headers: Mapping[str, str],
        body: dict[str, Any],
        *,
        permanent: Callable[[Any], bool] | None = None,
    ) -> dict[str, Any]:
        """POST ``body`` as JSON and return the decoded JSON object of a 2xx answer.

        ``permanent(payload)`` marks a retryable status that waiting cannot fix (a spent quota).
        """
        retry = self.retry
        attempt = 0
        while True:
            try:
                with self._open(url, headers, body) as response:
                    response.read()
            except httpx.TransportError as exc:
                wait = self._transport_wait(url, exc, attempt)
            else:
                status = response.status_code
                payload = _json_or_none(response)
                if 200 <= status < 300:
                    return self._object(url, status, payload, response.text)
                wait = self._status_wait(url, response, payload, attempt, permanent)
            retry.sleep(wait)
            attempt += 1

    def post_stream(
        self,
        url: str,
        headers: Mapping[str, str],
        body: dict[str, Any],
        *,
        start: Callable[[int], Any],
        permanent: Callable[[Any], bool] | None = None,
    ) -> dict[str, Any]:
        """POST ``body`` (which asks for a stream) and return the reply as the JSON object the
        provider answers without streaming. ``start(attempt)`` makes the assembler of one attempt
        (``sse.OpenAIStream``...); a stream cut off midway, or an error event inside it, is retried
        like a 5xx, and nothing of it is returned. A server that answers JSON instead of a stream
        is read as such."""
        retry = self.retry
        attempt = 0
        while True:
            try:
                with self._open(url, headers, body) as response:
                    status = response.status_code
                    if not 200 <= status < 300:
                        response.read()
                        wait = self._status_wait(url, response, _json_or_none(response), attempt, permanent)
                    elif "text/event-stream" not in response.headers.get("content-type", ""):
                        response.read()
                        return self._object(url, status, _json_or_none(response), response.text)
                    else:
                        assembler = start(attempt)
                        try:
                            for event, data in iter_sse(response.iter_lines()):
                                assembler.feed(event, data)
                                if assembler.done:
                                    break
                            else:
                                assembler.end()
                        except StreamError as exc:
                            if attempt >= retry.max_retries:
                                raise self._fail(
                                    f"the stream from {_display(url)} failed: {exc} (gave up after {attempt + 1} attempts)"
                                ) from None
                            wait = retry.backoff(attempt)
                        else:
                            result: dict[str, Any] = assembler.result()
                            return result
            except httpx.TransportError as exc:
                wait = self._transport_wait(url, exc, attempt)
            retry.sleep(wait)
            attempt += 1

    def _object(self, url: str, status: int, payload: Any, text: str) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise self._fail(
                f"{_display(url)} answered HTTP {status} with a body that is not a JSON object: {text.strip()[:200]!r}",
                status,
            )
        return payload

    def _transport_wait(self, url: str, exc: httpx.TransportError, attempt: int) -> float:
        """How long to wait before trying again after ``exc`` (a connection that failed or was cut
        midway), or the error when the retries are spent."""
        if attempt >= self.retry.max_retries:
            raise self._fail(
                f"could not reach {_display(url)} after {attempt + 1} attempt(s): "
                f"{type(exc).__name__}: {str(exc) or 'no detail'}"
            ) from None
        return self.retry.backoff(attempt)

    def _status_wait(
        self, url: str, response: httpx.Response, payload: Any, attempt: int, permanent: Callable[[Any], bool] | None,
    ) -> float:
        """How long to wait before trying again after a non-2xx answer, or its error."""
        retry = self.retry
        status = response.status_code
        message = f"HTTP {status} from {_display(url)}: {error_message(payload, response.text)}"
        retryable = status in RETRY_STATUSES or status >= 500
        if not retryable or (permanent is not None and permanent(payload)):
            raise self._fail(message, status)
        if attempt >= retry.max_retries:
            raise self._fail(f"{message} (gave up after {attempt + 1} attempts)", status)
        asked = retry_after(response.headers)
        if asked is not None and asked > retry.max_retry_wait:
            raise self._fail(
                f"{message} (the server asks to retry after {asked:.0f} s, longer than "
                f"max_retry_wait={retry.max_retry_wait:g} s)",
                status,
            )
        return asked if asked is not None else retry.backoff(attempt)


@dataclass
class Endpoint:
    """Where a provider is reached, with what key, through which retrying client."""

    base_url: str
    api_key: str | None
    http: ProviderHTTP


def endpoint(
    provider: str,
    *,
    env_prefix: str,
    default_base_url: str,
    official_host: str,
    base_url: str | None,
    api_key: str | None,
    client: httpx.Client | None,
    timeout: float,
    retry: Retry,
) -> Endpoint:
    """Resolve base URL and key from the arguments, then ``<PREFIX>_BASE_URL``/``<PREFIX>_API_KEY``.
    A key is required only for the provider's own host (a local server needs none)."""
    url = check_base_url(
        provider,
        base_url or os.environ.get(f"{env_prefix}_BASE_URL") or default_base_url,
        f'NEXO["PROVIDERS"]["{provider}"]["base_url"] or {env_prefix}_BASE_URL',
    )
    key = api_key or os.environ.get(f"{env_prefix}_API_KEY") or None
    if key is None and host_of(url) == official_host:
        raise ConfigurationError(
            f"{provider}: no API key for {official_host}; set the {env_prefix}_API_KEY environment "
            f'variable or NEXO["PROVIDERS"]["{provider}"]["api_key"]'
        )
    return Endpoint(url, key, ProviderHTTP(provider, client=client, timeout=timeout, retry=retry, secret=key))
