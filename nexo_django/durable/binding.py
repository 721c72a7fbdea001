"""What an approval is bound to, settled when it is made.

Every approving path (the decision page, the bulk action, the JSON endpoint, ``call.approve()``
and ``aapprove()``, ``run.resume()``, a standing rule) records its decision through
:func:`nexo_django.durable.runs.decide`, which calls :func:`bind` first. An approval must end in
the call running as approved, or be refused now, with the reason, and not recorded:

- a ``read`` or ``write`` whose path the sandbox refuses (``..``, absolute, ``~``, NUL, a
  protected name, a link out of the workspace) would fail its run when it ran: refused now
  (:class:`~nexo_django.core.errors.ApprovalRefused`);
- a ``write`` is bound to its file as it is now, the version the approver could have looked at
  (``""``: no such file), unless the approver was shown one (the decision page's diff): it then
  runs without a read first, and only while the file is still that version. Edited arguments are
  bound to the file they name, looked at here, never to a version a page sends.
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


def needs_binding(call: ToolCall) -> bool:
    return call.name in FILE_TOOLS and call.capability == call.name


def bind(call: ToolCall, args: Any, *, build: Callable[[], Agent], shown: str | None) -> str | None:
    """The file version an approval of ``call`` (with ``args``, edited or not) is bound to: the
    one ``shown`` to the approver, or for a ``write`` the file's version now (``""``: none);
    None for other calls. ``ApprovalRefused`` when the call could not run as approved."""
    if not needs_binding(call):
        return shown
    path = args.get("path") if isinstance(args, dict) else None
    what = f"{call.name} call {call.tool_call_id}"
    if not isinstance(path, str):
        raise ApprovalRefused(f"{what} cannot be approved: it names no file path; deny it instead")
    try:
        agent = build()
    except SecurityError as exc:  # its workspace is not the one it started in (runs.check_workspace)
        raise ApprovalRefused(f"{what} cannot be approved: {exc}") from exc
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
        return now or ""
    except SecurityError as exc:
        raise ApprovalRefused(f"{what} cannot be approved: the sandbox refuses {path!r} ({exc}), so it "
                              "could never run; deny it instead") from exc
    except (OSError, NexoError) as exc:
        raise ApprovalRefused(f"{what} cannot be approved: its file {path!r} cannot be looked at "
                              f"({exc}); deny it, or decide again once it can be") from exc
    finally:
        agent.close()
