"""The SSRF guard behind ``fetch``: which URLs, hosts, ports and addresses may be reached.

The address check happens where the socket is opened. An httpcore network backend resolves the
name itself (through :data:`resolver`, the one I/O seam), refuses the connection unless *every*
answer is allowed, then connects to one of those exact addresses. The Host header and the TLS
server name stay the hostname. So a redirect, a second connection or a DNS answer that changed
since an earlier check (rebinding) is judged on the address actually used.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
#: ``resolver(host, port)`` returns the addresses ``host`` resolves to, as strings.
Resolver = Callable[[str, int], Sequence[str]]

PRIVATE_HINT = "set NEXO['LIMITS']['fetch_allow_private'] = True to reach private addresses"


class FetchRefused(Exception):
    """The guard refused a URL, a host or an address. The message is shown to the model."""


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    found: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in found:
            found.append(address)
    return found


#: What names resolve to. Looked up at every connection, so tests can put a fake here.
resolver: Resolver = system_resolver


# --- addresses ---------------------------------------------------------------------------

_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")
_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
_METADATA = ipaddress.IPv4Address("169.254.169.254")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_ULA = ipaddress.IPv6Network("fc00::/7")


@dataclass(frozen=True)
class AddressClass:
    """Why an address is not public. ``private`` ones open with ``fetch_allow_private``;
    the others (metadata, multicast, reserved...) never do."""

    label: str
    private: bool


def _hidden_ipv4(ip: ipaddress.IPv6Address) -> list[tuple[str, ipaddress.IPv4Address]]:
    hidden: list[tuple[str, ipaddress.IPv4Address]] = []
    if ip.ipv4_mapped is not None:
        hidden.append(("IPv4-mapped", ip.ipv4_mapped))
    if ip in _NAT64:
        hidden.append(("NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)))
    if ip.sixtofour is not None:
        hidden.append(("6to4", ip.sixtofour))
    if ip.teredo is not None:
        server, client = ip.teredo
        hidden += [("Teredo", server), ("Teredo", client)]
    return hidden


def classify(ip: IPAddress) -> AddressClass | None:
    """``None`` for a globally routable address, else the class that blocks it."""
    if isinstance(ip, ipaddress.IPv6Address):
        for how, inner in _hidden_ipv4(ip):
            found = classify(inner)
            if found is not None:
                return AddressClass(f"{how} IPv6 address hiding {inner} ({found.label})", found.private)
        if ip.ipv4_mapped is not None or ip in _NAT64:
            return None  # it *is* (or is the translator's route to) that public IPv4 address
    v4 = isinstance(ip, ipaddress.IPv4Address)
    if ip.is_unspecified:
        return AddressClass("unspecified address", False)
    if v4 and ip in _THIS_NETWORK:
        return AddressClass("'this network' address (0.0.0.0/8)", False)
    if ip.is_link_local:
        what = ", the cloud metadata endpoint" if ip == _METADATA else ""
        return AddressClass(f"link-local address ({'169.254.0.0/16' if v4 else 'fe80::/10'}{what})", False)
    if ip.is_multicast:
        return AddressClass("multicast address", False)
    if ip.is_loopback:
        return AddressClass("loopback address", True)
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return AddressClass("site-local address (fec0::/10)", False)
    if ip.is_reserved:
        return AddressClass("reserved address", False)
    if v4 and ip in _CGNAT:
        return AddressClass("carrier-grade NAT address (100.64.0.0/10)", True)
    if not v4 and ip in _ULA:
        return AddressClass("unique-local address (fc00::/7)", True)
    if ip.is_private:
        return AddressClass("private address", True)
    if not ip.is_global:
        return AddressClass("special-purpose address (not globally routable)", True)
    return None


def ipv4_literal(host: str) -> ipaddress.IPv4Address | None:
    """Read ``host`` the way inet_aton (and so getaddrinfo) does: ``127.1``, ``0x7f.1``,
    ``2130706433`` and ``0177.0.0.1`` are all 127.0.0.1."""
    if not host or not re.fullmatch(r"[0-9a-fx.]+", host, flags=re.IGNORECASE):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def ip_literal(host: str) -> IPAddress | None:
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise FetchRefused(f"fetch refused: {host!r} is not a valid IPv6 address ({exc})") from None
    return ipv4_literal(host)


# --- hosts and the allow-list ------------------------------------------------------------

_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")


def canonical_host(raw: str) -> str:
    """Lowercase, IDNA (as httpx encodes it), no trailing dot; IP literals in canonical form."""
    host = raw.strip("[]") if raw.startswith("[") else raw
    if ":" in host:
        if "%" in host:
            raise FetchRefused(f"fetch refused: IPv6 zone ids are not allowed ({raw!r})")
        return str(ip_literal(host))
    host = host.lower()
    if host.endswith("."):
        host = host[:-1]
    literal = ipv4_literal(host)
    if literal is not None:
        return str(literal)
    if not host.isascii():
        try:
            host = (httpx.URL(f"http://{host}/").raw_host or b"").decode("ascii")
        except httpx.InvalidURL as exc:
            raise FetchRefused(f"fetch refused: host {raw!r} is not a valid host name ({exc})") from None
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise FetchRefused(f"fetch refused: host {raw!r} is not a valid host name")
    return host


@dataclass(frozen=True)
class AllowList:
    """Exact hosts, ``*.example.com`` for strict subdomains (any depth, never the apex), or
    ``*`` for any host. IP literals match only themselves."""

    hosts: frozenset[str]
    parents: tuple[str, ...]
    any_host: bool
    shown: str

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        hosts: set[str] = set()
        parents: list[str] = []
        any_host = False
        given = list(entries)
        for entry in given:
            if not isinstance(entry, str) or not entry.strip():
                raise FetchRefused(f"fetch_allow entry {entry!r} is not a host name")
            text = entry.strip()
            if text == "*":
                any_host = True
                continue
            if any(c in text for c in "/?#@\\") or (text.count(":") == 1):
                raise FetchRefused(
                    f"fetch_allow entry {entry!r} must be a bare host name such as 'example.com' "
                    "(no scheme, port or path; ports come from NEXO['LIMITS']['fetch_ports'])"
                )
            try:
                if text.startswith("*."):
                    parent = canonical_host(text[2:])
                    if ip_literal(parent) is not None:
                        raise FetchRefused("a wildcard cannot cover an IP address")
                    parents.append("." + parent)
                else:
                    hosts.add(canonical_host(text))
            except FetchRefused as exc:
                raise FetchRefused(f"fetch_allow entry {entry!r} is not usable: {exc}") from None
        return cls(frozenset(hosts), tuple(parents), any_host, ", ".join(given) or "nothing")

    def allows(self, host: str) -> bool:
        """``host`` must already be canonical (see :func:`canonical_host`)."""
        if self.any_host or host in self.hosts:
            return True
        if ip_literal(host) is not None:
            return False
        return any(host.endswith(parent) for parent in self.parents)


# --- URLs --------------------------------------------------------------------------------

_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})


def bad_character(text: str) -> str | None:
    for char in text:
        if unicodedata.category(char) in _FORBIDDEN_CATEGORIES:
            return char
    return None


@dataclass(frozen=True)
class Target:
    url: httpx.URL
    host: str  # canonical
    port: int


def check_url(url: str, allow: AllowList, ports: Iterable[int]) -> Target:
    """Scheme, credentials, characters, port and host of one URL (the first or a redirect)."""
    bad = bad_character(url)
    if bad is not None:
        raise FetchRefused(
            f"fetch refused: the URL contains a control or whitespace character {bad!r}; "
            "percent-encode it or remove it"
        )
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in ("http", "https"):
        raise FetchRefused(f"fetch refused: scheme {scheme or '(none)'!r} is not allowed; only http and https")
    authority = url.split("//", 1)[1] if "//" in url else ""
    authority = re.split(r"[/?#]", authority, maxsplit=1)[0]
    if "\\" in authority:
        raise FetchRefused("fetch refused: a backslash in the host part of the URL is not allowed")
    if "@" in authority:
        raise FetchRefused("fetch refused: the URL carries credentials (user info before '@'); remove them")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise FetchRefused(f"fetch refused: not a valid URL ({exc})") from None
    if parsed.userinfo:
        raise FetchRefused("fetch refused: the URL carries credentials (user info before '@'); remove them")
    if not parsed.raw_host:
        raise FetchRefused(f"fetch refused: the URL {url!r} has no host")
    host = canonical_host(parsed.raw_host.decode("ascii"))
    port = parsed.port if parsed.port is not None else (443 if parsed.scheme == "https" else 80)
    allowed_ports = tuple(ports)
    if port not in allowed_ports:
        raise FetchRefused(
            f"fetch refused: port {port} of host {host!r} is not allowed "
            f"(allowed: {', '.join(map(str, allowed_ports))}; NEXO['LIMITS']['fetch_ports'])"
        )
    if not allow.allows(host):
        raise FetchRefused(
            f"fetch refused: host {host!r} is not in this agent's fetch_allow ({allow.shown})"
        )
    return Target(parsed, host, port)


# --- connections -------------------------------------------------------------------------


class Guard:
    """One fetch: its allow-list, address policy, resolver and total deadline."""

    def __init__(
        self,
        allow: AllowList,
        *,
        allow_private: bool,
        resolve: Resolver,
        deadline: float,
        timeout: float,
    ) -> None:
        self.allow = allow
        self.allow_private = allow_private
        self.resolve = resolve
        self.deadline = deadline
        self.timeout = timeout
        #: every address this guard let a socket connect to, in order.
        self.connected: list[str] = []

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise FetchRefused(
                f"fetch stopped: the whole fetch took longer than {self.timeout:g} s "
                "(NEXO['LIMITS']['fetch_timeout'] is a total deadline)"
            )
        return left

    def addresses(self, host: str, port: int) -> list[IPAddress]:
        """Resolve ``host`` now and return its addresses, or refuse unless every one is allowed."""
        host = canonical_host(host)
        if not self.allow.allows(host):
            raise FetchRefused(f"fetch refused: host {host!r} is not in this agent's fetch_allow ({self.allow.shown})")
        literal = ip_literal(host)
        found = [literal] if literal is not None else self._lookup(host, port)
        for ip in found:
            problem = classify(ip)
            if problem is None or (problem.private and self.allow_private):
                continue
            hint = PRIVATE_HINT if problem.private else "never fetched, whatever the settings"
            if literal is not None:
                why = f"{ip} is a blocked {problem.label}"
            elif len(found) == 1:
                why = f"host {host!r} resolves to {ip}, a blocked {problem.label}"
            else:
                listed = ", ".join(map(str, found))
                why = (
                    f"host {host!r} resolves to {listed}; {ip} is a blocked {problem.label}, "
                    "and every address a name resolves to must be allowed"
                )
            raise FetchRefused(f"fetch refused: {why}; {hint}")
        return found

    def _lookup(self, host: str, port: int) -> list[IPAddress]:
        # getaddrinfo cannot be cancelled: wait for it in a daemon thread, up to the deadline.
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["answer"] = list(self.resolve(host, port))
            except Exception as exc:  # reported below, with the host
                box["error"] = exc

        thread = threading.Thread(target=work, name=f"nexo-resolve-{host}", daemon=True)
        thread.start()
        thread.join(self.remaining())
        if thread.is_alive():
            self.remaining()
            raise FetchRefused(f"fetch stopped: resolving host {host!r} outlasted the deadline")
        if "error" in box:
            raise FetchRefused(f"fetch failed: cannot resolve host {host!r} ({box['error']})")
        answer: list[IPAddress] = []
        for text in box["answer"]:
            try:
                answer.append(ipaddress.ip_address(str(text)))
            except ValueError:
                raise FetchRefused(f"fetch failed: host {host!r} resolved to {text!r}, not an address") from None
        if not answer:
            raise FetchRefused(f"fetch failed: host {host!r} resolves to no address")
        return answer


def _cap(timeout: float | None, remaining: float) -> float:
    return remaining if timeout is None else min(timeout, remaining)


class _DeadlineStream(httpcore.NetworkStream):
    """Every read and write waits at most until the fetch's total deadline."""

    def __init__(self, inner: httpcore.NetworkStream, guard: Guard) -> None:
        self._inner = inner
        self._guard = guard

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _cap(timeout, self._guard.remaining()))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _cap(timeout, self._guard.remaining()))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname, _cap(timeout, self._guard.remaining()))
        return _DeadlineStream(inner, self._guard)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class GuardedBackend(httpcore.NetworkBackend):
    """Resolves and validates at connect time, then connects to the validated address."""

    def __init__(self, guard: Guard) -> None:
        self._guard = guard
        self._plain = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        failure: Exception | None = None
        for ip in self._guard.addresses(host, port):
            try:
                stream = self._plain.connect_tcp(
                    str(ip),
                    port,
                    timeout=_cap(timeout, self._guard.remaining()),
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
                continue
            self._guard.connected.append(str(ip))
            return _DeadlineStream(stream, self._guard)
        raise failure or FetchRefused(f"fetch failed: no address of {host!r} accepted a connection")

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        raise FetchRefused("fetch refused: unix sockets are never fetched")


class GuardedTransport(httpx.HTTPTransport):
    """An httpx transport whose every connection goes through a :class:`GuardedBackend`."""

    def __init__(self, guard: Guard) -> None:
        # trust_env=False: no proxy and no CA bundle taken from the environment.
        ssl_context = httpx.create_ssl_context(trust_env=False)
        super().__init__(verify=ssl_context, trust_env=False, retries=0)
        self._pool.close()
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=4,
            http1=True,
            http2=False,
            retries=0,
            network_backend=GuardedBackend(guard),
        )
