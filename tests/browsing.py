"""Helpers for the tests that act as a logged-in browser (the ``browser`` fixture is in
tests/conftest.py)."""

from __future__ import annotations

from typing import Any

from django.test import Client


def session_cookie(user: Any) -> str:
    """The value of a ``sessionid`` cookie in which ``user`` is logged in (a test client's)."""
    client = Client()
    client.force_login(user)
    return str(client.cookies["sessionid"].value)


def log_in_with_session(browser: Any, base_url: str, user: Any, landing: str = "/") -> None:
    """Log ``user`` in to the browser without the login form: a test client's session cookie,
    set after a first page of the site (``landing``) gives the cookie its domain."""
    browser.get(f"{base_url}{landing}")
    browser.add_cookie({"name": "sessionid", "value": session_cookie(user), "path": "/"})
