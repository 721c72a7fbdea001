"""Django settings for the benchmarks.

BENCH_DB_URL: ``sqlite:////abs/path.sqlite3`` (Django's default SQLite options: rollback
journal, full sync; ``?init_command=...`` sets PRAGMAs) or ``postgres://user@127.0.0.1:PORT/NAME`` (a server bench/run.py started).
Unset: a SQLite file in a fresh temporary directory.
BENCH_REDIS_URL: the "default" queue uses that Redis (real workers); unset, it runs jobs inline
at commit with no Redis (DESIGN.md §6).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from tests.dburl import parse_database_url

SECRET_KEY = "bench-only-not-secret"
DEBUG = False  # production-like: cached templates, no query log unless a benchmark captures it
USE_TZ = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
ROOT_URLCONF = "bench.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # users are made, not logged in by password

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

STATIC_URL = "/static/"


DATABASES = {
    "default": parse_database_url(
        os.environ.get("BENCH_DB_URL")
        or "sqlite:///" + os.path.join(tempfile.mkdtemp(prefix="nexo-bench-"), "bench.sqlite3")
    )
}

# BENCH_DB_POOL: JSON options of Django's PostgreSQL connection pool (bench/concurrency.py), and
# the processes' connections named in pg_stat_activity so the benchmark can count them.
if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    if os.environ.get("BENCH_DB_POOL"):
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = json.loads(os.environ["BENCH_DB_POOL"])
    if os.environ.get("BENCH_DB_APP"):
        DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = os.environ["BENCH_DB_APP"]

_REDIS_URL = os.environ.get("BENCH_REDIS_URL")
RQ_QUEUES: dict[str, dict[str, Any]] = {"default": {"URL": _REDIS_URL} if _REDIS_URL else {"ASYNC": False}}

# BENCH_NEXO: JSON overrides (bench/chaos.py: a short lease), for the bench process and its workers.
NEXO: dict[str, Any] = json.loads(os.environ.get("BENCH_NEXO") or "{}")
# The benchmarks measure Django's SQLite defaults and WAL without FULL on purpose.
SILENCED_SYSTEM_CHECKS = ["nexo_django.W002", "nexo_django.W003"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "root": {"level": "WARNING"},
}
