"""``LocalSandbox`` itself: construction, spec, versions, atomic writes, and its guards at the
sandbox level (the attacks through the tools are in test_tools_files.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nexo_django import ConfigurationError, SecurityError
from nexo_django.core.sandboxes import StaleWrite, from_spec, make_sandbox
from nexo_django.core.sandboxes.local import LocalSandbox

OUTSIDE = b"outside\n"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "a.txt").write_bytes(OUTSIDE)
    return folder


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.startswith(".nexo-"))


# --- construction and spec ---------------------------------------------------------------------


def test_missing_root_is_a_configuration_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="nowhere"):
        LocalSandbox(tmp_path / "nowhere")


def test_file_as_root_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigurationError, match="not a directory"):
        LocalSandbox(tmp_path / "file")


def test_root_is_canonical_and_a_string(ws: Path) -> None:
    (ws.parent / "entry").symlink_to(ws)
    sandbox = LocalSandbox(ws.parent / "entry" / ".")
    assert sandbox.root == os.path.realpath(ws)
    assert isinstance(sandbox.root, str)


def test_spec_rebuilds_the_same_sandbox(ws: Path) -> None:
    sandbox = LocalSandbox(ws, protected=("*.lock",))
    spec = sandbox.spec()
    assert spec == {"kind": "local", "root": str(ws), "protected": ["*.lock"]}
    again = from_spec(spec)
    assert isinstance(again, LocalSandbox)
    assert again.root == sandbox.root and again.protected == ("*.lock",)
    with pytest.raises(SecurityError):
        again.write("x.lock", b"", expected_version=None)


def test_make_sandbox_local_needs_a_folder(ws: Path) -> None:
    with pytest.raises(ConfigurationError, match="cwd"):
        make_sandbox("local")
    sandbox = make_sandbox("local", ws)
    assert isinstance(sandbox, LocalSandbox)
    assert (sandbox.kind, sandbox.can_write, sandbox.can_shell) == ("local", True, True)


# --- versions and writes ----------------------------------------------------------------------


def test_version_is_none_for_absent_files_and_folders(ws: Path) -> None:
    sandbox = LocalSandbox(ws)
    (ws / "dir").mkdir()
    (ws / "file").write_text("x")
    assert sandbox.version("nope.txt") is None
    assert sandbox.version("no/such/dir.txt") is None
    assert sandbox.version("file/below") is None
    assert sandbox.version("dir") is None


def test_version_matches_the_read_and_changes_with_the_file(ws: Path) -> None:
    sandbox = LocalSandbox(ws)
    first = sandbox.write("a.txt", b"one", expected_version=None)
    assert sandbox.version("a.txt") == first == sandbox.read("a.txt", 100).version
    second = sandbox.write("a.txt", b"two", expected_version=first)
    assert second != first and sandbox.version("a.txt") == second


def test_in_place_edit_that_keeps_size_and_mtime_still_changes_the_version(ws: Path) -> None:
    sandbox = LocalSandbox(ws)
    first = sandbox.write("a.txt", b"one", expected_version=None)
    before = os.stat(ws / "a.txt")
    (ws / "a.txt").write_bytes(b"two")
    os.utime(ws / "a.txt", ns=(before.st_atime_ns, before.st_mtime_ns))
    assert sandbox.version("a.txt") != first


def test_stale_write_is_refused(ws: Path) -> None:
    sandbox = LocalSandbox(ws)
    seen = sandbox.write("a.txt", b"one", expected_version=None)
    (ws / "a.txt").write_bytes(b"changed meanwhile")
    with pytest.raises(StaleWrite):
        sandbox.write("a.txt", b"mine", expected_version=seen)
    with pytest.raises(StaleWrite):
        sandbox.write("a.txt", b"mine", expected_version=None)
    assert (ws / "a.txt").read_bytes() == b"changed meanwhile"
    assert leftovers(ws) == []


def test_write_of_a_file_that_appeared_meanwhile_is_stale(ws: Path) -> None:
    sandbox = LocalSandbox(ws)
    with pytest.raises(StaleWrite):
        sandbox.write("b.txt", b"x", expected_version="a version of a file that is gone")


def test_new_file_mode_is_0644_whatever_the_umask(ws: Path) -> None:
    old = os.umask(0o077)
    try:
        LocalSandbox(ws).write("new.txt", b"x", expected_version=None)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(ws / "new.txt").st_mode) == 0o644


def test_write_keeps_permission_bits_but_never_setuid(ws: Path) -> None:
    sandbox = LocalSandbox(ws)
    (ws / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(ws / "run.sh", 0o4755)
    sandbox.write("run.sh", b"#!/bin/sh\necho\n", expected_version=sandbox.version("run.sh"))
    assert stat.S_IMODE(os.stat(ws / "run.sh").st_mode) == 0o755


def test_write_is_atomic_and_leaves_no_temp_file(ws: Path) -> None:
    sandbox = LocalSandbox(ws)
    (ws / "a.txt").write_text("old")
    inode = os.stat(ws / "a.txt").st_ino
    sandbox.write("a.txt", b"new", expected_version=sandbox.version("a.txt"))
    assert (ws / "a.txt").read_text() == "new"
    assert os.stat(ws / "a.txt").st_ino != inode  # a new entry, renamed over the old one
    assert leftovers(ws) == []


def test_write_over_a_folder_is_an_error_and_changes_nothing(ws: Path) -> None:
    (ws / "dir").mkdir()
    with pytest.raises(IsADirectoryError):
        LocalSandbox(ws).write("dir", b"x", expected_version=None)
    assert (ws / "dir").is_dir() and leftovers(ws) == []


def test_write_below_a_file_is_an_error(ws: Path) -> None:
    (ws / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        LocalSandbox(ws).write("file/below.txt", b"x", expected_version=None)


# --- guards at the sandbox level ------------------------------------------------------------------


def test_check_then_swap_then_write_is_refused_on_the_descriptor(ws: Path) -> None:
    sandbox = LocalSandbox(ws)
    (ws / "sub").mkdir()
    assert sandbox.version("sub/a.txt") is None  # the check passes ...
    (ws / "sub").rmdir()
    (ws / "sub").symlink_to(ws.parent / "outside")  # ... then a link is swapped in
    with pytest.raises(SecurityError):
        sandbox.write("sub/a.txt", b"pwned", expected_version=None)
    assert (ws.parent / "outside" / "a.txt").read_bytes() == OUTSIDE


def test_symlink_as_a_final_name_is_refused_by_version_and_read(ws: Path) -> None:
    sandbox = LocalSandbox(ws)
    (ws / "a.txt").symlink_to(ws.parent / "outside" / "a.txt")
    with pytest.raises(SecurityError):
        sandbox.version("a.txt")
    with pytest.raises(SecurityError):
        sandbox.read("a.txt", 100)
    with pytest.raises(SecurityError):
        sandbox.write("a.txt", b"pwned", expected_version=None)
    assert (ws / "a.txt").is_symlink()


def test_fifo_version_is_refused(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    with pytest.raises(SecurityError, match="FIFO"):
        LocalSandbox(ws).version("pipe")


def test_root_replaced_by_another_folder_is_refused(ws: Path) -> None:
    sandbox = LocalSandbox(ws)
    ws.rename(ws.parent / "ws-old")
    ws.mkdir()  # same path, a different directory
    with pytest.raises(SecurityError, match="replaced"):
        sandbox.read("a.txt", 10)
    with pytest.raises(SecurityError, match="replaced"):
        sandbox.shell("true", timeout=5, max_output=100)


def test_glob_does_not_descend_into_folders_that_cannot_match(ws: Path) -> None:
    (ws / "src").mkdir()
    (ws / "src" / "a.py").write_text("")
    (ws / "node_modules" / "x" / "y").mkdir(parents=True)  # deeper than max_depth if visited
    (ws / "b.py").write_text("")
    sandbox = LocalSandbox(ws)
    for pattern, expected in (("src/*.py", ["src/a.py"]), ("*.py", ["b.py"])):
        result = sandbox.glob(pattern, max_entries=10, max_depth=2, timeout=5)
        assert (result.paths, result.truncated) == (expected, False)
    assert sandbox.glob("**/*.py", max_entries=10, max_depth=2, timeout=5).truncated is True


def test_glob_lists_regular_files_only(ws: Path) -> None:
    (ws / "dir").mkdir()
    os.mkfifo(ws / "pipe")
    (ws / "file").write_text("")
    result = LocalSandbox(ws).glob("*", max_entries=10, max_depth=5, timeout=5)
    assert result.paths == ["file"] and not result.truncated
