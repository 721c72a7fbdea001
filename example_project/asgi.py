"""The example project as an ASGI application: ``python -m uvicorn example_project.asgi:application``.
Under ASGI the run pages and the chat page follow runs through Server-Sent Events."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

from django.core.asgi import get_asgi_application  # noqa: E402 - after the settings module is named

application = get_asgi_application()
