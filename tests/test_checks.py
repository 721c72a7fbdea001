from __future__ import annotations

from pathlib import Path

import pytest
from django.core.checks import Error, Warning
from django.core.management import call_command
from django.test import override_settings

from nexo_django.checks import check_database, check_settings, sqlite_journal_messages
from nexo_django.conf import nexo_settings
from nexo_django.core.errors import ConfigurationError


def ids(messages: list) -> list[str]:
    return [m.id for m in messages]


@pytest.fixture(autouse=True)
def no_env_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEXO_MODEL", raising=False)
    # The providers' keys, as a configured deployment has them (W008 is tested without them).
    for prefix in ("OPENAI", "ANTHROPIC"):
        monkeypatch.setenv(f"{prefix}_API_KEY", "test-key")
        monkeypatch.delenv(f"{prefix}_BASE_URL", raising=False)


@pytest.mark.parametrize("model", ["openai:gpt-4.1-mini", "anthropic:claude-sonnet-4-5"])
def test_a_default_model_without_its_providers_key_is_w008(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    provider = model.partition(":")[0]
    monkeypatch.delenv(f"{provider.upper()}_API_KEY")
    with override_settings(NEXO={"MODEL": model}):
        [message] = check_settings()
    assert message.id == "nexo_django.W008" and isinstance(message, Warning)
    assert f"{provider.upper()}_API_KEY" in message.hint and "api_key" in message.hint


def test_w008_is_satisfied_by_a_key_in_settings_or_a_local_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    with override_settings(NEXO={"MODEL": "openai:x", "PROVIDERS": {"openai": {"api_key": "sk-in-settings"}}}):
        assert check_settings() == []
    with override_settings(NEXO={"MODEL": "openai:llama3", "PROVIDERS": {"openai": {"base_url": "http://127.0.0.1:11434/v1"}}}):
        assert check_settings() == []
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    with override_settings(NEXO={"MODEL": "openai:x"}):
        assert check_settings() == []


def test_w008_reaches_manage_py_check_without_failing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.delenv("OPENAI_API_KEY")
    err = io.StringIO()
    with override_settings(NEXO={"MODEL": "openai:gpt-4.1-mini"}):
        call_command("check", stdout=io.StringIO(), stderr=err)
    assert "nexo_django.W008" in err.getvalue()


@override_settings(NEXO={"MODEL": "openai:gpt-4.1-mini"})
def test_valid_settings_pass() -> None:
    assert check_settings() == []


@override_settings(NEXO={"MODLE": "openai:x"})
def test_unknown_key_is_e001_naming_the_key() -> None:
    [message] = check_settings()
    assert message.id == "nexo_django.E001" and isinstance(message, Error)
    assert "MODLE" in message.msg


@override_settings(NEXO=["not", "a", "dict"])
def test_nexo_must_be_a_dict() -> None:
    assert ids(check_settings()) == ["nexo_django.E001"]


def test_django_rq_missing_is_e002(settings: object) -> None:
    from django.conf import settings as s

    with override_settings(INSTALLED_APPS=[a for a in s.INSTALLED_APPS if a != "django_rq"],
                           NEXO={"MODEL": "openai:x"}):
        assert "nexo_django.E002" in ids(check_settings())


@override_settings(NEXO={"MODEL": "openai:x", "QUEUE": "agents"})
def test_unknown_queue_is_e003_with_a_hint() -> None:
    [message] = check_settings()
    assert message.id == "nexo_django.E003"
    assert "agents" in message.hint and "ASYNC" in message.hint


@override_settings(NEXO={})
def test_no_default_model_is_a_warning() -> None:
    [message] = check_settings()
    assert message.id == "nexo_django.W001" and isinstance(message, Warning)


@override_settings(NEXO={})
def test_env_model_satisfies_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXO_MODEL", "anthropic:claude-sonnet-4-5")
    assert check_settings() == []


@pytest.mark.parametrize("model", ["gpt-4", "mistral:large", "openai:"])
def test_bad_model_string_is_e004(model: str) -> None:
    with override_settings(NEXO={"MODEL": model}):
        assert ids(check_settings()) == ["nexo_django.E004"]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"LIMITS": {"read_max_byte": 1}}, "nexo_django.E005"),
        ({"LEASE_SECONDS": 0}, "nexo_django.E006"),
        ({"JOB_TIMEOUT": "long"}, "nexo_django.E006"),
        ({"NOTICES_KEEP_DAYS": 0}, "nexo_django.E006"),
        ({"NOTICES_KEEP_DAYS": "30"}, "nexo_django.E006"),
        ({"SEARCH_BACKEND": "no.such.module.search"}, "nexo_django.E007"),
        ({"SEARCH_BACKEND": "nexo_django.conf.DEFAULTS"}, "nexo_django.E007"),
        ({"PROVIDERS": {"openia": {}}}, "nexo_django.E008"),
        ({"PROTECTED_NAMES": ".git/config"}, "nexo_django.E009"),
        ({"SHELL": {"CONFINED": False}}, "nexo_django.E010"),
        ({"SHELL": {"CONFINE": "no"}}, "nexo_django.E010"),
        ({"SHELL": {"NETWORK": "pypi.org"}}, "nexo_django.E010"),
        ({"SHELL": {"NETWORK": ["https://pypi.org/simple"]}}, "nexo_django.E010"),
        ({"SHELL": {"READ": ["relative/path"]}}, "nexo_django.E010"),
        ({"SHELL": {"READ": ["/etc/shadow"]}}, "nexo_django.E010"),
        ({"SHELL": {"CONFINE": False}}, "nexo_django.W007"),
        ({"LIMITS": {"shell_memory": 0}}, "nexo_django.E010"),
    ],
)
def test_bad_values_have_their_own_ids(extra: dict, expected: str) -> None:
    with override_settings(NEXO={"MODEL": "openai:x", **extra}):
        assert ids(check_settings()) == [expected]


