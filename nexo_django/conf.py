"""The ``NEXO`` settings dict, read lazily. Defaults live here and nowhere else."""

from __future__ import annotations

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
}


class NexoSettings:
    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None

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

    def reset(self) -> None:
        self._cache = None


nexo_settings = NexoSettings()


def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting == "NEXO":
        nexo_settings.reset()


setting_changed.connect(_reset, dispatch_uid="nexo_django.conf.reset")
