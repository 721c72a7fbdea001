"""``VirtualSandbox``: the in-memory default. No shell, nothing on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexo_django import Permissions, SecurityError
from nexo_django.core.sandboxes import StaleWrite, VirtualSandbox, from_spec, make_sandbox
from nexo_django.core.tools import SHELL, ToolContext


@pytest.mark.parametrize(
    "path",
    ["", "../x", "a/../../x", "a/..", "/etc/passwd", "~/x", "a\x00b", "n" * 256, "a/" * 2049],
)
def test_escaping_or_malformed_paths_are_refused(path: str) -> None:
    sandbox = VirtualSandbox({"a.txt": "alpha"})
    with pytest.raises(SecurityError):
        sandbox.write(path, b"x", expected_version=None)
    with pytest.raises(SecurityError):
        sandbox.read(path, 10)
    assert sandbox.files == {"a.txt": b"alpha"}


def test_normalize_collapses_dots_and_slashes() -> None:
    assert VirtualSandbox().normalize("./a//b/./c.txt") == "a/b/c.txt"


@pytest.mark.parametrize("pattern", ["../*", "/etc/*", "~/*", "a/../../*", "*\x00"])
def test_escaping_glob_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(SecurityError):
        VirtualSandbox().glob(pattern, max_entries=10, max_depth=5, timeout=1)


@pytest.mark.parametrize("path", [".git/hooks/pre-commit", ".git/config", ".bashrc", "sub/.profile"])
def test_protected_names_are_never_written(path: str) -> None:
    sandbox = VirtualSandbox()
    with pytest.raises(SecurityError):
        sandbox.write(path, b"x", expected_version=None)
    assert sandbox.files == {}


def test_stale_and_unexpected_writes_are_refused() -> None:
    sandbox = VirtualSandbox({"a.txt": "one"})
    seen = sandbox.version("a.txt")
    sandbox.files["a.txt"] = b"changed"
    with pytest.raises(StaleWrite):
        sandbox.write("a.txt", b"mine", expected_version=seen)
    with pytest.raises(StaleWrite):
        sandbox.write("a.txt", b"mine", expected_version=None)
    assert sandbox.files["a.txt"] == b"changed"


def test_read_is_capped_and_folders_are_not_files() -> None:
    sandbox = VirtualSandbox({"d/long.txt": "0123456789"})
    got = sandbox.read("d/long.txt", 4)
    assert (got.data, got.size, got.truncated) == (b"0123", 10, True)
    with pytest.raises(IsADirectoryError):
        sandbox.read("d", 4)
    with pytest.raises(FileNotFoundError):
        sandbox.read("nope", 4)


def test_glob_is_bounded_by_entries_and_depth() -> None:
    sandbox = VirtualSandbox({f"f{i}.txt": "" for i in range(5)} | {"a/b/c/deep.txt": ""})
    capped = sandbox.glob("*.txt", max_entries=3, max_depth=5, timeout=1)
    assert capped.paths == ["f0.txt", "f1.txt", "f2.txt"] and capped.truncated
    shallow = sandbox.glob("**/*.txt", max_entries=100, max_depth=2, timeout=1)
    assert "a/b/c/deep.txt" not in shallow.paths


def test_shell_is_an_error_and_touches_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    sandbox = VirtualSandbox()
    result = sandbox.shell(f"touch {marker}", timeout=5, max_output=100)
    assert result == {"error": "the virtual sandbox has no shell"}
    assert not marker.exists()


def test_shell_tool_over_the_virtual_sandbox_returns_the_error(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ctx = ToolContext(sandbox=VirtualSandbox(), permissions=Permissions("auto"))
    assert SHELL.invoke({"command": f"touch {marker}"}, ctx) == {"error": "the virtual sandbox has no shell"}
    assert not marker.exists()
    assert VirtualSandbox.can_shell is False


def test_spec_round_trip_keeps_text_files() -> None:
    sandbox = VirtualSandbox({"a.txt": "alpha", "b/c.md": "gamma"})
    again = from_spec(sandbox.spec())
    assert isinstance(again, VirtualSandbox)
    assert again.files == {"a.txt": b"alpha", "b/c.md": b"gamma"}


def test_make_sandbox_defaults_to_virtual() -> None:
    assert isinstance(make_sandbox(None), VirtualSandbox)
    assert isinstance(make_sandbox("virtual"), VirtualSandbox)


def test_spec_round_trip_keeps_protected_names_and_non_utf8_bytes() -> None:
    box = VirtualSandbox({"a.bin": b"\xff\xfe ok"}, protected=("secret/*",))
    again = from_spec(box.spec())
    assert again.read("a.bin", 100).data == b"\xff\xfe ok"
    assert again.protected == ("secret/*",)


def test_kept_path_verdicts_never_let_a_refused_path_or_name_through() -> None:
    """A path's normal form and its protected-name verdict are kept (issue 34): a path refused
    stays refused however often it is asked, and a path fine under one sandbox's protected names
    is still refused by a sandbox that protects it."""
    from nexo_django.core.sandboxes import base

    plain, strict = VirtualSandbox(), VirtualSandbox(protected=("notes/*.txt",))
    for _ in range(3):
        assert plain.check_writable("./notes//a.txt") == "notes/a.txt"
        with pytest.raises(SecurityError, match="protected name"):
            strict.check_writable("notes/a.txt")
        with pytest.raises(SecurityError, match="'..'"):
            base.normalize_relative("notes/../../x")
        with pytest.raises(SecurityError, match="protected name"):
            plain.check_writable(".bashrc")
    assert "notes/../../x" not in base._normal
    assert ((plain.protected, "notes/a.txt") in base._unprotected
            and (strict.protected, "notes/a.txt") not in base._unprotected)
