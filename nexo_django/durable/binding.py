"""What an approval is bound to, settled when it is made.

Every approving path (the decision page, the bulk action, the JSON endpoint, ``call.approve()``
and ``aapprove()``, ``run.resume()``, a channel (Slack, a webhook), a standing rule) records its
decision through :func:`nexo_django.durable.runs.decide`, which calls :func:`bind` first. An
approval binds **what was shown to people**, and ends in the call running as approved, or in its
refusal with the reason:

- a ``write`` is bound to its file's version when the call suspended
  (``ToolCall.suspension_version``, taken by the suspending worker: :func:`version_now`), the
  version every notice (the Slack message, the webhook notice, the email) was sent against,
  unless the deciding path passes a later version it displayed (the decision page's diff after a
  reload, ``file_version=`` from a front end). The write then runs without a read first, and only
  while the file is still that version: a file a person edited meanwhile is not overwritten, the
  call fails with the reason ("changed after the approver saw it; nothing was written") and the
  model reads it. Edited arguments that keep the path keep that binding; edited arguments naming
  another file are bound to that file as it is at decision time (the approver named it). A call
  whose version could not be taken at suspension (a row from before the field) is bound to
  nothing: the write then needs the model's own read of the file as it is.
- a ``read`` or ``write`` whose target the sandbox refuses at decision time (``..``, absolute,
  ``~``, NUL, a protected name, a link out of the workspace, a special file, the workspace's
  ``cwd`` link retargeted while the call waited) could never run: :class:`SandboxRefusal`, and
  ``decide`` fails the call and its run with ``SecurityError`` (:mod:`.refusals`) rather than
  leave a run suspended on a call nobody can approve. Nothing is read or written there.
- a file that cannot be looked at now for another reason (an ``OSError``, an agent that cannot be
  rebuilt) is refused now (:class:`~nexo_django.core.errors.ApprovalRefused`), nothing recorded:
  deny it, or decide again once it can be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.errors import ApprovalRefused, ConfigurationError, NexoError, SecurityError
from ..models import ToolCall

if TYPE_CHECKING:
    from ..core.agent import Agent

#: The built-in tools whose approval names a file of the workspace.
FILE_TOOLS = frozenset({"read", "write"})


class SandboxRefusal(ApprovalRefused):
    """The sandbox refuses the approved call's target at decision time: it could never run.
    ``security`` is the sandbox's ``SecurityError`` message (what the run's error says)."""

    def __init__(self, message: str, security: str) -> None:
        super().__init__(message)
        self.security = security


def needs_binding(call: ToolCall) -> bool:
    return call.name in FILE_TOOLS and call.capability == call.name


def version_now(agent: Agent, name: str, capability: str, args: Any) -> str | None:
    """The version of the file a pending ``write`` would replace, as it is now (``""``: no such
    file); None for another call, or a file the sandbox cannot look at now (the decision then
    says why)."""
    path = args.get("path") if isinstance(args, dict) else None
    if name != "write" or capability != "write" or not isinstance(path, str):
        return None
    try:
        return agent.workspace.version(path) or ""
    except (SecurityError, OSError, NexoError):
        return None


def bind(call: ToolCall, args: Any, *, build: Callable[[], Agent], shown: str | None) -> str | None:
    """The file version an approval of ``call`` (with ``args``, edited or not) is bound to: the
    one ``shown`` to the approver, or for a ``write`` its version at suspension (see the module);
    None for other calls. :class:`SandboxRefusal` when the sandbox refuses the target now,
    ``ApprovalRefused`` when it cannot be looked at now."""
    if not needs_binding(call):
        return shown
    path = args.get("path") if isinstance(args, dict) else None
    what = f"{call.name} call {call.tool_call_id}"
    if not isinstance(path, str):
        raise ApprovalRefused(f"{what} cannot be approved: it names no file path; deny it instead")
    try:
        agent = build()
    except SecurityError as exc:  # its workspace is not the one it started in (runs.check_workspace)
        raise SandboxRefusal(f"{what} cannot run: {exc}", str(exc)) from exc
    except (ConfigurationError, ImportError) as exc:
        raise ApprovalRefused(f"{what} cannot be approved: its agent cannot be rebuilt to look at "
                              f"{path!r} ({exc}); deny it or cancel the run") from exc
    try:
        if call.name == "write":
            agent.workspace.check_writable(path)
        # Looked at through the sandbox (a link out of the workspace is refused here too).
        now = agent.workspace.version(path)
        if call.name != "write" or shown is not None:
            return shown
        proposed = call.args.get("path") if isinstance(call.args, dict) else None
        if path == proposed:
            return call.suspension_version  # what the notices showed (None: nothing taken)
        return now or ""  # edited to name another file: that file as the approver named it
    except SecurityError as exc:
        raise SandboxRefusal(f"{what} cannot run: the sandbox refuses {path!r} ({exc})", str(exc)) from exc
    except (OSError, NexoError) as exc:
        raise ApprovalRefused(f"{what} cannot be approved: its file {path!r} cannot be looked at "
                              f"({exc}); deny it, or decide again once it can be") from exc
    finally:
        agent.close()


def version_note(call: ToolCall) -> str:
    """What a notice sent about ``call`` says of the version it was computed from (``""`` for a
    call that is not a ``write``, or whose version was not taken)."""
    version = call.suspension_version
    if call.name != "write" or call.capability != "write" or version is None:
        return ""
    path = call.args.get("path") if isinstance(call.args, dict) else None
    what = f"{path!r}" if isinstance(path, str) else "its file"
    if version == "":
        return (f"Shown against {what} as it was when the call asked: no such file. Approving binds that: "
                "a file created since is not overwritten.")
    return (f"Shown against {what} as it was when the call asked (version {version[:16]}). Approving binds "
            "that version: a change made to the file since is not overwritten.")
