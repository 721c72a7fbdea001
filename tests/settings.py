"""Minimal settings for the test suite: SQLite (or DATABASE_URL) and an inline queue.

Environment (see docs/testing.md):
- DATABASE_URL: postgres://user:password@host:port/name (or sqlite:///path) instead of SQLite.
- NEXO_TEST_SQLITE: the file pytest-django creates the SQLite test database in (default: a
  per-process file in the temp dir, so rq worker subprocesses can open it; ":memory:" for none).
- REDIS_URL: the "default" queue uses that Redis; unset, it runs jobs inline with no Redis.
- Set by the rq_worker fixture for its subprocesses: NEXO_TEST_DB_NAME (the test database
  itself), NEXO_TEST_RQ_QUEUES and NEXO_TEST_NEXO_SETTINGS (JSON of the test's settings).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from tests.dburl import parse_database_url

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = os.environ.get("NEXO_TEST_ROOT_URLCONF") or "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_rq",
    "nexo_django",
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

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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


# Worker subprocesses and the test process share one SQLite file: WAL lets readers and a
# writer overlap, IMMEDIATE takes the write lock when a transaction begins (a deferred one
# that reads and then writes can fail with "database is locked" without waiting), and the
# timeout makes a busy writer wait instead of failing. synchronous=FULL, as docs/deployment.md
# recommends (and nexo_django.W003 asks for): the tests run what a deployment runs.
SQLITE_OPTIONS: dict[str, Any] = {
    "timeout": 20,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL",
}


def _database() -> dict[str, Any]:
    url = os.environ.get("DATABASE_URL")
    if url:
        database = parse_database_url(url)
    else:
        test_file = os.environ.get("NEXO_TEST_SQLITE") or os.path.join(
            tempfile.gettempdir(), f"nexo-tests-{os.getpid()}.sqlite3"
        )
        database = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:", "TEST": {"NAME": test_file}}
    if database["ENGINE"].endswith("sqlite3"):
        database["OPTIONS"] = {**SQLITE_OPTIONS, **database.get("OPTIONS", {})}
    pool = os.environ.get("NEXO_TEST_DB_POOL")
    if pool and database["ENGINE"].endswith("postgresql"):
        # A worker of the connection-bound test: Django's PostgreSQL pool, named in
        # pg_stat_activity so the test counts this process's connections alone.
        database["OPTIONS"] = {**database.get("OPTIONS", {}), "pool": json.loads(pool),
                               "application_name": "nexo-test-pool"}
    worker_database = os.environ.get("NEXO_TEST_DB_NAME")
    if worker_database:
        # An rq worker started by the tests: use the test database pytest-django created.
        database["NAME"] = worker_database
    return database


DATABASES = {"default": _database()}

STATIC_URL = "/static/"

# Django 6.1 sends mail through MAILERS (the test environment swaps each for locmem); 6.0 ignores it.
MAILERS: dict[str, dict[str, Any]] = {"default": {}}

REDIS_URL = os.environ.get("REDIS_URL")

# DESIGN.md §6: an "ASYNC": False queue runs jobs inline at commit and needs no Redis at all.
RQ_QUEUES: dict[str, dict[str, Any]] = {
    "default": {"URL": REDIS_URL} if REDIS_URL else {"ASYNC": False},
}

NEXO: dict[str, object] = {}

# An rq worker started by the rq_worker fixture runs with the settings of the test that
# started it (queues, NEXO overrides such as a short lease).
if os.environ.get("NEXO_TEST_RQ_QUEUES"):
    RQ_QUEUES = json.loads(os.environ["NEXO_TEST_RQ_QUEUES"])
if os.environ.get("NEXO_TEST_NEXO_SETTINGS"):
    NEXO = json.loads(os.environ["NEXO_TEST_NEXO_SETTINGS"])

# A server process serving the example project (conftest's example_asgi_server): its app and
# URLs on these settings, as the in-process `example` fixture sets them.
if os.environ.get("NEXO_TEST_EXAMPLE_WORKSPACE"):
    INSTALLED_APPS = [*INSTALLED_APPS, "example_project.notes"]
    ROOT_URLCONF = "example_project.urls"
    LOGIN_URL = "login"
    NOTES_WORKSPACE = os.environ["NEXO_TEST_EXAMPLE_WORKSPACE"]
    NOTES_MODEL = None

