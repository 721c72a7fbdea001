"""Issue 31's quota, on the run: a confined shell command that leaves the workspace over
``NEXO["LIMITS"]["workspace_max_bytes"]`` fails the run with the reason, before the model is
asked for anything else; the call keeps its output. Real bubblewrap; the model is scripted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nexo_django.models import CallStatus, RunEvent, RunStatus, ToolCall
from tests.durable_agents import Filler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def test_a_shell_call_over_the_quota_fails_the_run_with_the_reason_and_keeps_the_output(
    tmp_path: Path, settings: Any
) -> None:
    settings.NEXO = {**settings.NEXO, "LIMITS": {**settings.NEXO.get("LIMITS", {}), "workspace_max_bytes": 2 * 1024 * 1024}}
    workspace = tmp_path / "ws"
    workspace.mkdir()

    run = Filler.run("Fill it.", cwd=workspace)

    assert run.status == RunStatus.FAILED, run.error
    assert "over its quota" in run.error and "workspace_max_bytes" in run.error
    call = ToolCall.objects.get(run=run)
    assert call.status == CallStatus.FAILED
    assert "workspace_max_bytes" in call.result["error"]
    # It ran, and the kernel stopped its file at what the quota had left (the per-file cap during
    # the call, docs/sandboxes.md): what it wrote is a person's to remove.
    from nexo_django.core.sandboxes.quotawatch import FILE_SLACK

    # (what the quota had left: the folder and its .git placeholder use a few blocks already)
    assert 2 * 1024 * 1024 - 64 * 1024 < (workspace / "big").stat().st_size <= 2 * 1024 * 1024 + FILE_SLACK
    types = list(RunEvent.objects.filter(run=run).order_by("id").values_list("type", flat=True))
    assert types.count("model_request") == 1, types  # the answer was never asked for
    assert "security" in types


def test_under_the_quota_the_same_run_finishes(tmp_path: Path, settings: Any) -> None:
    settings.NEXO = {**settings.NEXO, "LIMITS": {**settings.NEXO.get("LIMITS", {}), "workspace_max_bytes": 8 * 1024 * 1024}}
    workspace = tmp_path / "ws"
    workspace.mkdir()
    run = Filler.run("Fill it.", cwd=workspace)
    assert run.status == RunStatus.DONE and run.result == "Filled.", run.error
