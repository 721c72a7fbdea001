"""System checks of NEXO["CHANNELS"]: each problem by its id, with a hint."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from nexo_django.checks import check_channels

SLACK = {"BACKEND": "slack", "TOKEN": "xoxb", "SIGNING_SECRET": "s", "CHANNEL": "C1"}


def ids(settings: Any, channels: Any) -> list[str]:
    settings.NEXO = {"CHANNELS": channels}
    return [m.id for m in check_channels()]


def test_valid_channels_pass(settings: Any) -> None:
    assert ids(settings, {"ops": SLACK, "audit": {"BACKEND": "webhook", "URL": "https://h.example/x", "SECRET": "s",
                                                  "ALLOW_PRIVATE": ["hooks.internal"], "EVENTS": ["run.done"]}}) == []


@pytest.mark.parametrize("channels", [["ops"], {"Ops!": SLACK}, {"expiry": SLACK}, {"x" * 21: SLACK}, {"ops": "slack"}])
def test_bad_shapes_and_names_are_e030(settings: Any, channels: Any) -> None:
    assert ids(settings, channels) == ["nexo_django.E030"]


@pytest.mark.parametrize("backend", [None, "teams", "nexo_django.models.AgentRun"])
def test_a_backend_that_is_no_channel_is_e031(settings: Any, backend: Any) -> None:
    assert ids(settings, {"ops": {**SLACK, "BACKEND": backend}}) == ["nexo_django.E031"]


@pytest.mark.parametrize("change", [{"TOKEN": ""}, {"EVENTS": ["run.exploded"]}, {"MAX_ATTEMPTS": 0},
                                    {"ALLOW_PRIVATE": "127.0.0.1"}, {"TOKNE": "typo"}, {"REMIND_AFTER": -1}])
def test_bad_options_are_e032_naming_the_problem(settings: Any, change: dict[str, Any]) -> None:
    settings.NEXO = {"CHANNELS": {"ops": {**SLACK, **change}}}
    [message] = check_channels()
    assert message.id == "nexo_django.E032" and message.hint and "ops" in message.msg


def test_a_webhook_url_must_be_http(settings: Any) -> None:
    settings.NEXO = {"CHANNELS": {"a": {"BACKEND": "webhook", "URL": "file:///etc/passwd", "SECRET": "s"}}}
    [message] = check_channels()
    assert message.id == "nexo_django.E032" and "http(s)" in message.msg


@pytest.mark.django_db
def test_the_check_command_reports_it(settings: Any) -> None:
    from django.core.management.base import SystemCheckError

    settings.NEXO = {"CHANNELS": {"ops": {**SLACK, "TOKEN": ""}}}
    with pytest.raises(SystemCheckError, match="E032"):
        call_command("check")
