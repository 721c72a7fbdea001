"""``manage.py nexo_demo``: the example story, scripted, inline and through a real rq worker."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from example_project.notes.agents import NOTES
from nexo_django.models import AgentRun, Decision, RunStatus
from tests.wire_server import Answer, WireServer

REPO_ROOT = Path(__file__).resolve().parent.parent
MANAGE = REPO_ROOT / "example_project" / "manage.py"


def demo(*args: str) -> str:
    out = io.StringIO()
    call_command("nexo_demo", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_the_scripted_demo_suspends_is_approved_and_writes_the_file(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    output = demo("--workspace", str(workspace))
    assert "Model: SCRIPTED" in output
    assert "status: suspended" in output
    assert "passed without asking: write drafts/notes.md" in output
    assert "write (call call_2_0, capability write)" in output
    assert "    path: published/notes.md" in output
    assert "approved write call_2_0" in output
    assert "The run resumed and ended: done" in output
    assert "--- published/notes.md ---" in output
    assert "assistant: (scripted model) Drafted drafts/notes.md and published published/notes.md." in output
    assert "make serve" in output
    assert (workspace / "published" / "notes.md").read_text() == NOTES
    scribe = AgentRun.objects.get(agent="example_project.notes.agents.Scribe")
    assert scribe.status == RunStatus.DONE
    decision = Decision.objects.get(tool_call__run=scribe)
    assert decision.approved and decision.decided_by.username == "approver"
    reviewer = AgentRun.objects.get(agent="example_project.notes.agents.Reviewer")
    assert reviewer.status == RunStatus.DONE


@pytest.mark.django_db(transaction=True)
def test_the_demo_empties_its_own_workspace_first(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    demo("--workspace", str(workspace))
    (workspace / "leftover.txt").write_text("from before")
    demo("--workspace", str(workspace))
    assert not (workspace / "leftover.txt").exists()
    assert (workspace / "published" / "notes.md").read_text() == NOTES


@pytest.mark.django_db(transaction=True)
def test_the_demo_refuses_to_empty_a_folder_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(CommandError, match="refusing to empty"):
        demo("--workspace", str(tmp_path))
    assert (tmp_path / "precious.txt").read_text() == "keep me"


@pytest.mark.django_db(transaction=True)
def test_live_without_a_model_says_how_to_set_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEXO_MODEL", raising=False)
    with pytest.raises(CommandError, match="NEXO_MODEL=openai:gpt-4.1-mini"):
        demo("--live", "--workspace", str(tmp_path / "ws"))
    assert not AgentRun.objects.exists()


def _completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-demo", "object": "chat.completion", "created": 1, "model": "wire-model",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def _call(call_id: str, name: str, args: str) -> Answer:
    tool_calls = [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]
    return Answer(body=_completion({"content": None, "tool_calls": tool_calls}, "tool_calls"))


@pytest.mark.django_db(transaction=True)
def test_live_runs_the_same_story_through_a_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--live swaps only the model: here an OpenAI-compatible server on loopback plays the provider."""
    with WireServer() as wire:
        wire.play(
            _call("w1", "write", '{"path": "drafts/notes.md", "content": "draft"}'),
            _call("w2", "write", '{"path": "published/notes.md", "content": "final"}'),
            Answer(body=_completion({"content": "Published."}, "stop")),
            _call("r1", "read", '{"path": "published/notes.md"}'),
            Answer(body=_completion({"content": "Ready."}, "stop")),
        )
        monkeypatch.setenv("NEXO_MODEL", "openai:wire-model")
        monkeypatch.setenv("OPENAI_BASE_URL", f"{wire.url}/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        output = demo("--live", "--workspace", str(tmp_path / "ws"))
        assert wire.remaining == 0
        assert {r.path for r in wire.requests} == {"/v1/chat/completions"}
    assert "Model: openai:wire-model (live" in output
    assert "SCRIPTED" not in output
    assert "write (call w2, capability write)" in output
    assert "answer: Published." in output and "answer: Ready." in output
    assert (tmp_path / "ws" / "published" / "notes.md").read_text() == "final"


def test_serve_refuses_without_debug(settings: Any, tmp_path: Path) -> None:
    settings.DEBUG = False
    with pytest.raises(CommandError, match="DEBUG = True"):
        demo("--serve", "--workspace", str(tmp_path))


def _example_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NEXO", "DJANGO", "REDIS", "DATABASE", "OPENAI", "ANTHROPIC"))}
    return {**env, "DJANGO_SETTINGS_MODULE": "example_project.settings",
            "DATABASE_URL": f"sqlite:///{tmp_path / 'example.sqlite3'}",
            "NOTES_WORKSPACE": str(tmp_path / "ws"), **extra}


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(MANAGE), *args], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_the_example_project_migrates_and_plays_the_demo_in_a_fresh_process(tmp_path: Path) -> None:
    """What `make demo` runs, with no Redis and no server."""
    env = _example_env(tmp_path)
    migrate = _manage(env, "migrate", "--noinput", "-v", "0")
    assert migrate.returncode == 0, migrate.stderr
    played = _manage(env, "nexo_demo")
    assert played.returncode == 0, played.stderr
    assert "is inline" in played.stdout
    assert "The run resumed and ended: done" in played.stdout
    assert "Traceback" not in played.stderr
    assert (tmp_path / "ws" / "published" / "notes.md").read_text() == NOTES


