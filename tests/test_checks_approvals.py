"""System checks of the approval lifecycle settings: APPROVAL_TIMEOUT, SELF_APPROVAL, NOTIFY."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings

from nexo_django import Agent
from nexo_django.checks import check_settings
from nexo_django.core.errors import ConfigurationError

ON = {"EMAIL": True, "SITE_URL": "https://ops.example.com", "REMIND_AFTER": 3600}


@pytest.fixture(autouse=True)
def provider_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    # The providers' keys, as a configured deployment has them: W008 is tests/test_checks.py's.
    for prefix in ("OPENAI", "ANTHROPIC"):
        monkeypatch.setenv(f"{prefix}_API_KEY", "test-key")
        monkeypatch.delenv(f"{prefix}_BASE_URL", raising=False)


def ids(extra: dict[str, Any]) -> list[str]:
    with override_settings(NEXO={"MODEL": "openai:x", **extra}):
        return [m.id for m in check_settings()]


@pytest.mark.parametrize("extra", [
    {"APPROVAL_TIMEOUT": 60}, {"APPROVAL_TIMEOUT": 0.5}, {"APPROVAL_TIMEOUT": timedelta(days=1)},
    {"APPROVAL_TIMEOUT": None}, {"SELF_APPROVAL": False}, {"NOTIFY": ON}, {"NOTIFY": {}},
    {"NOTIFY": {**ON, "REMIND_AFTER": None}}, {"NOTIFY": {"EMAIL": False, "SITE_URL": ""}},
])
def test_valid_lifecycle_settings_pass(extra: dict[str, Any]) -> None:
    assert ids(extra) == []


@pytest.mark.parametrize(("extra", "expected"), [
    ({"APPROVAL_TIMEOUT": 0}, "nexo_django.E020"),
    ({"APPROVAL_TIMEOUT": -5}, "nexo_django.E020"),
    ({"APPROVAL_TIMEOUT": "7d"}, "nexo_django.E020"),
    ({"APPROVAL_TIMEOUT": True}, "nexo_django.E020"),
    ({"APPROVAL_TIMEOUT": timedelta(0)}, "nexo_django.E020"),
    ({"SELF_APPROVAL": "no"}, "nexo_django.E021"),
    ({"NOTIFY": True}, "nexo_django.E022"),
    ({"NOTIFY": {"EMAIL": True}}, "nexo_django.E022"),
    ({"NOTIFY": {**ON, "SITE_URL": "ops.example.com"}}, "nexo_django.E022"),
    ({"NOTIFY": {**ON, "SITE_URL": "ftp://ops.example.com"}}, "nexo_django.E022"),
    ({"NOTIFY": {**ON, "REMIND_AFTER": 0}}, "nexo_django.E022"),
    ({"NOTIFY": {**ON, "REMIND_AFTER": "1h"}}, "nexo_django.E022"),
    ({"NOTIFY": {**ON, "EMAIL": "yes"}}, "nexo_django.E022"),
    ({"NOTIFY": {**ON, "SITEURL": "x"}}, "nexo_django.E022"),
])
def test_bad_lifecycle_settings_have_their_own_ids(extra: dict[str, Any], expected: str) -> None:
    assert ids(extra) == [expected]


def test_the_notify_error_names_the_key_and_the_fix() -> None:
    with override_settings(NEXO={"MODEL": "openai:x", "NOTIFY": {"EMAIL": True, "SITE_URL": "/admin"}}):
        [error] = check_settings()
    assert "SITE_URL" in error.msg and "https://ops.example.com" in error.hint


@pytest.mark.parametrize("value", [0, -1, "1h", True, timedelta(seconds=-1)])
def test_a_bad_agent_timeout_fails_where_the_class_is_declared(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="approval_timeout"):
        type("Bad", (Agent,), {"approval_timeout": value})


def test_a_bad_on_timeout_fails_where_the_class_is_declared() -> None:
    with pytest.raises(ConfigurationError, match="'deny'.*'stop'"):
        type("Bad", (Agent,), {"on_timeout": "cancel"})
