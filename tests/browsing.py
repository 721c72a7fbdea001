"""Helpers for the browser tests (the ``browser`` fixture is in tests/conftest.py)."""

from __future__ import annotations

from typing import Any

from django.test import Client


def log_in_with_session(browser: Any, base_url: str, user: Any, landing: str = "/") -> None:
    """Log ``user`` in to the browser without the login form: a test client's session cookie,
    set after a first page of the site (``landing``) gives the cookie its domain."""
    client = Client()
    client.force_login(user)
    browser.get(f"{base_url}{landing}")
    browser.add_cookie({"name": "sessionid", "value": client.cookies["sessionid"].value, "path": "/"})
