"""Sandboxes: ``virtual`` (in memory, the default) and ``local`` (a workspace folder)."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigurationError
from .base import DEFAULT_PROTECTED, FileRead, GlobResult, Sandbox, StaleWrite
from .local import LocalSandbox
from .virtual import VirtualSandbox

__all__ = [
    "DEFAULT_PROTECTED",
    "FileRead",
    "GlobResult",
    "LocalSandbox",
    "Sandbox",
    "StaleWrite",
    "VirtualSandbox",
    "from_spec",
    "make_sandbox",
]


def make_sandbox(value: Any, cwd: Any = None, *, protected: tuple[str, ...] | None = None) -> Sandbox:
    """``"virtual"`` (default), ``"local"`` (needs ``cwd``), or a :class:`Sandbox` instance."""
    if isinstance(value, Sandbox):
        return value
    extra: dict[str, Any] = {} if protected is None else {"protected": protected}
    if value in (None, "virtual"):
        return VirtualSandbox(**extra)
    if value == "local":
        if cwd is None:
            raise ConfigurationError(
                'the "local" sandbox needs a workspace folder: pass cwd=... when you build the agent'
            )
        return LocalSandbox(cwd, **extra)
    raise ConfigurationError(
        f'unknown sandbox {value!r}: use "virtual", "local", or a Sandbox instance'
    )


def from_spec(spec: dict[str, Any]) -> Sandbox:
    """Rebuild a sandbox from :meth:`Sandbox.spec` (used by durable runs in another process)."""
    kind = spec.get("kind")
    protected = tuple(spec["protected"]) if "protected" in spec else None
    extra: dict[str, Any] = {} if protected is None else {"protected": protected}
    if kind == "virtual":
        return VirtualSandbox(spec.get("files") or {}, **extra)
    if kind == "local":
        return LocalSandbox(spec["root"], **extra)
    raise ConfigurationError(f"cannot rebuild a sandbox from {spec!r}")