@pytest.mark.django_db
def test_call_command_check_runs_the_checks() -> None:
    with override_settings(NEXO={"QUEUE": "nope", "MODEL": "openai:x"}):
        from django.core.management.base import SystemCheckError

        with pytest.raises(SystemCheckError, match="nexo_django.E003"):
            call_command("check")
    with override_settings(NEXO={"MODEL": "openai:x"}):
        call_command("check")  # raises SystemCheckError on any error


def test_settings_are_read_lazily_and_reset_on_change() -> None:
    with override_settings(NEXO={"QUEUE": "a"}):
        assert nexo_settings.QUEUE == "a"
    with override_settings(NEXO={"QUEUE": "b"}):
        assert nexo_settings.QUEUE == "b"
    assert nexo_settings.QUEUE == "default"


def test_unknown_key_raises_a_configuration_error_on_use() -> None:
    with override_settings(NEXO={"QUEUEE": "a"}), pytest.raises(ConfigurationError, match="QUEUEE"):
        nexo_settings.QUEUE  # noqa: B018


WAL_FULL = "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL"


def sqlite(init_command: str | None = None, name: str = "/srv/app/db.sqlite3") -> dict:
    database: dict = {"ENGINE": "django.db.backends.sqlite3", "NAME": name}
    if init_command is not None:
        database["OPTIONS"] = {"init_command": init_command}
    return database


def test_the_test_settings_pass_the_database_check() -> None:
    assert check_database() == []


def test_sqlite_rollback_journal_is_w002_naming_the_fix() -> None:
    [message] = sqlite_journal_messages("default", sqlite())
    assert message.id == "nexo_django.W002" and isinstance(message, Warning)
    assert WAL_FULL in message.hint and 'DATABASES["default"]["OPTIONS"]["init_command"]' in message.hint


@pytest.mark.parametrize("init", [WAL_FULL, "PRAGMA journal_mode = 'wal'", "pragma main.journal_mode=WAL;"])
def test_sqlite_wal_passes(init: str) -> None:
    assert sqlite_journal_messages("default", sqlite(init)) == []


@pytest.mark.parametrize("init", ["PRAGMA journal_mode=DELETE", "PRAGMA synchronous=FULL", "PRAGMA foreign_keys=ON"])
def test_sqlite_without_wal_is_w002(init: str) -> None:
    assert ids(sqlite_journal_messages("default", sqlite(init))) == ["nexo_django.W002"]


@pytest.mark.parametrize("sync", ["NORMAL", "OFF", "1", "0"])
def test_sqlite_wal_with_a_weaker_sync_is_w003(sync: str) -> None:
    [message] = sqlite_journal_messages("default", sqlite(f"PRAGMA journal_mode=WAL; PRAGMA synchronous={sync}"))
    assert message.id == "nexo_django.W003" and "executing" in message.msg and WAL_FULL in message.hint


def test_sqlite_in_memory_has_no_journal_to_warn_about() -> None:
    assert sqlite_journal_messages("default", sqlite(name=":memory:")) == []


def test_missing_bubblewrap_is_w006_naming_bubblewrap_and_the_fix() -> None:
    with override_settings(NEXO={"MODEL": "openai:x", "SHELL": {"BWRAP": "/nonexistent/bwrap"}}):
        messages = check_settings()
    assert ids(messages) == ["nexo_django.W006"]
    assert "bubblewrap" in messages[0].msg and "/nonexistent/bwrap" in messages[0].msg
    assert "apt-get install bubblewrap" in messages[0].hint and "CONFINE" in messages[0].hint


def test_a_bubblewrap_that_cannot_make_its_sandbox_is_w006(tmp_path: Path) -> None:
    # A "bwrap" that fails the way one blocked by AppArmor does: it runs, and cannot create
    # the namespaces.
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    with override_settings(NEXO={"MODEL": "openai:x", "SHELL": {"BWRAP": str(fake)}}):
        messages = check_settings()
    assert ids(messages) == ["nexo_django.W006"]
    assert "uid map" in messages[0].msg and "user namespaces" in messages[0].msg


def test_working_bubblewrap_passes_the_shell_check() -> None:
    with override_settings(NEXO={"MODEL": "openai:x", "SHELL": {"CONFINE": True, "NETWORK": ["pypi.org"], "READ": ["/opt"]}}):
        assert check_settings() == []


def test_a_seccomp_filter_that_cannot_be_built_is_w009_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from nexo_django.core.sandboxes import seccomp

    seccomp._cached.cache_clear()
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # as if it were not installed: import fails
    try:
        with override_settings(NEXO={"MODEL": "openai:x"}):
            messages = check_settings()
        assert ids(messages) == ["nexo_django.W009"]
        assert "pyseccomp is not installed" in messages[0].msg and "nexo-django[shell]" in messages[0].hint
        # The shell itself refuses, with the same reason, and runs nothing.
        from nexo_django.core.sandboxes.local import LocalSandbox

        folder = Path(__import__("tempfile").mkdtemp())
        result = LocalSandbox(folder).shell("touch ran", timeout=10, max_output=100)
        assert "pyseccomp is not installed" in result["error"] and not (folder / "ran").exists()
    finally:
        monkeypatch.delitem(sys.modules, "pyseccomp")
        seccomp._cached.cache_clear()
