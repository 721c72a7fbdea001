"""Signatures of requests between the app and the outside, standard library only (so a webhook
receiver can import :func:`verify_signature` without Django).

**Webhooks** (what the app sends): ``X-Nexo-Signature: t=<unix seconds>,v1=<hex>`` where ``<hex>``
is ``HMAC-SHA256(secret, f"{t}." + body)`` over the raw body bytes; a receiver recomputes it,
compares in constant time, and refuses a timestamp outside its window (5 minutes).

**Slack** (what the app receives): ``X-Slack-Signature: v0=<hex>`` with
``HMAC-SHA256(signing_secret, f"v0:{X-Slack-Request-Timestamp}:" + body)``, timestamps older than
five minutes refused (Slack's documented scheme).
"""

from __future__ import annotations

import hashlib
import hmac
import time

#: seconds a signed request stays acceptable, either way of now
TOLERANCE = 300


class SignatureError(ValueError):
    """A request's signature is missing, wrong, or outside its timestamp window."""


def _hmac(secret: str | bytes, message: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign(secret: str | bytes, body: bytes, timestamp: int | None = None) -> str:
    """The ``X-Nexo-Signature`` header of ``body``."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={t},v1={_hmac(secret, str(t).encode() + b'.' + body)}"


def check_timestamp(raw: str | None, *, tolerance: int = TOLERANCE, now: float | None = None) -> int:
    try:
        t = int(raw or "")
    except ValueError:
        raise SignatureError("the request has no valid timestamp") from None
    if abs((time.time() if now is None else now) - t) > tolerance:
        raise SignatureError(f"the request's timestamp is more than {tolerance} seconds away from now (a replay?)")
    return t


def verify_signature(secret: str | bytes, header: str | None, body: bytes, *, tolerance: int = TOLERANCE,
                     now: float | None = None) -> int:
    """Check an ``X-Nexo-Signature`` header against the raw ``body``; its timestamp, or
    :class:`SignatureError`. Call it before reading anything of the body."""
    parts: dict[str, list[str]] = {}
    for item in (header or "").split(","):
        name, _, value = item.strip().partition("=")
        parts.setdefault(name, []).append(value)
    t = check_timestamp((parts.get("t") or [""])[0], tolerance=tolerance, now=now)
    expected = _hmac(secret, str(t).encode() + b"." + body)
    if not any(hmac.compare_digest(expected, given) for given in parts.get("v1", [])):
        raise SignatureError("the request's signature does not match its body")
    return t


def slack_signature(secret: str | bytes, timestamp: str, body: bytes) -> str:
    return "v0=" + _hmac(secret, b"v0:" + timestamp.encode() + b":" + body)


def verify_slack(secret: str | bytes, timestamp: str | None, signature: str | None, body: bytes, *,
                 tolerance: int = TOLERANCE, now: float | None = None) -> int:
    """Check Slack's ``X-Slack-Signature`` and ``X-Slack-Request-Timestamp`` against the raw body;
    the timestamp, or :class:`SignatureError`."""
    t = check_timestamp(timestamp, tolerance=tolerance, now=now)
    if not signature or not hmac.compare_digest(slack_signature(secret, str(t), body), signature):
        raise SignatureError("the request's Slack signature does not match its body")
    return t
