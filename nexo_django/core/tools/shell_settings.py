"""``NEXO["SHELL"]`` and the shell caps of ``NEXO["LIMITS"]`` as a :class:`ShellPolicy`.

The Django-facing agent hands the settings in (``Agent.configuration()``); the sandbox only ever
receives the policy. Nothing a model sends reaches this: confinement is off only when settings
(or the code that builds the sandbox) say so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigurationError
from ..sandboxes.confine import ShellPolicy
from .base import Limits
from .egress import EgressProxy
from .netguard import AllowList, FetchRefused

SHELL_KEYS = ("BWRAP", "CONFINE", "GID", "NETWORK", "READ", "UID")


#: policies built, by the text of their setting and their limits (each agent builds its own from
#: the same settings: three times per approval cycle); a few kept, emptied when full
_built: dict[tuple[str, int], tuple[Limits, ShellPolicy]] = {}
BUILT_KEPT = 16


def shell_policy(setting: Any, limits: Limits) -> ShellPolicy:
    """The policy for ``setting`` (``NEXO["SHELL"]``); ``ConfigurationError`` naming the fix.
    A setting whose text (``repr``: types told apart, a changed list seen) and limits object were
    seen before gets the policy built then (immutable, as the limits are)."""
    key = (repr(setting), id(limits))
    found = _built.get(key)
    if found is not None and found[0] is limits:
        return found[1]
    policy = _build(setting, limits)
    if len(_built) >= BUILT_KEPT:
        _built.clear()
    _built[key] = (limits, policy)  # the limits kept too: their id is not reused meanwhile
    return policy


def _build(setting: Any, limits: Limits) -> ShellPolicy:
    if not isinstance(setting, Mapping):
        raise ConfigurationError('NEXO["SHELL"] must be a dict such as {"CONFINE": True, "NETWORK": [], "READ": []}')
    unknown = sorted(set(setting) - set(SHELL_KEYS))
    if unknown:
        raise ConfigurationError(f'unknown NEXO["SHELL"] key(s) {", ".join(unknown)}; known: {", ".join(SHELL_KEYS)}')
    confine = setting.get("CONFINE", True)
    if not isinstance(confine, bool):
        raise ConfigurationError(f'NEXO["SHELL"]["CONFINE"] must be True or False, not {confine!r}')
    bwrap = setting.get("BWRAP")
    if bwrap is not None and (not isinstance(bwrap, str) or not bwrap):
        raise ConfigurationError(f'NEXO["SHELL"]["BWRAP"] must be the path of bwrap (or None), not {bwrap!r}')
    ids: dict[str, int] = {}
    for key in ("UID", "GID"):
        value = setting.get(key, 65534)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**32 - 1:
            raise ConfigurationError(
                f'NEXO["SHELL"]["{key}"] must be the number of an unprivileged host user/group (never 0), not {value!r}'
            )
        ids[key] = value
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("NETWORK", "READ"):
        value = setting.get(key, [])
        if isinstance(value, str) or not all(isinstance(v, str) for v in value):
            raise ConfigurationError(f'NEXO["SHELL"]["{key}"] must be a list of strings, not {value!r}')
        lists[key] = tuple(value)
    try:
        AllowList.parse(lists["NETWORK"])
    except FetchRefused as exc:
        message = str(exc).replace("fetch_allow entry", "host")
        raise ConfigurationError(f'NEXO["SHELL"]["NETWORK"]: {message}') from None
    try:
        return ShellPolicy(
            confine=confine, bwrap=bwrap, network=lists["NETWORK"], read=lists["READ"],
            memory=limits.shell_memory, processes=limits.shell_processes, file_size=limits.shell_file_size,
            cpu_seconds=limits.shell_cpu_seconds, tmp_size=limits.shell_tmp_size,
            workspace_bytes=limits.workspace_max_bytes, workspace_entries=limits.workspace_max_entries,
            uid=ids["UID"], gid=ids["GID"],
            ports=tuple(limits.shell_ports), allow_private=limits.shell_allow_private, egress=EgressProxy,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f'NEXO["SHELL"] / NEXO["LIMITS"] are invalid for the shell: {exc}') from exc
