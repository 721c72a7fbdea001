"""``fetch`` behind the SSRF guard, attacked for real against loopback listeners.

Nothing here sends traffic anywhere but loopback. Names resolve through a fake resolver (the
guard's one I/O seam); an audit hook, armed for every test of this module, refuses and records
any socket connect or name lookup that would leave the machine, so a guard that let one
through fails the test instead of reaching the network. Listeners on 127.0.0.1 and ::1 (same
port) count the connections they accept: where the guard must block, the count stays zero.
"""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import socket
import ssl
import subprocess
import sys
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nexo_django import Agent, Permissions
from nexo_django.core.tools import netguard
from nexo_django.core.tools.base import Limits
from nexo_django.core.tools.web import guarded_fetch

Route = Callable[[http.server.BaseHTTPRequestHandler], None]

# --- the safety net: no socket leaves loopback -------------------------------------------------

_ARMED = [False]
OUTSIDE: list[tuple[str, Any]] = []


def _is_loopback(host: Any) -> bool:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if host == "localhost":  # another test's server thread may look it up while we are armed
        return True
    try:
        ip = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _ARMED[0]:
        return
    if event == "socket.connect":
        address = args[1]
        if isinstance(address, tuple) and not _is_loopback(address[0]):
            OUTSIDE.append(("connect", address))
            raise ConnectionRefusedError(f"test safety net: refused a connect to {address!r}")
    elif event == "socket.getaddrinfo" and args[0] is not None and not _is_loopback(args[0]):
        OUTSIDE.append(("getaddrinfo", args[0]))
        raise OSError(f"test safety net: refused a real name lookup of {args[0]!r}")


sys.addaudithook(_audit)


@pytest.fixture(autouse=True)
def no_outside_traffic() -> Iterator[list[tuple[str, Any]]]:
    OUTSIDE.clear()
    _ARMED[0] = True
    try:
        yield OUTSIDE
    finally:
        _ARMED[0] = False


# --- loopback listeners ------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Any
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.server.site.requests.append((self.path, self.headers.get("Host")))
        route = self.server.site.routes.get(self.path.split("?", 1)[0], not_found)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the guard hung up on purpose
            route(self)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Listener(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, site: Site, address: tuple[str, int], family: socket.AddressFamily) -> None:
        self.address_family = family
        self.site = site
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # the guard hangs up on purpose
            super().handle_error(request, client_address)

    def get_request(self) -> tuple[socket.socket, Any]:
        request = super().get_request()
        with self.site.lock:
            self.site.accepted += 1
        return request


