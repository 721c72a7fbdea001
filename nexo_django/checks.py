"""System checks: stable ids, and a hint that names the fix."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError, connections, router
from django.utils.module_loading import import_string

from .conf import DEFAULTS, as_timedelta, nexo_settings
from .core.errors import ConfigurationError
from .core.llm import PROVIDERS, resolve_model
from .core.sandboxes.confine import bwrap_problem
from .core.sandboxes.seccomp import seccomp_problem
from .core.tools import Limits
from .core.tools.shell_settings import shell_policy
from .durable.queue_health import queue_warning
from .models import AgentRun

POSITIVE_INTS = ("LEASE_SECONDS", "MAX_RECOVERIES", "JOB_TIMEOUT", "EVENT_MAX_CHARS", "SCHEDULE_TICK")


@register(Tags.compatibility)
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    nexo_settings.reset()
    try:
        nexo_settings.QUEUE  # noqa: B018 - loading validates the dict
    except ConfigurationError as exc:
        return [Error(str(exc), hint="Fix or remove the key in settings.NEXO.", id="nexo_django.E001")]
    errors: list[CheckMessage] = []
    if "django_rq" not in settings.INSTALLED_APPS:
        errors.append(Error(
            "nexo_django needs django_rq in INSTALLED_APPS to run durable jobs.",
            hint='Add "django_rq" to INSTALLED_APPS (before or after "nexo_django").',
            id="nexo_django.E002",
        ))
    queues = getattr(settings, "RQ_QUEUES", None) or {}
    queue = nexo_settings.QUEUE
    if queue not in queues:
        errors.append(Error(
            f'NEXO["QUEUE"] is {queue!r}, which is not a key of RQ_QUEUES.',
            hint=f'Add RQ_QUEUES = {{{queue!r}: {{"ASYNC": False}}}} for an inline queue with no Redis, '
            f'or {{{queue!r}: {{"URL": "redis://..."}}}} for workers.',
            id="nexo_django.E003",
        ))
    errors.extend(_check_model())
    errors.extend(_check_values())
    errors.extend(_check_shell())
    return errors


def _check_shell() -> list[CheckMessage]:
    """E010: NEXO["SHELL"] unusable. W006: confinement is on but bubblewrap cannot run here, so
    every shell command will be refused (a warning: projects without a local shell still work).
    W009: the same, because the seccomp filter cannot be built (pyseccomp or libseccomp2 missing).
    W007: confinement is off."""
    try:
        limits = Limits.from_mapping(nexo_settings.LIMITS)
    except (TypeError, ValueError):
        return []  # E005 says so
    try:
        policy = shell_policy(nexo_settings.SHELL, limits)
    except ConfigurationError as exc:
        return [Error(str(exc), hint='See docs/settings.md, NEXO["SHELL"].', id="nexo_django.E010")]
    if not policy.confine:
        return [Warning(
            'NEXO["SHELL"]["CONFINE"] is False: shell commands run unconfined, as the worker\'s user, '
            "with its files and network.",
            hint="Remove the key to confine them with bubblewrap (docs/sandboxes.md).",
            id="nexo_django.W007",
        )]
    seccomp = seccomp_problem()
    if seccomp is not None:
        return [Warning(
            f"The local sandbox's shell cannot build its seccomp filter, so it will refuse every command: {seccomp}",
            hint="pip install 'nexo-django[shell]' (pyseccomp) and apt-get install libseccomp2; "
            "NEXO['SHELL']['CONFINE'] = False runs commands unconfined instead.",
            id="nexo_django.W009",
        )]
    problem = bwrap_problem(policy)
    if problem is None:
        return []
    return [Warning(
        f"The local sandbox's shell cannot confine commands, so it will refuse every one: {problem}",
        hint="Install bubblewrap (apt-get install bubblewrap) or point NEXO['SHELL']['BWRAP'] at it; "
        "NEXO['SHELL']['CONFINE'] = False runs commands unconfined instead.",
        id="nexo_django.W006",
    )]


def _check_model() -> list[CheckMessage]:
    model = nexo_settings.MODEL or os.environ.get("NEXO_MODEL")
    if model is None:
        return [Warning(
            "No default model: every agent must declare its own `model`.",
            hint='Set NEXO["MODEL"] = "openai:gpt-4.1-mini" (or the NEXO_MODEL environment variable), '
            "or declare `model` on each Agent class.",
            id="nexo_django.W001",
        )]
    if not isinstance(model, str):
        return []  # a model object: nothing to parse
    provider, sep, name = model.partition(":")
    if not sep or not name or provider not in PROVIDERS:
        return [Error(
            f"The default model {model!r} is not 'provider:model' with a known provider.",
            hint=f"Use one of {', '.join(PROVIDERS)}, e.g. 'openai:gpt-4.1-mini' or 'anthropic:claude-sonnet-4-5'.",
            id="nexo_django.E004",
        )]
    return _check_provider_key(model)


def _check_provider_key(model: str) -> list[CheckMessage]:
    """The provider's key, from settings or the environment, as the first run would need it:
    building the model object reads them and sends nothing."""
    providers = nexo_settings.PROVIDERS
    try:
        resolve_model(model, providers if isinstance(providers, dict) else None)
    except ConfigurationError as exc:
        provider = model.partition(":")[0]
        return [Warning(
            f"The default model {model!r} cannot be used: {exc}. Every run of an agent without a "
            "model of its own fails until it is fixed.",
            hint=f'Set {provider.upper()}_API_KEY in the environment of the web and worker processes, '
            f'or NEXO["PROVIDERS"]["{provider}"]["api_key"]; for a local server set its base_url.',
            id="nexo_django.W008",
        )]
    return []


def _check_values() -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    try:
        Limits.from_mapping(nexo_settings.LIMITS)
    except (TypeError, ValueError) as exc:
        errors.append(Error(f'NEXO["LIMITS"] is invalid: {exc}', hint="See docs/settings.md for the limits.",
                            id="nexo_django.E005"))
    for key in POSITIVE_INTS:
        value = getattr(nexo_settings, key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            errors.append(Error(f'NEXO["{key}"] must be a positive whole number, not {value!r}.',
                                hint=f"The default is {DEFAULTS[key]}.", id="nexo_django.E006"))
    keep = nexo_settings.NOTICES_KEEP_DAYS
    if keep is not None and (not isinstance(keep, int) or isinstance(keep, bool) or keep <= 0):
        errors.append(Error(f'NEXO["NOTICES_KEEP_DAYS"] must be a positive whole number of days or None, not {keep!r}.',
                            hint=f"The default is {DEFAULTS['NOTICES_KEEP_DAYS']}; None keeps every notice.",
                            id="nexo_django.E006"))
    backend = nexo_settings.SEARCH_BACKEND
    if backend is not None:
        try:
            found = import_string(backend) if isinstance(backend, str) else backend
        except ImportError as exc:
            found = None
            errors.append(Error(f'NEXO["SEARCH_BACKEND"] {backend!r} cannot be imported: {exc}',
                                hint="Give the dotted path of a callable(query, limit).", id="nexo_django.E007"))
        if found is not None and not callable(found):
            errors.append(Error(f'NEXO["SEARCH_BACKEND"] {backend!r} is not callable.',
                                hint="Give the dotted path of a callable(query, limit).", id="nexo_django.E007"))
    providers = nexo_settings.PROVIDERS
    if not isinstance(providers, dict) or any(
        p not in PROVIDERS or not isinstance(v, dict) for p, v in providers.items()
    ):
        errors.append(Error(f'NEXO["PROVIDERS"] must map provider names ({", ".join(PROVIDERS)}) to dicts of options.',
                            hint='For example {"openai": {"base_url": "http://127.0.0.1:11434/v1"}}.',
                            id="nexo_django.E008"))
    names = nexo_settings.PROTECTED_NAMES
    if names is not None and (isinstance(names, str) or not all(isinstance(n, str) for n in names)):
        errors.append(Error('NEXO["PROTECTED_NAMES"] must be a list of glob patterns (strings) or None.',
                            hint='For example [".git/hooks/*", ".git/config", ".bashrc"].', id="nexo_django.E009"))
    errors.extend(_check_approvals())
    return errors


def _check_approvals() -> list[CheckMessage]:
    """APPROVAL_TIMEOUT, SELF_APPROVAL and NOTIFY (docs/admin.md, the approval lifecycle)."""
    errors: list[CheckMessage] = []
    try:
        as_timedelta(nexo_settings.APPROVAL_TIMEOUT, 'NEXO["APPROVAL_TIMEOUT"]')
    except ConfigurationError as exc:
        errors.append(Error(str(exc), hint="For example 7 * 24 * 3600 (a week, the default), timedelta(hours=8), "
                            "or None.", id="nexo_django.E020"))
    if not isinstance(nexo_settings.SELF_APPROVAL, bool):
        errors.append(Error(f'NEXO["SELF_APPROVAL"] must be True or False, not {nexo_settings.SELF_APPROVAL!r}.',
                            hint="False: the person who started a run cannot decide its calls.", id="nexo_django.E021"))
    notify = nexo_settings.NOTIFY
    fix = 'For example {"EMAIL": True, "SITE_URL": "https://ops.example.com", "REMIND_AFTER": 3600}.'
    if not isinstance(notify, dict):
        return [*errors, Error(f'NEXO["NOTIFY"] must be a dict, not {notify!r}.', hint=fix, id="nexo_django.E022")]
    unknown = sorted(set(notify) - {"EMAIL", "SITE_URL", "REMIND_AFTER"})
    problems = [f"unknown key(s) {', '.join(unknown)}"] if unknown else []
    if not isinstance(notify.get("EMAIL", False), bool):
        problems.append("EMAIL must be True or False")
    site = notify.get("SITE_URL", "")
    parts = urlsplit(site) if isinstance(site, str) else None
    if notify.get("EMAIL") and (parts is None or parts.scheme not in ("http", "https") or not parts.netloc):
        problems.append(f"SITE_URL must be the absolute http(s) address of the site the links point to, not {site!r}")
    after = notify.get("REMIND_AFTER")
    if after is not None and (isinstance(after, bool) or not isinstance(after, (int, float)) or after <= 0):
        problems.append(f"REMIND_AFTER must be a positive number of seconds or None, not {after!r}")
    if problems:
        errors.append(Error(f'NEXO["NOTIFY"] is invalid: {"; ".join(problems)}.', hint=fix, id="nexo_django.E022"))
    return errors


#: What docs/settings.md recommends for SQLite: WAL, and a sync of the WAL at every commit.
SQLITE_INIT_COMMAND = "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL"
_PRAGMA = re.compile(r"^\s*PRAGMA\s+(?:\w+\.)?(\w+)\s*=\s*['\"]?(\w+)['\"]?\s*$", re.IGNORECASE)
_WEAK_SYNC = {"OFF": "OFF", "0": "OFF", "NORMAL": "NORMAL", "1": "NORMAL"}


@register(Tags.compatibility)
def check_database(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """The SQLite journal of the database that holds the runs, read from settings only: a check
    opens no connection (``manage.py check`` must work with the database down)."""
    alias = router.db_for_write(AgentRun)
    wrapper = connections[alias]  # a wrapper, not a connection: nothing is opened here
    if wrapper.vendor != "sqlite":
        return []
    return sqlite_journal_messages(alias, wrapper.settings_dict)


def sqlite_journal_messages(alias: str, database: Mapping[str, Any]) -> list[CheckMessage]:
    """W002 when a SQLite database for durable runs keeps the rollback journal (its
    ``init_command`` sets no ``journal_mode=WAL``); W003 when it lowers ``synchronous`` below
    FULL, so a commit (such as a call's ``executing`` mark) can be lost on power loss."""
    name = str(database.get("NAME") or "")
    if name == ":memory:" or "mode=memory" in name:
        return []  # nothing survives the process anyway: there is no journal to choose
    options = database.get("OPTIONS") or {}
    pragmas: dict[str, str] = {}
    # Django runs each ";"-separated statement of init_command on every new connection.
    for statement in str(options.get("init_command") or "").split(";"):
        found = _PRAGMA.match(statement)
        if found:
            pragmas[found.group(1).lower()] = found.group(2).upper()
    where = f'DATABASES["{alias}"]["OPTIONS"]["init_command"]'
    fix = f'Set {where} = "{SQLITE_INIT_COMMAND}" (docs/deployment.md, SQLite).'
    if pragmas.get("journal_mode") != "WAL":
        return [Warning(
            f'The SQLite database "{alias}" that holds nexo_django\'s runs uses the rollback journal: '
            "each commit syncs the file and its journal, and readers wait for writers.",
            hint=fix, id="nexo_django.W002",
        )]
    weak = _WEAK_SYNC.get(pragmas.get("synchronous", ""))
    if weak:
        return [Warning(
            f'The SQLite database "{alias}" that holds nexo_django\'s runs sets synchronous={weak}: '
            "the last commits, such as a call's `executing` mark, can be lost on power loss, and the "
            "call would then run again.",
            hint=fix, id="nexo_django.W003",
        )]
    return []


@register(Tags.database)
def check_workers(
    app_configs: Sequence[AppConfig] | None = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Runs queued on a queue no worker listens on. A database check: Django runs it for
    ``manage.py check --database default`` and ``migrate``, never for a plain ``check`` or
    ``runserver`` (no query, no Redis). Redis down is a warning too, never an error."""
    if not databases or "default" not in databases:
        return []
    try:
        warning = queue_warning()
    except DatabaseError:
        return []  # not migrated yet: nothing can be queued
    if warning is None:
        return []
    if warning.unreachable:
        return [Warning(str(warning), hint="Check the URL of the queue in RQ_QUEUES and that Redis runs.",
                        id="nexo_django.W005")]
    return [Warning(str(warning), hint=f"Run `python manage.py rqworker {warning.queue}` on a worker machine.",
                    id="nexo_django.W004")]


CHANNEL_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,19}")


@register(Tags.compatibility)
def check_channels(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """``NEXO["CHANNELS"]`` (docs/channels.md): names, backends, and each backend's options."""
    from .channels.base import RESERVED_SOURCES, Channel
    from .durable.outbox import COMMON, KINDS, backend_path

    try:
        given = nexo_settings.CHANNELS
    except ConfigurationError:
        return []  # check_settings reports it
    fix = 'See docs/channels.md: NEXO["CHANNELS"] = {"ops": {"BACKEND": "slack", ...}}.'
    if not isinstance(given, dict):
        return [Error(f'NEXO["CHANNELS"] must be a dict of channels by name, not {given!r}.', hint=fix,
                      id="nexo_django.E030")]
    errors: list[CheckMessage] = []
    for name, options in given.items():
        where = f'NEXO["CHANNELS"][{name!r}]'
        if not isinstance(name, str) or not CHANNEL_NAME.fullmatch(name) or name in RESERVED_SOURCES:
            errors.append(Error(f"{where}: a channel's name is its decisions' source and its URL: 1 to 20 lowercase "
                                f"letters, digits, - or _, and none of {', '.join(sorted(RESERVED_SOURCES))}.",
                                hint=fix, id="nexo_django.E030"))
            continue
        if not isinstance(options, dict):
            errors.append(Error(f"{where} must be a dict of options, not {options!r}.", hint=fix, id="nexo_django.E030"))
            continue
        try:
            cls = import_string(backend_path(options))
        except (ConfigurationError, ImportError) as exc:
            errors.append(Error(f"{where}: {exc}", hint='"BACKEND": "slack", "webhook", or the dotted path of a '
                                "nexo_django.channels.base.Channel subclass.", id="nexo_django.E031"))
            continue
        if not (isinstance(cls, type) and issubclass(cls, Channel)):
            errors.append(Error(f"{where}: BACKEND {options['BACKEND']!r} is not a Channel subclass.",
                                hint="Subclass nexo_django.channels.base.Channel.", id="nexo_django.E031"))
            continue
        merged = {**COMMON, **cls.defaults, **options}
        problems = list(cls.check(name, merged))
        unknown = sorted(set(merged) - set(COMMON) - set(cls.defaults))
        if unknown:
            problems.append(f"unknown option(s) {', '.join(map(str, unknown))}")
        events = merged["EVENTS"]
        if not isinstance(events, (list, tuple)) or not set(events) <= set(KINDS):
            problems.append(f"EVENTS must be a list of: {', '.join(KINDS)}")
        for key in ("MAX_ATTEMPTS", "BACKOFF"):
            value = merged[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                problems.append(f"{key} must be a positive number")
        after = merged["REMIND_AFTER"]
        if after is not None and (isinstance(after, bool) or not isinstance(after, (int, float)) or after <= 0):
            problems.append("REMIND_AFTER must be a positive number of seconds, or None")
        private = merged.get("ALLOW_PRIVATE", [])
        if not isinstance(private, (list, tuple)) or not all(isinstance(h, str) for h in private):
            problems.append("ALLOW_PRIVATE must be a list of host names")
        if problems:
            errors.append(Error(f"{where} is invalid: {'; '.join(problems)}.", hint=fix, id="nexo_django.E032"))
    return errors
