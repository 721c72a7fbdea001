"""The declaration and entry points refuse mistakes early, with a message naming the fix (scripted models)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.db import transaction

from nexo_django import Agent, ConfigurationError, Permissions
from nexo_django.models import AgentRun, RunStatus
from tests.durable_agents import Scribe


def test_a_permission_mode_typo_fails_when_the_class_is_defined() -> None:
    with pytest.raises(ConfigurationError) as info:

        class Typo(Agent):
            permissions = "aprove"

    message = str(info.value)
    assert "Typo.permissions = 'aprove'" in message
    for mode in ("'read_only'", "'auto'", "'ask'", "'approve'"):
        assert mode in message


def test_permissions_that_are_neither_a_mode_nor_an_instance_fail_at_definition() -> None:
    with pytest.raises(ConfigurationError, match=r"Odd.permissions must be a mode name"):

        class Odd(Agent):
            permissions = ["approve"]


def test_valid_declarations_still_define() -> None:
    class Asks(Agent):
        permissions = "ask"

    class Gated(Agent):
        permissions = Permissions("approve")

    assert Asks.permissions == "ask"
    assert Gated.permissions.mode == "approve"



@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
@pytest.mark.parametrize("method", ["run", "run_later"])
@pytest.mark.parametrize("user", ["ann", 1])
def test_a_user_that_is_not_a_user_object_is_refused(method: str, user: object, tmp_path: Path) -> None:
    with pytest.raises(TypeError) as info:
        getattr(Scribe, method)("write hi", cwd=tmp_path, user=user)
    assert f"Scribe.{method}(user={user!r})" in str(info.value)
    assert "request.user" in str(info.value)
    assert not AgentRun.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_anonymous_and_real_users_are_accepted(tmp_path: Path) -> None:
    ann = get_user_model().objects.create_user("ann", password="x")
    assert Scribe.run("write hi", cwd=tmp_path, user=ann).created_by == ann
    assert Scribe.run_later("write hi", cwd=tmp_path, user=AnonymousUser()).created_by is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
@pytest.mark.parametrize("method", ["run", "run_later"])
def test_unknown_arguments_name_the_method_that_was_called(method: str) -> None:
    with pytest.raises(TypeError, match=rf"Scribe\.{method}\(\) got unknown argument\(s\) colour"):
        getattr(Scribe, method)("x", colour="red")


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_run_later_outside_a_transaction_returns_the_run_as_the_inline_queue_left_it(tmp_path: Path) -> None:
    run = Scribe.run_later("write hi", cwd=tmp_path)
    assert run.status == RunStatus.SUSPENDED
    assert run.generation == AgentRun.objects.get(pk=run.pk).generation


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_run_later_inside_a_transaction_is_queued_until_commit_then_current(tmp_path: Path) -> None:
    with transaction.atomic():
        run = Scribe.run_later("write hi", cwd=tmp_path)
        assert run.status == RunStatus.QUEUED
    assert run.status == RunStatus.SUSPENDED
    assert [c.name for c in run.pending_calls()] == ["write"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_run_later_rolled_back_leaves_the_object_queued_and_no_row(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        run = Scribe.run_later("write hi", cwd=tmp_path)
        raise RuntimeError("the view failed after starting the run")
    assert run.status == RunStatus.QUEUED
    assert not AgentRun.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
@pytest.mark.parametrize("method", ["run", "run_later"])
def test_a_configuration_error_names_the_method_that_was_called(method: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as info:
        getattr(Scribe, method)("write hi")  # a local sandbox with no cwd
    assert str(info.value).startswith(f"Scribe.{method}(...): ")
    assert "pass cwd=" in str(info.value)
    assert not AgentRun.objects.exists()


def test_an_agent_built_after_nexo_changes_reads_the_new_settings(tmp_path: Path) -> None:
    """The settings an agent is built from are read once (issue 34), and again once NEXO changes."""
    from django.test import override_settings

    before = Scribe(cwd=tmp_path)
    assert before.limits.read_max_bytes == 256 * 1024
    with override_settings(NEXO={"LIMITS": {"read_max_bytes": 1000}, "PROTECTED_NAMES": ["*.secret"]}):
        inside = Scribe(cwd=tmp_path)
        assert inside.limits.read_max_bytes == 1000
        assert inside.workspace.protected == ("*.secret",)
    after = Scribe(cwd=tmp_path)
    assert after.limits.read_max_bytes == 256 * 1024 and after.workspace.protected == before.workspace.protected