@pytest.mark.redis
def test_with_redis_the_demo_goes_through_a_real_worker_process(tmp_path: Path, redis_server: Any) -> None:
    env = _example_env(tmp_path, REDIS_URL=redis_server.url)
    assert _manage(env, "migrate", "--noinput", "-v", "0").returncode == 0
    played = _manage(env, "nexo_demo", "--timeout", "60")
    assert played.returncode == 0, played.stdout + played.stderr
    assert "on Redis: a worker process started by nexo_demo" in played.stdout
    assert played.stdout.count("ran in the rq worker") == 2  # the first step and the resume
    assert "The run resumed and ended: done" in played.stdout
    assert (tmp_path / "ws" / "published" / "notes.md").read_text() == NOTES


@pytest.mark.postgres
@pytest.mark.redis
def test_with_database_url_the_example_runs_on_postgresql(tmp_path: Path, redis_server: Any) -> None:
    """DATABASE_URL and REDIS_URL together: PostgreSQL, Redis and a worker process, as deployed."""
    from tests.servers import PostgresServer

    with PostgresServer(database="nexo_example") as postgres:
        env = _example_env(tmp_path, DATABASE_URL=postgres.url, REDIS_URL=redis_server.url)
        migrate = _manage(env, "migrate", "--noinput", "-v", "0")
        assert migrate.returncode == 0, migrate.stderr
        played = _manage(env, "nexo_demo", "--timeout", "60")
        assert played.returncode == 0, played.stdout + played.stderr
        assert played.stdout.count("ran in the rq worker") == 2
        assert "The run resumed and ended: done" in played.stdout
        vendor = _manage(env, "shell", "-c", "from django.db import connection; print(connection.vendor)")
        assert vendor.stdout.strip().splitlines()[-1] == "postgresql"
    assert (tmp_path / "ws" / "published" / "notes.md").read_text() == NOTES


def test_the_top_level_manage_py_runs_the_example_project_from_any_folder(tmp_path: Path) -> None:
    env = _example_env(tmp_path)
    del env["DJANGO_SETTINGS_MODULE"]  # the script's own default
    (tmp_path / "elsewhere").mkdir()
    code = "from django.conf import settings; print(settings.ROOT_URLCONF)"
    shown = subprocess.run([sys.executable, str(REPO_ROOT / "manage.py"), "shell", "-c", code], env=env,
                           cwd=tmp_path / "elsewhere", capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1] == "example_project.urls"
    listed = subprocess.run([sys.executable, str(REPO_ROOT / "manage.py"), "nexo_demo", "--help"], env=env,
                            cwd=tmp_path / "elsewhere", capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
