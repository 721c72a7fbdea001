"""``DATABASE_URL``-style strings to Django ``DATABASES`` entries, for the test and bench settings.

(The example project keeps its own copy on purpose: it is meant to be read on its own.)
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit


def parse_database_url(url: str) -> dict[str, Any]:
    """A ``DATABASES`` entry from ``postgres://user:password@host:port/name?option=value``
    (``postgresql://`` too) or ``sqlite:///relative/path`` / ``sqlite:////absolute/path``
    (``?init_command=...`` and other query parameters become ``OPTIONS``)."""
    parts = urlsplit(url)
    options: dict[str, Any] = dict(parse_qsl(parts.query))
    if parts.scheme in ("postgres", "postgresql"):
        options = {name: _typed(name, value) for name, value in options.items()}
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ValueError(f"database URL {url!r} names no database: add /NAME after host:port")
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "OPTIONS": options,
        }
    if parts.scheme == "sqlite":
        database: dict[str, Any] = {"ENGINE": "django.db.backends.sqlite3", "NAME": unquote(parts.path[1:]) or ":memory:"}
        if options:
            database["OPTIONS"] = options
        return database
    raise ValueError(
        f"database URL scheme {parts.scheme!r} is not supported; use "
        "postgres://user:password@host:port/name or sqlite:///path"
    )


#: PostgreSQL OPTIONS that Django reads as a bool or an int, not as a string
_BOOL_OPTIONS = ("server_side_binding",)
_INT_OPTIONS = ("prepare_threshold",)


def _typed(name: str, value: str) -> Any:
    if name in _BOOL_OPTIONS:
        if value.lower() not in ("true", "false"):
            raise ValueError(f"database URL option {name}={value!r}: use true or false")
        return value.lower() == "true"
    if name in _INT_OPTIONS:
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"database URL option {name}={value!r}: use a whole number") from None
    return value