class Site:
    """One HTTP site on 127.0.0.1:PORT and [::1]:PORT, counting accepted connections."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {"/": text("hello from the loopback site")}
        self.requests: list[tuple[str, str | None]] = []
        self.accepted = 0
        self.lock = threading.Lock()
        for _attempt in range(20):
            v6 = _Listener(self, ("::1", 0), socket.AF_INET6)
            try:
                v4 = _Listener(self, ("127.0.0.1", v6.server_address[1]), socket.AF_INET)
            except OSError:
                v6.server_close()
                continue
            break
        else:
            raise RuntimeError("no port free on both 127.0.0.1 and ::1")
        self.listeners = [v4, v6]
        self.port = int(v4.server_address[1])
        self.threads = [threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True) for s in self.listeners]
        for thread in self.threads:
            thread.start()

    def url(self, path: str = "/", host: str = "site.test") -> str:
        return f"http://{host}:{self.port}{path}"

    def limits(self, **overrides: Any) -> Limits:
        values: dict[str, Any] = {"fetch_ports": (self.port,), "fetch_timeout": 5.0}
        values.update(overrides)
        return Limits(**values)

    def close(self) -> None:
        for listener in self.listeners:
            listener.shutdown()
            listener.server_close()


@pytest.fixture
def site() -> Iterator[Site]:
    server = Site()
    try:
        yield server
    finally:
        server.close()


def respond(handler: Any, status: int, body: bytes, headers: dict[str, str]) -> None:
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def text(body: str, content_type: str = "text/plain; charset=utf-8", status: int = 200) -> Route:
    return lambda h: respond(h, status, body.encode(), {"Content-Type": content_type})


def redirect(location: str, status: int = 302) -> Route:
    return lambda h: respond(h, status, b"", {"Location": location})


def not_found(handler: Any) -> None:
    respond(handler, 404, b"no such page", {"Content-Type": "text/plain"})


class FakeDNS:
    """The resolver seam: canonical names to addresses. A list of lists answers call by call
    (the last answer repeats), which is how a rebinding DNS server behaves."""

    def __init__(self, names: dict[str, Any]) -> None:
        self.names = names
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        if host not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} is not a name in this test")
        answer = self.names[host]
        if answer and isinstance(answer[0], list):
            return list(answer[min(self.calls.count(host), len(answer)) - 1])
        return list(answer)


def loopback_dns(**extra: Any) -> FakeDNS:
    return FakeDNS({"site.test": ["127.0.0.1"], **extra})


# --- the allowed case --------------------------------------------------------------------------


def test_allowed_loopback_site_returns_body_status_and_content_type(site: Site) -> None:
    site.routes["/page"] = text("<p>hi</p>", "text/html; charset=utf-8", status=203)
    result = guarded_fetch(
        site.url("/page"), allow=["site.test"], limits=site.limits(fetch_allow_private=True), resolver=loopback_dns()
    )
    assert result == {
        "url": site.url("/page"),
        "status": 203,
        "content_type": "text/html; charset=utf-8",
        "text": "<p>hi</p>",
        "truncated": False,
        "bytes": 9,
    }


def test_connects_to_the_checked_address_but_keeps_the_host_header(site: Site) -> None:
    guarded_fetch(site.url(), allow=["site.test"], limits=site.limits(fetch_allow_private=True), resolver=loopback_dns())
    assert site.requests == [("/", f"site.test:{site.port}")]


def test_private_addresses_are_refused_without_the_setting(site: Site) -> None:
    result = guarded_fetch(site.url(), allow=["site.test"], limits=site.limits(), resolver=loopback_dns())
    assert "'site.test' resolves to 127.0.0.1, a blocked loopback address" in result["error"]
    assert "fetch_allow_private" in result["error"]
    assert site.accepted == 0


def test_a_star_allow_list_still_checks_addresses(site: Site) -> None:
    result = guarded_fetch(site.url(), allow=["*"], limits=site.limits(), resolver=loopback_dns())
    assert "loopback" in result["error"]
    assert site.accepted == 0


# --- 1. schemes --------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://site.test/x", "gopher://site.test:70/", "data:text/plain,hi"])
def test_schemes_other_than_http_and_https_are_refused(site: Site, url: str) -> None:
    scheme = url.split(":", 1)[0]
    result = guarded_fetch(url, allow=["*"], limits=site.limits(fetch_allow_private=True), resolver=loopback_dns())
    assert f"scheme {scheme!r} is not allowed" in result["error"]
    assert site.accepted == 0


def test_a_redirect_to_file_is_refused(site: Site) -> None:
    site.routes["/go"] = redirect("file:///etc/passwd")
    result = guarded_fetch(
        site.url("/go"), allow=["site.test"], limits=site.limits(fetch_allow_private=True), resolver=loopback_dns()
    )
    assert "scheme 'file' is not allowed" in result["error"]
    assert "after redirect 1 to file:" in result["error"]
    assert site.requests == [("/go", f"site.test:{site.port}")]


# --- 2. userinfo, control characters, ports ----------------------------------------------------


@pytest.mark.parametrize("authority", ["user:secret@site.test", "site.test:{port}@site.test", "@site.test"])
def test_userinfo_is_refused(site: Site, authority: str) -> None:
    url = f"http://{authority.format(port=site.port)}:{site.port}/"
    result = guarded_fetch(url, allow=["site.test"], limits=site.limits(fetch_allow_private=True), resolver=loopback_dns())
    assert "credentials" in result["error"]
    assert site.accepted == 0


@pytest.mark.parametrize("char", ["\r\n", "\t", "\x00", " ", "\x7f", "\u202e", "\u200b"])
def test_control_and_invisible_characters_in_the_authority_are_refused(site: Site, char: str) -> None:
    dns = FakeDNS({"site.test": ["127.0.0.1"], f"site.test{char}x".lower(): ["127.0.0.1"]})
    url = f"http://site.test{char}x:{site.port}/"
    result = guarded_fetch(url, allow=["*"], limits=site.limits(fetch_allow_private=True), resolver=dns)
    assert "control or whitespace character" in result["error"]
    assert site.accepted == 0


def test_ports_outside_the_allowed_set_are_refused(site: Site) -> None:
    result = guarded_fetch(site.url(), allow=["site.test"], limits=Limits(fetch_allow_private=True), resolver=loopback_dns())
    assert f"port {site.port} of host 'site.test' is not allowed (allowed: 80, 443" in result["error"]
    assert site.accepted == 0


def test_a_redirect_to_a_port_outside_the_set_is_refused(site: Site) -> None:
    site.routes["/go"] = redirect("http://site.test:22/")
    result = guarded_fetch(
        site.url("/go"), allow=["site.test"], limits=site.limits(fetch_allow_private=True), resolver=loopback_dns()
    )
    assert "port 22 of host 'site.test' is not allowed" in result["error"]
    assert site.accepted == 1


# --- 3. the host allow-list --------------------------------------------------------------------


def test_hosts_off_the_allow_list_are_refused(site: Site) -> None:
    dns = loopback_dns(**{"other.test": ["127.0.0.1"]})
    result = guarded_fetch(
        site.url(host="other.test"), allow=["site.test"], limits=site.limits(fetch_allow_private=True), resolver=dns
    )
    assert "host 'other.test' is not in this agent's fetch_allow (site.test)" in result["error"]
    assert site.accepted == 0
    assert dns.calls == []


def test_a_redirect_to_a_host_off_the_allow_list_is_refused(site: Site) -> None:
    site.routes["/go"] = redirect(site.url("/", host="other.test"))
    dns = loopback_dns(**{"other.test": ["127.0.0.1"]})
    result = guarded_fetch(site.url("/go"), allow=["site.test"], limits=site.limits(fetch_allow_private=True), resolver=dns)
    assert "host 'other.test' is not in this agent's fetch_allow" in result["error"]
    assert site.requests == [("/go", f"site.test:{site.port}")]


def test_a_wildcard_allows_subdomains(site: Site) -> None:
    dns = FakeDNS({"docs.example.test": ["127.0.0.1"], "a.b.example.test": ["127.0.0.1"]})
    limits = site.limits(fetch_allow_private=True)
    first = guarded_fetch(site.url(host="docs.example.test"), allow=["*.example.test"], limits=limits, resolver=dns)
    second = guarded_fetch(site.url(host="a.b.example.test"), allow=["*.example.test"], limits=limits, resolver=dns)
    assert first["status"] == 200
    assert second["status"] == 200


@pytest.mark.parametrize("host", ["example.test", "evilexample.test", "example.test.evil.test"])
def test_a_wildcard_means_strict_subdomains_only(site: Site, host: str) -> None:
    dns = FakeDNS({host: ["127.0.0.1"]})
    result = guarded_fetch(site.url(host=host), allow=["*.example.test"], limits=site.limits(fetch_allow_private=True), resolver=dns)
    assert f"host {host!r} is not in this agent's fetch_allow" in result["error"]
    assert site.accepted == 0


def test_the_allow_list_compares_idna_lowercase_without_trailing_dot(site: Site) -> None:
    dns = FakeDNS({"xn--bcher-kva.example": ["127.0.0.1"]})
    result = guarded_fetch(
        f"http://BÜCHER.Example.:{site.port}/",
        allow=["Bücher.EXAMPLE."],
        limits=site.limits(fetch_allow_private=True),
        resolver=dns,
    )
    assert result["status"] == 200
    assert dns.calls and set(dns.calls) == {"xn--bcher-kva.example"}


# --- 4. addresses ------------------------------------------------------------------------------

BLOCKED = [
    ("127.0.0.1", "loopback address"),
    ("127.8.9.10", "loopback address"),
    ("10.1.2.3", "private address"),
    ("172.16.0.9", "private address"),
    ("192.168.1.1", "private address"),
    ("169.254.169.254", "link-local address (169.254.0.0/16, the cloud metadata endpoint)"),
    ("169.254.10.10", "link-local address"),
    ("100.64.0.1", "carrier-grade NAT address (100.64.0.0/10)"),
    ("0.0.0.0", "unspecified address"),
    ("0.1.2.3", "'this network' address (0.0.0.0/8)"),
    ("224.0.0.1", "multicast address"),
    ("240.0.0.1", "reserved address"),
    ("255.255.255.255", "reserved address"),
    ("::1", "loopback address"),
    ("::", "unspecified address"),
    ("fd00::1", "unique-local address (fc00::/7)"),
    ("fe80::1", "link-local address (fe80::/10)"),
    ("ff02::1", "multicast address"),
    ("fec0::1", "site-local address (fec0::/10)"),
    ("::ffff:127.0.0.1", "IPv4-mapped IPv6 address hiding 127.0.0.1 (loopback address)"),
    ("::ffff:169.254.169.254", "IPv4-mapped IPv6 address hiding 169.254.169.254"),
    ("64:ff9b::7f00:1", "NAT64 IPv6 address hiding 127.0.0.1 (loopback address)"),
    ("64:ff9b::a9fe:a9fe", "NAT64 IPv6 address hiding 169.254.169.254"),
    ("2002:7f00:1::1", "6to4 IPv6 address hiding 127.0.0.1 (loopback address)"),
    ("2002:a00:1::1", "6to4 IPv6 address hiding 10.0.0.1 (private address)"),
    # Teredo: server 127.0.0.1, client obfuscated (XOR 0xffffffff) to 10.0.0.1.
    ("2001:0:7f00:1:0:0:f5ff:fffe", "Teredo IPv6 address hiding 127.0.0.1 (loopback address)"),
]


@pytest.mark.parametrize(("address", "label"), BLOCKED)
def test_names_resolving_to_blocked_addresses_are_refused(
    site: Site, no_outside_traffic: list[Any], address: str, label: str
) -> None:
    dns = FakeDNS({"blocked.test": [address]})
    result = guarded_fetch(site.url(host="blocked.test"), allow=["blocked.test"], limits=site.limits(), resolver=dns)
    assert f"resolves to {ipaddress.ip_address(address)}, a blocked {label}" in result["error"]
    assert site.accepted == 0
    assert no_outside_traffic == []


@pytest.mark.parametrize("address", ["169.254.169.254", "::ffff:169.254.169.254", "224.0.0.1", "0.0.0.0", "240.0.0.1"])
def test_never_fetched_classes_stay_blocked_with_private_enabled(
    site: Site, no_outside_traffic: list[Any], address: str
) -> None:
    dns = FakeDNS({"blocked.test": [address]})
    limits = site.limits(fetch_allow_private=True)
    result = guarded_fetch(site.url(host="blocked.test"), allow=["blocked.test"], limits=limits, resolver=dns)
    assert "never fetched, whatever the settings" in result["error"]
    assert site.accepted == 0
    assert no_outside_traffic == []


@pytest.mark.parametrize("host", ["127.1", "0x7f.1", "2130706433", "0x7f000001", "127.0.1", "[::1]", "[::ffff:7f00:1]"])
def test_odd_spellings_of_loopback_are_refused(site: Site, no_outside_traffic: list[Any], host: str) -> None:
    dns = FakeDNS({})
    result = guarded_fetch(site.url(host=host), allow=["*"], limits=site.limits(), resolver=dns)
    assert "is a blocked" in result["error"]
    assert "loopback address" in result["error"]
    assert site.accepted == 0
    assert dns.calls == []
    assert no_outside_traffic == []


def test_octal_loopback_is_refused(site: Site, no_outside_traffic: list[Any]) -> None:
    result = guarded_fetch(site.url(host="0177.0.0.1"), allow=["*"], limits=site.limits(), resolver=FakeDNS({}))
    assert "fetch refused" in result["error"]
    assert site.accepted == 0
    assert no_outside_traffic == []


def test_an_allow_listed_ip_literal_still_needs_the_private_setting(site: Site) -> None:
    result = guarded_fetch(site.url(host="127.0.0.1"), allow=["127.0.0.1"], limits=site.limits(), resolver=FakeDNS({}))
    assert "127.0.0.1 is a blocked loopback address" in result["error"]
    assert site.accepted == 0


def test_an_odd_spelling_matches_its_canonical_allow_list_entry(site: Site) -> None:
    limits = site.limits(fetch_allow_private=True)
    result = guarded_fetch(site.url(host="127.1"), allow=["127.0.0.1"], limits=limits, resolver=FakeDNS({}))
    assert result["status"] == 200


def test_answers_mixing_public_and_private_addresses_are_refused(site: Site, no_outside_traffic: list[Any]) -> None:
    dns = FakeDNS({"mixed.test": ["93.184.216.34", "127.0.0.1"]})
    result = guarded_fetch(site.url(host="mixed.test"), allow=["mixed.test"], limits=site.limits(), resolver=dns)
    assert "resolves to 93.184.216.34, 127.0.0.1; 127.0.0.1 is a blocked loopback address" in result["error"]
    assert "every address" in result["error"]
    assert site.accepted == 0
    assert no_outside_traffic == []


# --- 5. rebinding and redirects: checked where the socket is opened ------------------------------


def test_rebinding_after_the_early_check_is_caught_at_connect(site: Site, no_outside_traffic: list[Any]) -> None:
    # The first answer (public-looking) is only ever checked; the second, at connect, is loopback.
    dns = FakeDNS({"rebind.test": [["93.184.216.34"], ["127.0.0.1"]]})
    result = guarded_fetch(site.url(host="rebind.test"), allow=["rebind.test"], limits=site.limits(), resolver=dns)
    assert "'rebind.test' resolves to 127.0.0.1, a blocked loopback address" in result["error"]
    assert dns.calls == ["rebind.test", "rebind.test"]
    assert site.accepted == 0
    assert no_outside_traffic == []


def test_a_redirect_to_the_metadata_address_is_refused(site: Site, no_outside_traffic: list[Any]) -> None:
    site.routes["/go"] = redirect("http://169.254.169.254/latest/meta-data/")
    limits = site.limits(fetch_allow_private=True, fetch_ports=(site.port, 80))
    result = guarded_fetch(site.url("/go"), allow=["*"], limits=limits, resolver=loopback_dns())
    assert "169.254.169.254 is a blocked link-local address" in result["error"]
    assert "after redirect 1 to http://169.254.169.254/latest/meta-data/" in result["error"]
    assert no_outside_traffic == []


def test_a_redirect_to_a_name_of_a_private_address_is_refused(site: Site, no_outside_traffic: list[Any]) -> None:
    site.routes["/go"] = redirect(site.url("/", host="inside.test"))
    dns = loopback_dns(**{"inside.test": ["169.254.169.254"]})
    limits = site.limits(fetch_allow_private=True)
    result = guarded_fetch(site.url("/go"), allow=["site.test", "inside.test"], limits=limits, resolver=dns)
    assert "'inside.test' resolves to 169.254.169.254" in result["error"]
    assert site.accepted == 1
    assert no_outside_traffic == []


def test_a_followed_redirect_reports_the_final_url(site: Site) -> None:
    site.routes["/old"] = redirect("/new", status=301)
    site.routes["/new"] = text("moved here")
    result = guarded_fetch(
        site.url("/old"), allow=["site.test"], limits=site.limits(fetch_allow_private=True), resolver=loopback_dns()
    )
    assert (result["url"], result["text"], result["redirects"]) == (site.url("/new"), "moved here", [site.url("/new")])


def test_tls_keeps_the_hostname_for_sni_and_certificate_checks(tmp_path: Any) -> None:
    # A self-signed certificate for site.test: the guard connects to 127.0.0.1, but the TLS
    # handshake names site.test and the certificate is verified (and here refused).
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    command += ["-subj", "/CN=site.test", "-addext", "subjectAltName=DNS:site.test"]
    command += ["-keyout", str(key), "-out", str(cert)]
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=30)
    except FileNotFoundError:
        pytest.fail("this test needs the openssl command: apt-get install openssl", pytrace=False)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    names: list[str | None] = []
    server_ctx.sni_callback = lambda sock, name, ctx: names.append(name)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve_one() -> None:
        conn, _ = listener.accept()
        with contextlib.suppress(ssl.SSLError, OSError):
            server_ctx.wrap_socket(conn, server_side=True).close()
        conn.close()

    thread = threading.Thread(target=serve_one, daemon=True)
    thread.start()
    try:
        limits = Limits(fetch_ports=(port,), fetch_allow_private=True, fetch_timeout=5.0)
        result = guarded_fetch(f"https://site.test:{port}/", allow=["site.test"], limits=limits, resolver=loopback_dns())
        thread.join(5)
    finally:
        listener.close()
    assert "CERTIFICATE_VERIFY_FAILED" in result["error"]
    assert names == ["site.test"]


# --- 6. deadline, byte cap, hop cap, environment -----------------------------------------------


def trickle(handler: Any) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/plain")
    handler.send_header("Content-Length", "100")
    handler.end_headers()
    handler.wfile.flush()
    for _ in range(50):  # bounded: at most 10 s, far past any deadline used here
        handler.wfile.write(b"x")
        handler.wfile.flush()
        time.sleep(0.2)


def trickle_headers(handler: Any) -> None:
    for _ in range(50):
        handler.wfile.write(b"X")
        handler.wfile.flush()
        time.sleep(0.2)


@pytest.mark.parametrize("route", [trickle, trickle_headers])
def test_a_trickling_server_is_cut_at_the_total_deadline(site: Site, route: Route) -> None:
    site.routes["/slow"] = route
    limits = site.limits(fetch_allow_private=True, fetch_timeout=1.0)
    started = time.monotonic()
    result = guarded_fetch(site.url("/slow"), allow=["site.test"], limits=limits, resolver=loopback_dns())
    elapsed = time.monotonic() - started
    assert "took longer than 1 s" in result["error"]
    assert 0.9 <= elapsed < 3.0  # the trickle alone would run for 10 s


def gzip_bomb(handler: Any) -> None:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    body = b"".join(packer.compress(zeros) for _ in range(64)) + packer.flush()  # 64 MiB inflated
    respond(handler, 200, body, {"Content-Type": "text/plain", "Content-Encoding": "gzip"})


def test_a_gzip_bomb_stops_at_the_decoded_byte_cap(site: Site) -> None:
    site.routes["/bomb"] = gzip_bomb
    limits = site.limits(fetch_allow_private=True, fetch_max_bytes=64 * 1024)
    tracemalloc.start()
    try:
        result = guarded_fetch(site.url("/bomb"), allow=["site.test"], limits=limits, resolver=loopback_dns())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (result["truncated"], result["bytes"]) == (True, 64 * 1024)
    assert result["text"].endswith("[nexo: body truncated at 65536 bytes (fetch_max_bytes)]")
    assert peak < 8 * 1024 * 1024


def test_a_plain_body_over_the_cap_is_truncated_and_marked(site: Site) -> None:
    site.routes["/big"] = text("a" * 5000)
    limits = site.limits(fetch_allow_private=True, fetch_max_bytes=1000)
    result = guarded_fetch(site.url("/big"), allow=["site.test"], limits=limits, resolver=loopback_dns())
    assert result["text"] == "a" * 1000 + "\n[nexo: body truncated at 1000 bytes (fetch_max_bytes)]"
    assert result["truncated"] is True


def test_a_gzipped_body_under_the_cap_is_decoded(site: Site) -> None:
    packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    body = packer.compress(b"zipped text") + packer.flush()
    site.routes["/gz"] = lambda h: respond(h, 200, body, {"Content-Type": "text/plain", "Content-Encoding": "gzip"})
    result = guarded_fetch(site.url("/gz"), allow=["site.test"], limits=site.limits(fetch_allow_private=True), resolver=loopback_dns())
    assert (result["text"], result["truncated"]) == ("zipped text", False)


def test_redirects_stop_at_the_hop_cap(site: Site) -> None:
    site.routes["/loop"] = redirect("/loop")
    limits = site.limits(fetch_allow_private=True, fetch_max_redirects=3)
    result = guarded_fetch(site.url("/loop"), allow=["site.test"], limits=limits, resolver=loopback_dns())
    assert "more than 3 redirects" in result["error"]
    assert len(site.requests) == 4


def test_proxy_settings_in_the_environment_are_ignored(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = Site()
    try:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
        result = guarded_fetch(
            site.url(), allow=["site.test"], limits=site.limits(fetch_allow_private=True), resolver=loopback_dns()
        )
    finally:
        proxy.close()
    assert result["status"] == 200
    assert (site.accepted, proxy.accepted) == (1, 0)


def test_binary_content_is_described_not_returned(site: Site) -> None:
    site.routes["/img"] = lambda h: respond(h, 200, b"\x89PNG\r\n", {"Content-Type": "image/png"})
    result = guarded_fetch(site.url("/img"), allow=["site.test"], limits=site.limits(fetch_allow_private=True), resolver=loopback_dns())
    assert (result["status"], result["text"]) == (200, "")
    assert "binary content (image/png)" in result["note"]


def test_a_name_that_does_not_resolve_is_an_error(site: Site) -> None:
    result = guarded_fetch(site.url(host="nowhere.test"), allow=["*"], limits=site.limits(), resolver=FakeDNS({}))
    assert "cannot resolve host 'nowhere.test'" in result["error"]


# --- the tool inside an agent (scripted model) ------------------------------------------------


class Browser(Agent):
    fetch_allow = ["site.test"]
    permissions = "auto"


@pytest.fixture
def agent_dns(monkeypatch: pytest.MonkeyPatch) -> FakeDNS:
    dns = loopback_dns(**{"blocked.test": ["169.254.169.254"]})
    monkeypatch.setattr(netguard, "resolver", dns)
    return dns


def scripted(*turns: Any) -> Any:
    from nexo_django.testing import ScriptedModel

    return ScriptedModel(list(turns))


def test_scripted_read_only_agent_gets_no_fetch_tool() -> None:
    from nexo_django.testing import reply

    model = scripted(reply("done"))
    Browser(model=model, permissions="read_only").prompt("look")
    assert "fetch" not in model.requests[0]["tools"]


def test_scripted_read_only_agent_with_a_fetch_grant_gets_the_tool() -> None:
    from nexo_django.testing import reply

    model = scripted(reply("done"))
    Browser(model=model, permissions=Permissions("read_only", allow=("read", "glob", "fetch"))).prompt("look")
    assert "fetch" in model.requests[0]["tools"]


def test_scripted_agent_fetches_with_limits_from_settings(site: Site, agent_dns: FakeDNS, settings: Any) -> None:
    from nexo_django.testing import reply, tool_call

    settings.NEXO = {"LIMITS": {"fetch_allow_private": True, "fetch_ports": [site.port]}}
    answer = Browser(model=scripted(tool_call("fetch", url=site.url()), reply("read it"))).prompt("look")
    assert answer.tool_calls[0].result["text"] == "hello from the loopback site"
    assert answer.content == "read it"


def test_scripted_refused_fetch_returns_an_error_and_the_loop_finishes(
    site: Site, agent_dns: FakeDNS, settings: Any, no_outside_traffic: list[Any]
) -> None:
    from nexo_django.testing import reply, tool_call

    settings.NEXO = {"LIMITS": {"fetch_ports": [site.port, 80]}}
    model = scripted(
        [tool_call("fetch", url=site.url()), tool_call("fetch", url="http://blocked.test/")],
        reply("could not"),
    )
    answer = Browser(model=model).prompt("look")
    assert "loopback" in answer.tool_calls[0].result["error"]
    assert "not in this agent's fetch_allow" in answer.tool_calls[1].result["error"]
    assert answer.content == "could not"
    assert site.accepted == 0
    assert no_outside_traffic == []


def test_scripted_fetch_denied_by_the_gate_returns_an_error(site: Site, agent_dns: FakeDNS, settings: Any) -> None:
    from nexo_django.testing import reply, tool_call

    settings.NEXO = {"LIMITS": {"fetch_allow_private": True, "fetch_ports": [site.port]}}
    answer = Browser(model=scripted(tool_call("fetch", url=site.url()), reply("denied")), permissions="ask").prompt("x")
    assert "denied" in answer.tool_calls[0].result["error"]
    assert answer.content == "denied"
    assert site.accepted == 0
