"""``fetch`` and ``search``: the web tools. The SSRF guard lives in ``netguard``.

See docs/web-tools.md for the settings and limits.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from . import netguard
from .base import Limits, Tool, ToolContext, ToolResult, error
from .netguard import (
    AllowList,
    FetchRefused,
    Guard,
    GuardedTransport,
    Resolver,
    bad_character,
    check_url,
)

USER_AGENT = "nexo-django-fetch/0.1"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_TEXT_TYPES = ("json", "xml", "javascript", "ecmascript", "x-www-form-urlencoded", "yaml", "csv")


class _Decoder:
    """Content-Encoding decoding that never produces more than it is asked for: a gzip bomb
    stops at the byte cap instead of inflating a whole network chunk in memory."""

    def __init__(self, encoding: str) -> None:
        name = encoding.strip().lower()
        self._raw_deflate_tried = name != "deflate"
        if name in ("", "identity"):
            self._z: Any = None
        elif name in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif name == "deflate":
            self._z = zlib.decompressobj()
        else:
            raise FetchRefused(f"fetch failed: content-encoding {encoding!r} is not supported (gzip, deflate)")

    def feed(self, data: bytes, room: int) -> bytes:
        if self._z is None:
            return data[:room]
        try:
            return bytes(self._z.decompress(data, room))
        except zlib.error as exc:
            if self._raw_deflate_tried:
                raise FetchRefused(f"fetch failed: the body is not valid compressed data ({exc})") from None
            # "deflate" is sent both zlib-wrapped (as specified) and raw (as some servers do).
            self._raw_deflate_tried = True
            self._z = zlib.decompressobj(-zlib.MAX_WBITS)
            return bytes(self._z.decompress(data, room))

    def finish(self, room: int) -> bytes:
        return bytes(self._z.flush())[:room] if self._z is not None else b""


def _is_text(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return not kind or kind.startswith("text/") or any(word in kind for word in _TEXT_TYPES)


def _read_body(response: httpx.Response, guard: Guard, cap: int) -> tuple[bytes, bool]:
    decoder = _Decoder(response.headers.get("content-encoding", ""))
    body = bytearray()
    for chunk in response.iter_raw():
        guard.remaining()
        body += decoder.feed(chunk, cap + 1 - len(body))
        if len(body) > cap:
            return bytes(body[:cap]), True
    body += decoder.finish(cap + 1 - len(body))
    if len(body) > cap:
        return bytes(body[:cap]), True
    return bytes(body), False


def _result(response: httpx.Response, guard: Guard, limits: Limits, hops: list[str]) -> ToolResult:
    content_type = response.headers.get("content-type", "")
    result: ToolResult = {"url": str(response.url), "status": response.status_code, "content_type": content_type}
    if hops:
        result["redirects"] = hops
    if not _is_text(content_type):
        result["text"] = ""
        result["note"] = f"binary content ({content_type}) is not shown"
        return result
    body, truncated = _read_body(response, guard, limits.fetch_max_bytes)
    try:
        text = body.decode(response.charset_encoding or "utf-8", errors="replace")
    except LookupError:  # an unknown charset name from the server
        text = body.decode("utf-8", errors="replace")
    if truncated:
        text += f"\n[nexo: body truncated at {limits.fetch_max_bytes} bytes (fetch_max_bytes)]"
    result.update(text=text, truncated=truncated, bytes=len(body))
    return result


def guarded_fetch(
    url: str,
    *,
    allow: Iterable[str],
    limits: Limits,
    resolver: Resolver | None = None,
) -> ToolResult:
    """GET ``url`` behind the SSRF guard; follow redirects by hand, re-checking every hop.

    Returns ``{"url", "status", "content_type", "text", "truncated", "bytes"}`` (plus
    ``"redirects"``) or ``{"error": why}``. Never raises for a refused or failed fetch.
    """
    deadline = time.monotonic() + limits.fetch_timeout
    current = url
    hops: list[str] = []

    def where() -> str:
        return f" (after redirect {len(hops)} to {current})" if hops else ""

    try:
        allow_list = AllowList.parse(allow)
        guard = Guard(
            allow_list,
            allow_private=limits.fetch_allow_private,
            resolve=resolver or netguard.resolver,
            deadline=deadline,
            timeout=limits.fetch_timeout,
        )
        with httpx.Client(
            transport=GuardedTransport(guard),
            trust_env=False,
            follow_redirects=False,
            timeout=httpx.Timeout(limits.fetch_timeout),
            headers={"User-Agent": USER_AGENT, "Accept-Encoding": "gzip, deflate"},
        ) as client:
            while True:
                target = check_url(current, allow_list, limits.fetch_ports)
                # An early, clear refusal before any socket; the check that counts is the one
                # the backend makes again when it connects.
                guard.addresses(target.host, target.port)
                with client.stream("GET", target.url) as response:
                    location = response.headers.get("location")
                    if response.status_code not in _REDIRECTS or location is None:
                        return _result(response, guard, limits, hops)
                    if len(hops) >= limits.fetch_max_redirects:
                        raise FetchRefused(
                            f"fetch stopped: more than {limits.fetch_max_redirects} redirects "
                            "(NEXO['LIMITS']['fetch_max_redirects'])"
                        )
                    bad = bad_character(location)
                    if bad is not None:
                        raise FetchRefused(f"fetch refused: redirect Location contains the character {bad!r}")
                    current = str(response.url.join(location))
                    hops.append(current)
    except FetchRefused as exc:
        return error(f"{exc}{where()}")
    except httpx.TimeoutException as exc:
        if time.monotonic() >= deadline:
            return error(
                f"fetch stopped: the whole fetch took longer than {limits.fetch_timeout:g} s "
                f"(NEXO['LIMITS']['fetch_timeout'] is a total deadline){where()}"
            )
        return error(f"fetch failed: timed out ({exc}){where()}")
    except httpx.HTTPError as exc:
        return error(f"fetch failed: {type(exc).__name__}: {exc}{where()}")


def _fetch(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    return guarded_fetch(args["url"], allow=ctx.fetch_allow, limits=ctx.limits)


# --- search --------------------------------------------------------------------------------


def _field(item: Any, name: str) -> str:
    value = item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)
    return "" if value is None else str(value)


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def normalise_results(raw: Any, *, max_results: int, snippet_chars: int) -> list[dict[str, str]]:
    """Whatever a backend returned, as at most ``max_results`` ``{"title", "url", "snippet"}``."""
    if isinstance(raw, Mapping) and "results" in raw:
        raw = raw["results"]
    if raw is None:
        return []
    if isinstance(raw, (str, bytes, Mapping)) or not isinstance(raw, Iterable):
        raise TypeError(f"expected a list of results, got {type(raw).__name__}")
    results: list[dict[str, str]] = []
    for item in raw:
        if len(results) >= max_results:
            break
        url = _field(item, "url") or _field(item, "link")
        if not url:
            continue  # a result the model cannot cite or fetch is noise
        results.append(
            {
                "title": _clip(_field(item, "title"), 300),
                "url": url[:2048],
                "snippet": _clip(_field(item, "snippet") or _field(item, "content"), snippet_chars),
            }
        )
    return results


def _search(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    if ctx.search_backend is None:
        return error("search: no search backend is configured for this agent")
    query = " ".join(args["query"].split())
    if not query:
        return error("search: the query is empty")
    limit = ctx.limits.search_max_results
    try:
        results = normalise_results(
            ctx.search_backend(query, limit),
            max_results=limit,
            snippet_chars=ctx.limits.search_snippet_chars,
        )
    except Exception as exc:  # a backend's failure is the model's information, not a crash
        return error(f"search failed: the backend raised {type(exc).__name__}: {exc}")
    return {"query": query, "results": results}


FETCH = Tool(
    "fetch",
    "GET a web page from an allowed host and return its text.",
    {
        "type": "object",
        "properties": {"url": {"type": "string", "description": "An http(s) URL."}},
        "required": ["url"],
        "additionalProperties": False,
    },
    capability="fetch",
    idempotent=True,
    run=_fetch,
    detail=lambda args: args.get("url"),
)

SEARCH = Tool(
    "search",
    "Search the web; returns titles, URLs and snippets.",
    {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
        "additionalProperties": False,
    },
    capability="search",
    idempotent=True,
    run=_search,
    detail=lambda args: args.get("query"),
)
