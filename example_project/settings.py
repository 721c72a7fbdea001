"""Settings of the example project.

By default: SQLite (example_project/db.sqlite3) and an inline queue, so nothing else runs.
- DATABASE_URL=postgres://user:password@host:5432/name uses PostgreSQL instead.
- REDIS_URL=redis://127.0.0.1:6379/0 sends jobs to Redis; start workers with
  ``example_project/manage.py rqworker`` (``make serve`` starts one).
- NEXO_MODEL=openai:gpt-4.1-mini (with OPENAI_API_KEY, or anthropic:... with ANTHROPIC_API_KEY)
  makes the pages start runs on a real model; without it they play the scripted story.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Step 1: the two apps ...
    "django_rq",
    "nexo_django",
    "example_project.notes",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # templates/nexo_django/base.html overrides the library's page frame.
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# With Redis, a worker process and this one share the SQLite file: WAL lets them overlap, and
# IMMEDIATE plus a timeout makes a writer wait for the other instead of failing.
SQLITE: dict[str, Any] = {
    "timeout": 20,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL",
}


def database(url: str | None) -> dict[str, Any]:
    """A ``DATABASES`` entry from DATABASE_URL (postgres://... or sqlite:///path), else SQLite."""
    if not url:
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3", "OPTIONS": SQLITE}
    parts = urlsplit(url)
    if parts.scheme in ("postgres", "postgresql"):
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parts.path.lstrip("/")),
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "OPTIONS": dict(parse_qsl(parts.query)),
        }
    if parts.scheme == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": unquote(parts.path[1:]), "OPTIONS": SQLITE}
    raise ValueError(f"DATABASE_URL: use postgres://user:password@host:port/name or sqlite:///path, not {url!r}")


DATABASES = {"default": database(os.environ.get("DATABASE_URL"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# ... the queue: "ASYNC": False runs jobs inline at commit with no Redis at all ...
REDIS_URL = os.environ.get("REDIS_URL")
RQ_QUEUES: dict[str, dict[str, Any]] = {
    "default": {"URL": REDIS_URL} if REDIS_URL else {"ASYNC": False},
}

# ... and NEXO (every key: docs/settings.md).
NEXO: dict[str, Any] = {"QUEUE": "default"}
# The example's agents declare their own (scripted) model, so no default model is needed.
SILENCED_SYSTEM_CHECKS = ["nexo_django.W001"]

# The example's own settings: where the agents work, and the model the pages start runs on
# (None: the agents' scripted story).
NOTES_WORKSPACE = Path(os.environ.get("NOTES_WORKSPACE") or BASE_DIR / "demo_workspace")
NOTES_MODEL = os.environ.get("NEXO_MODEL") or None

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "notes:home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
