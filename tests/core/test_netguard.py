"""The guard's decisions on their own: addresses, host spellings, the allow-list and URLs.

No socket is opened here; tests/core/test_fetch.py attacks the same checks over loopback.
"""

from __future__ import annotations

import ipaddress

import pytest

from nexo_django.core.tools.netguard import (
    AllowList,
    FetchRefused,
    canonical_host,
    check_url,
    classify,
    ipv4_literal,
)

PORTS = (80, 443)


def refusal(url: str, allow: tuple[str, ...] = ("*",), ports: tuple[int, ...] = PORTS) -> str:
    with pytest.raises(FetchRefused) as caught:
        check_url(url, AllowList.parse(allow), ports)
    return str(caught.value)


# --- addresses ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address", ["93.184.216.34", "1.1.1.1", "2606:4700::1111", "::ffff:93.184.216.34", "64:ff9b::5db8:d822"]
)
def test_public_addresses_pass(address: str) -> None:
    assert classify(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("address", "label", "private"),
    [
        ("127.0.0.1", "loopback address", True),
        ("::1", "loopback address", True),
        ("10.0.0.1", "private address", True),
        ("192.168.0.1", "private address", True),
        ("100.64.0.1", "carrier-grade NAT address (100.64.0.0/10)", True),
        ("fd12::1", "unique-local address (fc00::/7)", True),
        ("192.0.2.1", "private address", True),
        ("169.254.169.254", "link-local address (169.254.0.0/16, the cloud metadata endpoint)", False),
        ("fe80::1", "link-local address (fe80::/10)", False),
        ("0.0.0.0", "unspecified address", False),
        ("0.0.0.7", "'this network' address (0.0.0.0/8)", False),
        ("239.1.1.1", "multicast address", False),
        ("ff05::2", "multicast address", False),
        ("240.1.2.3", "reserved address", False),
        ("fec0::1", "site-local address (fec0::/10)", False),
    ],
)
def test_each_address_class_is_named(address: str, label: str, private: bool) -> None:
    found = classify(ipaddress.ip_address(address))
    assert found is not None
    assert (found.label, found.private) == (label, private)


@pytest.mark.parametrize(
    ("address", "how", "inner"),
    [
        ("::ffff:127.0.0.1", "IPv4-mapped", "127.0.0.1"),
        ("::ffff:a9fe:a9fe", "IPv4-mapped", "169.254.169.254"),
        ("64:ff9b::a00:1", "NAT64", "10.0.0.1"),
        ("2002:a9fe:a9fe::", "6to4", "169.254.169.254"),
        ("2001:0:a9fe:a9fe::1", "Teredo", "169.254.169.254"),
    ],
)
def test_ipv4_hidden_in_ipv6_is_judged_as_that_ipv4(address: str, how: str, inner: str) -> None:
    found = classify(ipaddress.ip_address(address))
    assert found is not None
    assert found.label.startswith(f"{how} IPv6 address hiding {inner} (")


def test_a_hidden_address_keeps_its_class_private_flag() -> None:
    mapped_loopback = classify(ipaddress.ip_address("::ffff:127.0.0.1"))
    mapped_metadata = classify(ipaddress.ip_address("::ffff:169.254.169.254"))
    assert mapped_loopback is not None and mapped_loopback.private is True
    assert mapped_metadata is not None and mapped_metadata.private is False


@pytest.mark.parametrize("spelling", ["127.1", "0x7f.1", "2130706433", "0177.0.0.1", "0x7F000001", "127.0.1"])
def test_odd_ipv4_spellings_read_as_inet_aton_does(spelling: str) -> None:
    assert ipv4_literal(spelling) == ipaddress.IPv4Address("127.0.0.1")


@pytest.mark.parametrize("name", ["example.com", "deadbeef", "1.2.3.4.example", "08.1", "127.0.0.1.x"])
def test_names_are_not_mistaken_for_ipv4(name: str) -> None:
    assert ipv4_literal(name) is None


