"""The public surface: a sorted ``__all__``, contract names at their homes, a core free of the ORM."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

import nexo_django
from nexo_django.core import errors

ROOT = Path(__file__).resolve().parent.parent


def test_all_is_sorted() -> None:
    assert nexo_django.__all__ == sorted(nexo_django.__all__)


def test_all_has_no_duplicates() -> None:
    assert len(set(nexo_django.__all__)) == len(nexo_django.__all__)


@pytest.mark.parametrize("name", nexo_django.__all__)
def test_every_exported_name_is_importable(name: str) -> None:
    assert getattr(nexo_django, name) is not None


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("nexo_django", "Agent"),
        ("nexo_django", "Permissions"),
        ("nexo_django", "Denied"),
        ("nexo_django", "ApprovalRequired"),
        ("nexo_django", "SecurityError"),
        ("nexo_django", "ConfigurationError"),
        ("nexo_django", "NexoError"),
        ("nexo_django", "tool"),
        ("nexo_django.testing", "ScriptedModel"),
        ("nexo_django.testing", "reply"),
        ("nexo_django.testing", "tool_call"),
    ],
)
def test_contract_names_import_from_their_documented_homes(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name)
    if module == "nexo_django":
        assert name in nexo_django.__all__


def test_contract_names_are_the_same_objects_everywhere() -> None:
    from nexo_django.core.agent import Agent as CoreAgent
    from nexo_django.core.permissions import Permissions
    from nexo_django.durable.agent import Agent

    assert nexo_django.Agent is Agent
    assert issubclass(Agent, CoreAgent)
    assert nexo_django.Permissions is Permissions
    assert nexo_django.ApprovalRequired is errors.ApprovalRequired


def test_configuration_error_is_an_improperly_configured() -> None:
    assert issubclass(nexo_django.ConfigurationError, ImproperlyConfigured)
    assert issubclass(nexo_django.ConfigurationError, nexo_django.NexoError)


def test_approval_required_is_not_a_denied() -> None:
    assert not issubclass(nexo_django.ApprovalRequired, nexo_django.Denied)


@pytest.mark.parametrize(
    "name", ["ApprovalRequired", "ConfigurationError", "Denied", "SecurityError", "ModelError", "MaxTurnsExceeded"]
)
def test_every_error_is_a_nexo_error(name: str) -> None:
    assert issubclass(getattr(errors, name), nexo_django.NexoError)


def _plain_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with no Django settings module."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "NEXO_MODEL")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_core_modules_import_nothing_from_django_db() -> None:
    done = _plain_python(
        """
        import json, sys
        import nexo_django.core.permissions, nexo_django.sandboxes, nexo_django.tools, nexo_django.llm
        import nexo_django.sandboxes.local, nexo_django.llm.openai, nexo_django.llm.anthropic
        import nexo_django.testing, nexo_django.core.agent, nexo_django.durable.agent
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("django.db"))))
        """
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_scripted_prompt_runs_in_plain_python_without_settings() -> None:
    done = _plain_python(
        """
        import json, sys
        from django.conf import settings
        from nexo_django import Agent
        from nexo_django.core.sandboxes import VirtualSandbox
        from nexo_django.testing import ScriptedModel, reply, tool_call

        class Scribe(Agent):
            permissions = "auto"

        sandbox = VirtualSandbox()
        model = ScriptedModel([tool_call("write", path="notes.txt", content="hi"), reply("Done.")])
        result = Scribe(model=model, sandbox=sandbox).prompt("Write 'hi' to notes.txt")
        print(json.dumps({
            "content": result.content,
            "files": {k: v.decode() for k, v in sandbox.files.items()},
            "configured": settings.configured,
            "db": sorted(m for m in sys.modules if m.startswith("django.db")),
        }))
        """
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "content": "Done.",
        "files": {"notes.txt": "hi"},
        "configured": False,
        "db": [],
    }
