"""The decision page's workspace and write diff (admin_preview), read through the run's sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client, override_settings

from nexo_django import Agent
from nexo_django.admin import previews as admin_preview
from nexo_django.admin.previews import call_preview, write_diff
from nexo_django.core.sandboxes import VirtualSandbox
from nexo_django.core.sandboxes.local import LocalSandbox
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.admin.support import INBOX, make_user
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def test_a_missing_file_is_a_new_file_with_every_line_added(tmp_path: Path) -> None:
    preview = write_diff(LocalSandbox(tmp_path), "notes/today.md", "one\ntwo\n")
    assert preview.kind == "new"
    assert [kind for kind, _ in preview.diff] == ["@", "+", "+"]
    assert str(tmp_path.resolve()) in preview.workspace


def test_a_changed_file_is_diffed_and_model_text_is_escaped(tmp_path: Path) -> None:
    (tmp_path / "a.html").write_text("<p>old</p>\n")
    preview = write_diff(LocalSandbox(tmp_path), "a.html", "<script>x()</script>\u202e\n")
    assert preview.kind == "changed"
    lines = dict((str(line), kind) for kind, line in preview.diff)
    assert lines["-&lt;p&gt;old&lt;/p&gt;"] == "-"
    added = [str(line) for kind, line in preview.diff if kind == "+"]
    assert added[0].startswith("+&lt;script&gt;x()&lt;/script&gt;<span class=\"nexo-hidden-char\"")


def test_the_same_content_is_unchanged(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("same\n")
    assert write_diff(LocalSandbox(tmp_path), "a.txt", "same\n").kind == "unchanged"


def test_large_files_are_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin_preview, "DIFF_MAX_BYTES", 1024)
    monkeypatch.setattr(admin_preview, "DIFF_MAX_LINES", 10)
    (tmp_path / "big.txt").write_text("x\n" * 5000)
    preview = write_diff(LocalSandbox(tmp_path), "big.txt", "y\n" * 5000)
    assert any("only the first 1 KiB" in n for n in preview.notes)
    assert any("the first 10 are shown" in n for n in preview.notes)
    assert len(preview.diff) == 10


def test_a_path_outside_the_workspace_is_never_read(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("top secret\n")
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "link").symlink_to(tmp_path / "secret.txt")
    sandbox = LocalSandbox(tmp_path / "ws")
    for path in ("../secret.txt", "link", "/etc/passwd"):
        preview = write_diff(sandbox, path, "x")
        assert preview.kind == "unavailable"
        assert preview.diff == []
        assert "top secret" not in " ".join(preview.notes)


def test_a_virtual_workspace_is_compared_in_memory() -> None:
    preview = write_diff(VirtualSandbox({"a.txt": "old\n"}), "a.txt", "new\n")
    assert preview.kind == "changed"
    assert "in-memory" in preview.workspace


def test_call_preview_of_a_durable_run_and_the_decision_page(tmp_path: Path) -> None:
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    preview = call_preview(run, call)
    assert preview.kind == "new"
    make_user("ann", "nexo_django.decide_toolcall")
    client = Client()
    client.force_login(make_user("bob", "nexo_django.decide_toolcall"))
    page = client.get(f"{INBOX}{call.pk}/change/").content.decode()
    assert 'id="workspace"' in page and str(tmp_path.resolve()) in page
    assert 'data-kind="new"' in page and "New file" in page


def test_a_call_that_is_not_a_write_shows_the_workspace_only(tmp_path: Path) -> None:
    from nexo_django.models import ToolCall

    run = Scribe.run("write hi", cwd=tmp_path)
    call = ToolCall(run=run, name="shell", capability="shell", args={"command": "ls"})
    preview = call_preview(run, call)
    assert preview.kind == "" and preview.diff == []
    assert str(tmp_path.resolve()) in preview.workspace


class ShellRunner(Agent):
    """Scripted: asks to run one shell command, under approve."""

    model = ScriptedModel([tool_call("shell", command="make build"), reply("Built.")])
    sandbox = "local"
    permissions = "approve"


def test_a_shell_call_says_which_confinement_and_hosts_it_runs_under(tmp_path: Path) -> None:
    with override_settings(NEXO={"SHELL": {"NETWORK": ["pypi.example.org", "*.corp.example"]}}):
        run = ShellRunner.run("build it", cwd=tmp_path)
        [call] = run.pending_calls()
        preview = call_preview(run, call)
        assert preview.confinement.startswith("bubblewrap:")
        assert "pypi.example.org, *.corp.example" in preview.confinement
        client = Client()
        client.force_login(make_user("bob", "nexo_django.decide_toolcall"))
        page = client.get(f"{INBOX}{call.pk}/change/").content.decode()
    assert 'id="confinement"' in page and "through the egress proxy" in page


def test_a_shell_call_without_hosts_says_no_network(tmp_path: Path) -> None:
    run = ShellRunner.run("build it", cwd=tmp_path)
    [call] = run.pending_calls()
    assert "no network" in call_preview(run, call).confinement


def test_an_unconfined_shell_call_says_so(tmp_path: Path) -> None:
    with override_settings(NEXO={"SHELL": {"CONFINE": False}}):
        run = ShellRunner.run("build it", cwd=tmp_path)
        [call] = run.pending_calls()
        assert call_preview(run, call).confinement.startswith("NOT confined")


def test_a_write_call_has_no_confinement_line(tmp_path: Path) -> None:
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    assert call_preview(run, call).confinement == ""


# --- bytes, not lines: a diff never calls different bytes equal ---------------------------------


@pytest.mark.parametrize(
    ("old", "new", "shown"),
    [
        pytest.param(b"echo hi # rm -rf ~\n", "echo hi #\vrm -rf ~\n", "⟦U+000B⟧", id="vertical-tab"),
        pytest.param(b"a\nb\n", "a\rb\n", "⟦U+000D⟧", id="CR-for-LF"),
        pytest.param(b"a\r\nb\r\n", "a\nb\n", "⟦U+000D⟧", id="CRLF-to-LF"),
        pytest.param(b"a\nb\n", "a\u2028b\n", "⟦U+2028⟧", id="line-separator"),
        pytest.param(b"a\nb\n", "a\nb", "no newline at end of file", id="final-newline-dropped"),
        pytest.param(b"caf\xff\n", "caf\ufffd\n", "⟦U+DCFF⟧", id="invalid-utf8"),
    ],
)
def test_bytes_that_differ_are_never_unchanged_and_the_difference_is_visible(
    tmp_path: Path, old: bytes, new: str, shown: str
) -> None:
    (tmp_path / "f.sh").write_bytes(old)
    preview = write_diff(LocalSandbox(tmp_path), "f.sh", new)
    assert preview.kind == "changed"
    assert any(kind in "+-" for kind, _ in preview.diff)
    assert any(shown in str(line) for _, line in preview.diff)


def test_equal_prefixes_past_the_cut_are_never_called_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin_preview, "DIFF_MAX_BYTES", 1024)
    (tmp_path / "big.txt").write_text("x" * 2000)
    preview = write_diff(LocalSandbox(tmp_path), "big.txt", "x" * 1024 + "y" * 976)
    assert preview.kind == "same_prefix"
    assert any("only the first 1 KiB are compared" in n for n in preview.notes)


def test_an_8_gib_sparse_file_makes_a_small_diff(tmp_path: Path) -> None:
    with open(tmp_path / "disk.img", "wb") as sparse:
        sparse.truncate(8 * 1024**3)  # no blocks written: the file system keeps it sparse
    preview = write_diff(LocalSandbox(tmp_path), "disk.img", "boot\n")
    assert preview.kind == "changed"
    html = "".join(str(line) for _, line in preview.diff)
    assert len(html) < 50_000
    assert "⟦U+0000⟧" in html and "×" in html  # the run of NULs shown as one marker with its count
    assert any("8,589,934,592 bytes" in n for n in preview.notes)


def test_the_decision_page_says_same_bytes_only_when_every_byte_was_compared(tmp_path: Path) -> None:
    from tests.admin.support import approver, client_for, decision_url

    (tmp_path / "notes.txt").write_bytes(b"hi\r\n")
    run = Scribe.run("write hi", cwd=tmp_path)  # proposes "hi"
    html = client_for(approver()).get(decision_url(run.pending_calls().get())).content.decode()
    assert "already has exactly this content" not in html
    assert 'data-kind="changed"' in html