# --- host spellings and the allow-list ---------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        ("Bücher.Example.", "xn--bcher-kva.example"),
        ("0x7f.1", "127.0.0.1"),
        ("[0:0:0:0:0:0:0:1]", "::1"),
    ],
)
def test_hosts_are_compared_in_one_canonical_spelling(raw: str, canonical: str) -> None:
    assert canonical_host(raw) == canonical


@pytest.mark.parametrize("raw", ["exa%6dple.com", "a..b", "-lead.example", "fe80::1%25eth0", "x" * 64 + ".com"])
def test_malformed_hosts_are_refused(raw: str) -> None:
    with pytest.raises(FetchRefused):
        canonical_host(raw)


def test_exact_entries_match_case_idna_and_trailing_dot() -> None:
    allow = AllowList.parse(["SITE.Test.", "Bücher.example"])
    assert allow.allows(canonical_host("site.test"))
    assert allow.allows(canonical_host("XN--BCHER-KVA.EXAMPLE."))
    assert not allow.allows(canonical_host("sub.site.test"))


def test_a_wildcard_covers_subdomains_at_any_depth_but_not_the_apex() -> None:
    allow = AllowList.parse(["*.Example.com"])
    assert allow.allows("docs.example.com")
    assert allow.allows("a.b.example.com")
    assert not allow.allows("example.com")
    assert not allow.allows("evilexample.com")
    assert not allow.allows("example.com.evil.net")


def test_a_star_allows_any_host() -> None:
    assert AllowList.parse(["*"]).allows("anything.example")


def test_an_empty_allow_list_allows_nothing() -> None:
    assert not AllowList.parse([]).allows("example.com")


def test_an_ip_entry_matches_other_spellings_of_that_address_only() -> None:
    allow = AllowList.parse(["10.0.0.1", "*.example.com"])
    assert allow.allows(canonical_host("10.1"))
    assert not allow.allows(canonical_host("10.0.0.2"))


@pytest.mark.parametrize("entry", ["https://example.com", "example.com:8080", "example.com/path", "user@example.com", "", "*.10.0.0.1"])
def test_unusable_allow_entries_are_refused_with_the_fix(entry: str) -> None:
    with pytest.raises(FetchRefused) as caught:
        AllowList.parse([entry])
    assert repr(entry) in str(caught.value)


# --- URLs --------------------------------------------------------------------------------------


def test_an_allowed_url_gives_its_canonical_host_and_port() -> None:
    target = check_url("https://Docs.Example.com./a?b=1", AllowList.parse(["docs.example.com"]), PORTS)
    assert (target.host, target.port, str(target.url)) == ("docs.example.com", 443, "https://docs.example.com./a?b=1")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "FTP://example.com/", "javascript:alert(1)", "//example.com/", "example.com"])
def test_only_http_and_https_pass(url: str) -> None:
    assert "is not allowed; only http and https" in refusal(url)


@pytest.mark.parametrize("url", ["http://u:p@example.com/", "http://example.com@evil.example/", "http://@example.com/"])
def test_userinfo_is_refused(url: str) -> None:
    assert "credentials" in refusal(url)


@pytest.mark.parametrize("char", ["\n", "\r", "\t", "\x00", "\x1b", "\x7f", " ", "\u00a0", "\u2028", "\u202e", "\ufeff"])
def test_control_and_invisible_characters_are_refused(char: str) -> None:
    assert "control or whitespace character" in refusal(f"http://exam{char}ple.com/")


def test_a_backslash_in_the_authority_is_refused() -> None:
    assert "backslash" in refusal("http://example.com\\@evil.example/")


@pytest.mark.parametrize("url", ["http://example.com:8080/", "https://example.com:8443/", "http://example.com:0/"])
def test_ports_outside_the_set_are_refused(url: str) -> None:
    assert "is not allowed (allowed: 80, 443" in refusal(url)


def test_the_default_port_follows_the_scheme() -> None:
    assert check_url("http://example.com/", AllowList.parse(["example.com"]), (80,)).port == 80
    assert "port 443" in refusal("https://example.com/", ports=(80,))


def test_a_host_off_the_list_names_the_host_and_the_list() -> None:
    message = refusal("http://other.example/", allow=("example.com", "*.docs.example"))
    assert "host 'other.example' is not in this agent's fetch_allow (example.com, *.docs.example)" in message
