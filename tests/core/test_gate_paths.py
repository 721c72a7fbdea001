"""The gate sees the path that is written: ``ask_when``/``approve_when``/``on_ask`` get the
sandbox's normalised path rooted at ``/``, on both sandboxes, for reads and writes; spellings
that would sidestep a predicate (``app.py/.``, ``./app.py//``) are refused. Scripted models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nexo_django import Agent, ApprovalRequired, Permissions, SecurityError
from nexo_django.core.sandboxes import Sandbox, VirtualSandbox
from nexo_django.core.sandboxes.local import LocalSandbox
from nexo_django.testing import ScriptedModel, reply, tool_call

#: The files a predicate guards, as the seed's example spells them: rooted at "/".
GUARDED = ("/app.py", "/.env")
SECRET = "API_KEY=hunter2"


def guarded(capability: str, detail: Any) -> bool:
    return detail in GUARDED


class World:
    """A sandbox of one kind, and a way to look at what is really in it."""

    def __init__(self, kind: str, tmp_path: Path, files: dict[str, str]) -> None:
        self.kind = kind
        if kind == "virtual":
            self.sandbox: Sandbox = VirtualSandbox(dict(files))
        else:
            root = tmp_path / "ws"
            root.mkdir()
            for name, text in files.items():
                (root / name).write_text(text)
            self.root = root
            self.sandbox = LocalSandbox(root)

    def names(self) -> set[str]:
        if isinstance(self.sandbox, VirtualSandbox):
            return set(self.sandbox.files)
        return {str(p.relative_to(self.root)) for p in self.root.rglob("*")}


@pytest.fixture(params=["virtual", "local"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def gate(mode: str, asked: list[tuple[str, Any]]) -> Permissions:
    def on_ask(capability: str, detail: Any) -> bool:
        asked.append((capability, detail))
        return False  # the person says no to everything they are asked

    return Permissions(mode, allow=(), ask_when=guarded, on_ask=on_ask)


def call_for(tool: str, path: str) -> dict[str, Any]:
    return tool_call("read", path=path) if tool == "read" else tool_call("write", path=path, content="pwned")


def run(world: World, permissions: Permissions, call: dict[str, Any]) -> Any:
    model = ScriptedModel([call, reply("done")])
    return Agent(model=model, sandbox=world.sandbox, permissions=permissions).prompt("go")


# --- a spelling of a guarded file is still the guarded file -------------------------------------


@pytest.mark.parametrize("tool", ["read", "write"])
def test_scripted_ask_on_ask_sees_the_rooted_path_of_dot_slash_dotenv(kind: str, tool: str, tmp_path: Path) -> None:
    files = {".env": SECRET} if tool == "read" else {}
    world = World(kind, tmp_path, files)
    asked: list[tuple[str, Any]] = []
    result = run(world, gate("ask", asked), call_for(tool, "./.env"))
    assert asked == [(tool, "/.env")]
    assert "denied" in result.tool_calls[0].result["error"]
    assert SECRET not in str(result.transcript)
    assert world.names() == set(files)


@pytest.mark.parametrize("tool", ["read", "write"])
def test_scripted_approve_waits_for_dot_slash_dotenv_with_the_normalised_path(
    kind: str, tool: str, tmp_path: Path
) -> None:
    files = {".env": SECRET} if tool == "read" else {}
    world = World(kind, tmp_path, files)
    with pytest.raises(ApprovalRequired) as caught:
        run(world, gate("approve", []), call_for(tool, "./.env"))
    [pending] = caught.value.pending
    assert pending.args["path"] == ".env"  # what the inbox shows is the path that would be used
    assert world.names() == set(files)


# --- spellings that end in a folder are refused --------------------------------------------------


@pytest.mark.parametrize("mode", ["ask", "approve"])
@pytest.mark.parametrize("path", ["app.py/.", "./app.py//", "app.py/"])
def test_scripted_write_with_a_trailing_slash_is_refused_and_nothing_written(
    kind: str, mode: str, path: str, tmp_path: Path
) -> None:
    world = World(kind, tmp_path, {})
    asked: list[tuple[str, Any]] = []
    with pytest.raises(SecurityError, match="ends with"):
        run(world, gate(mode, asked), call_for("write", path))
    assert world.names() == set()
    assert asked == []


@pytest.mark.parametrize("mode", ["ask", "approve"])
@pytest.mark.parametrize("path", ["app.py/.", "./app.py//"])
def test_scripted_read_with_a_trailing_slash_is_refused_and_nothing_read(
    kind: str, mode: str, path: str, tmp_path: Path
) -> None:
    world = World(kind, tmp_path, {"app.py": SECRET})
    model = ScriptedModel([call_for("read", path), reply("done")])
    with pytest.raises(SecurityError, match="ends with"):
        Agent(model=model, sandbox=world.sandbox, permissions=gate(mode, [])).prompt("go")
    assert SECRET not in str(model.requests)


def test_scripted_the_seeds_rooted_predicate_fires(kind: str, tmp_path: Path) -> None:
    world = World(kind, tmp_path, {})
    gate_ = Permissions("approve", approve_when=lambda capability, detail: str(detail).startswith("/protected"))
    with pytest.raises(ApprovalRequired):
        run(world, gate_, tool_call("write", path="protected//keys.txt", content="x"))
    assert run(world, gate_, tool_call("write", path="notes/./today.md", content="x")).content == "done"
    assert "protected/keys.txt" not in world.names()
    assert "notes/today.md" in world.names()


# --- durable: the inbox and an approver's edited arguments ---------------------------------------

SEEN: list[Any] = []


def record(capability: str, detail: Any) -> bool:
    SEEN.append(detail)
    return True


class DotEnvScribe(Agent):
    """Scripted: writes ./.env under approve; the predicate records what the gate saw."""

    model = ScriptedModel([tool_call("write", path="./.env", content="A=1"), reply("Done.")])
    sandbox = "local"
    permissions = Permissions("approve", approve_when=record)


@pytest.fixture
def seen() -> list[Any]:
    SEEN.clear()
    return SEEN


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_scripted_the_inbox_shows_the_normalised_path_the_gate_saw(tmp_path: Path, seen: list[Any]) -> None:
    run_ = DotEnvScribe.run("go", cwd=tmp_path)
    [call] = run_.pending_calls()
    assert call.args == {"path": ".env", "content": "A=1"}
    assert seen == ["/.env"]
    assert not (tmp_path / ".env").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_scripted_edited_arguments_are_gated_on_their_normalised_path(tmp_path: Path, seen: list[Any]) -> None:
    from nexo_django.models import RunStatus

    run_ = DotEnvScribe.run("go", cwd=tmp_path)
    [call] = run_.pending_calls()
    seen.clear()
    call.approve(args={"path": "./notes//today.md", "content": "B=2"})
    run_.refresh_from_db()
    assert run_.status == RunStatus.DONE
    assert seen and set(seen) == {"/notes/today.md"}
    assert (tmp_path / "notes" / "today.md").read_text() == "B=2"
    assert not (tmp_path / ".env").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
@pytest.mark.parametrize("path", ["app.py/.", "./app.py//"])
def test_scripted_edited_arguments_with_a_trailing_slash_are_refused(tmp_path: Path, path: str) -> None:
    from nexo_django.core.errors import InvalidEditedArguments
    from nexo_django.models import CallStatus, Decision

    run_ = DotEnvScribe.run("go", cwd=tmp_path)
    [call] = run_.pending_calls()
    with pytest.raises(InvalidEditedArguments):
        call.approve(args={"path": path, "content": "x"})
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
