"""An approval of a ``write`` is bound to the file version its decision page showed: the informed
look that read-before-write stands for (issue 24, item 1). Scripted model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nexo_django.core.errors import InvalidEditedArguments
from nexo_django.core.sandboxes.local import LocalSandbox
from nexo_django.durable import runs
from nexo_django.models import CallStatus, RunStatus, ToolCall
from tests.admin.support import approver, client_for, csrf_post, decision_url, page_digest
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def _page_version(html: str) -> str:
    match = re.search(r'name="file_version" value="([^"]*)"', html)
    assert match, "the decision page posts no file version"
    return match.group(1)


def _approve_on_page(call: ToolCall, change_before_post: Path | None = None) -> None:
    client = client_for(approver())
    page = client.get(decision_url(call)).content.decode()
    if change_before_post is not None:
        change_before_post.write_text("someone else's edit\n")
    response = csrf_post(client, decision_url(call), {
        "action": "approve", "digest": page_digest(page), "file_version": _page_version(page),
    })
    assert response.status_code == 302


def _write_result(call: ToolCall) -> dict:
    call.refresh_from_db()
    assert isinstance(call.result, dict)
    return call.result


def test_approving_the_shown_overwrite_of_an_unread_file_writes_it_scripted(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("old notes\n")
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    _approve_on_page(call)
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert (tmp_path / "notes.txt").read_text() == "hi"
    result = _write_result(call)
    assert "error" not in result and result["created"] is False
    assert call.status == CallStatus.SUCCEEDED
    assert call.decision.file_version  # the version the page showed is part of what was approved


def test_a_file_changed_after_the_page_showed_it_is_refused_with_a_clear_error_scripted(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("old notes\n")
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    _approve_on_page(call, change_before_post=target)
    assert target.read_text() == "someone else's edit\n"  # the approved write did not clobber it
    result = _write_result(call)
    assert "changed after the approver saw it" in result["error"]
    assert call.status == CallStatus.FAILED


def test_a_file_created_after_the_page_showed_a_new_file_is_refused_scripted(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    _approve_on_page(call, change_before_post=target)
    assert target.read_text() == "someone else's edit\n"
    assert "was created after the approver saw it" in _write_result(call)["error"]


def test_an_approval_without_a_version_binds_the_version_at_suspension_scripted(tmp_path: Path) -> None:
    # Issue 32: it used to be recorded as approved and refused when it ran ("read it first").
    # Issue 45: bound to the version every notice showed, not the file at decision time.
    (tmp_path / "notes.txt").write_text("old notes\n")
    version = LocalSandbox(tmp_path).version("notes.txt")
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    assert call.suspension_version == version
    call.approve(by=approver())
    assert (tmp_path / "notes.txt").read_text() == "hi"
    assert "error" not in _write_result(call) and call.decision.file_version == version


def test_the_api_binds_a_version_too_and_refuses_it_on_a_denial_scripted(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("old notes\n")
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    person = approver()
    with pytest.raises(InvalidEditedArguments, match="plain approval"):
        call.approve(by=person, args={"path": "notes.txt", "content": "y"}, file_version="abc")
    with pytest.raises(InvalidEditedArguments, match="plain approval"):
        runs.decide(call, approved=False, by=person, file_version="abc")
    version = LocalSandbox(tmp_path).version("notes.txt")
    call.approve(by=person, file_version=version)
    assert (tmp_path / "notes.txt").read_text() == "hi"
