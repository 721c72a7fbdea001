"""The test project as an ASGI application, for a real ASGI server (uvicorn) in tests: the test
settings, with ``NEXO_TEST_ROOT_URLCONF`` naming the URLs (the ``asgi_server`` fixture sets it)."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from django.core.asgi import get_asgi_application  # noqa: E402 - after the settings module is named

application = get_asgi_application()
