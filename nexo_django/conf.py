"""The ``NEXO`` settings dict, read lazily. Defaults live here and nowhere else."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed

from .core.errors import ConfigurationError

DEFAULTS: dict[str, Any] = {
    # "provider:model" used by agents that declare none (then env NEXO_MODEL).
    "MODEL": None,
    # django-rq queue (a key of RQ_QUEUES) for run jobs.
    "QUEUE": "default",
    # Per-provider options: {"openai": {"base_url": ..., "api_key": ...}, "anthropic": {...}}.
    "PROVIDERS": {},
    # Overrides of nexo_django.tools.Limits fields, e.g. {"read_max_bytes": 65536}.
    "LIMITS": {},
    # How the local sandbox's shell runs (docs/sandboxes.md): {"CONFINE": True (bubblewrap; False
    # runs commands unconfined), "BWRAP": None (path of bwrap; None finds it on PATH), "NETWORK":
    # [] (hosts reachable through the egress proxy), "READ": [] (more paths visible read-only)}.
    "SHELL": {},
    # Names never written inside a workspace (fnmatch patterns); None keeps the built-in list.
    "PROTECTED_NAMES": None,
    # Search backend for agents that declare none: a dotted path to callable(query, limit).
    "SEARCH_BACKEND": None,
    # Seconds a worker's claim on a run lasts without a heartbeat.
    "LEASE_SECONDS": 120,
    # How many times in a row, without progress, the reconciler re-enqueues a run whose worker
    # died before giving up.
    "MAX_RECOVERIES": 3,
    # rq job timeout in seconds; keep it above the model and tool timeouts.
    "JOB_TIMEOUT": 1800,
    # Characters of a tool result kept in a RunEvent (the transcript keeps the result itself).
    "EVENT_MAX_CHARS": 2000,
    # How long a call waits for a person before the reconciler expires it (denied, source
    # "expiry"): a timedelta or seconds; None waits forever. Agent.approval_timeout overrides it.
    "APPROVAL_TIMEOUT": 7 * 24 * 3600,
    # Whether the user who started a run may decide its calls; False asks for a second person.
    "SELF_APPROVAL": True,
    # Emails to the people who may decide: {"EMAIL": bool, "SITE_URL": "https://...",
    # "REMIND_AFTER": seconds or None}. Missing keys take the defaults in nexo_django.notify.
    "NOTIFY": {},
    # Decision channels, by name (docs/channels.md): {"ops": {"BACKEND": "slack", "TOKEN": ...,
    # "SIGNING_SECRET": ..., "CHANNEL": "C0123"}, "audit": {"BACKEND": "webhook", "URL": ...,
    # "SECRET": ...}}. Each notice to each of them goes through the outbox (durable/outbox.py).
    "CHANNELS": {},
    # Days the outbox keeps the delivered and skipped notices of finished runs; the reconciler
    # deletes older ones (failed notices stay until a person sends them again). None keeps all.
    "NOTICES_KEEP_DAYS": 30,
    # Seconds between two ticks of the schedules under rq's cron (`manage.py rqcron
    # nexo_django.durable.schedule_cron`, docs/schedules.md); a slot fires within this of its time.
    "SCHEDULE_TICK": 30,
}


def as_timedelta(value: Any, where: str) -> timedelta | None:
    """``value`` (a timedelta, seconds, or None) as a timedelta; ``ConfigurationError`` naming
    ``where`` otherwise."""
    if value is None:
        return None
    if isinstance(value, timedelta) and value > timedelta(0):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return timedelta(seconds=value)
    raise ConfigurationError(
        f"{where} = {value!r}: give a positive timedelta or number of seconds, or None for calls that wait forever"
    )


class NexoSettings:
    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None
        #: the mappings :meth:`view` built since the last :meth:`reset`
        self._views: dict[tuple[str, ...], Mapping[str, Any]] = {}

    def _load(self) -> dict[str, Any]:
        if self._cache is None:
            user = getattr(django_settings, "NEXO", {}) if django_settings.configured else {}
            if not isinstance(user, dict):
                raise ConfigurationError("settings.NEXO must be a dict, e.g. NEXO = {'MODEL': 'openai:gpt-4.1-mini'}")
            unknown = sorted(set(user) - set(DEFAULTS))
            if unknown:
                raise ConfigurationError(
                    f"unknown NEXO setting(s) {', '.join(unknown)}; known: {', '.join(sorted(DEFAULTS))}"
                )
            self._cache = {**DEFAULTS, **user}
        return self._cache

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in DEFAULTS:
            raise AttributeError(f"no NEXO setting {name!r}")
        return self._load()[name]

    def view(self, names: tuple[str, ...]) -> Mapping[str, Any]:
        """The settings ``names`` as one read-only mapping, built once per load of ``NEXO`` (an
        agent reads its settings each time it is built: once per durable drive)."""
        found = self._views.get(names)
        if found is None:
            found = self._views[names] = MappingProxyType({name: getattr(self, name) for name in names})
        return found

    def reset(self) -> None:
        self._cache = None
        self._views = {}


nexo_settings = NexoSettings()


def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting == "NEXO":
        nexo_settings.reset()


setting_changed.connect(_reset, dispatch_uid="nexo_django.conf.reset")
