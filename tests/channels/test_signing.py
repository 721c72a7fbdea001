"""The signature checks, each refusal on its own: what a webhook receiver imports, and Slack's."""

from __future__ import annotations

import time

import pytest

from nexo_django.channels.signing import (
    SignatureError,
    sign,
    slack_signature,
    verify_signature,
    verify_slack,
)

BODY = b'{"type":"approval.requested","id":"k"}'


def test_a_signed_body_verifies_and_gives_its_timestamp() -> None:
    now = int(time.time())
    assert verify_signature("s", sign("s", BODY, now), BODY) == now


@pytest.mark.parametrize("header", [None, "", "t=1", "v1=abc", "t=x,v1=abc"])
def test_a_missing_or_malformed_header_is_refused(header: str | None) -> None:
    with pytest.raises(SignatureError):
        verify_signature("s", header, BODY)


def test_another_secret_another_body_or_a_moved_timestamp_is_refused() -> None:
    now = int(time.time())
    header = sign("s", BODY, now)
    for secret, body, given in (("other", BODY, header), ("s", BODY + b" ", header),
                                ("s", BODY, header.replace(f"t={now}", f"t={now + 1}"))):
        with pytest.raises(SignatureError, match="does not match"):
            verify_signature(secret, given, body)


def test_an_old_signature_is_refused_even_if_right() -> None:
    old = int(time.time()) - 301
    with pytest.raises(SignatureError, match="timestamp"):
        verify_signature("s", sign("s", BODY, old), BODY)
    assert verify_signature("s", sign("s", BODY, old), BODY, tolerance=400) == old


def test_slacks_v0_scheme() -> None:
    ts = str(int(time.time()))
    good = slack_signature("secret", ts, BODY)
    assert good.startswith("v0=") and verify_slack("secret", ts, good, BODY) == int(ts)
    for timestamp, signature in ((ts, good.replace("v0=", "v1=")), (ts, None), (str(int(ts) - 301), good),
                                 (ts, slack_signature("secret", ts, BODY + b"x"))):
        with pytest.raises(SignatureError):
            verify_slack("secret", timestamp, signature, BODY)
