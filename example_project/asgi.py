"""The example project as an ASGI application: ``python -m uvicorn example_project.asgi:application``.
Under ASGI the run pages and the chat page follow runs through Server-Sent Events.

uvicorn serves no files, and Django serves static files only from ``runserver`` (with ``DEBUG``
on): the admin would have no CSS. So the example's application serves its static files itself
(Django's ``ASGIStaticFilesHandler``: from the apps' ``static/`` folders, ``DEBUG`` on or off).
A production site collects them (``manage.py collectstatic``) and serves ``STATIC_ROOT`` from its
proxy or with WhiteNoise: docs/deployment.md, "Static files".
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402 - after the settings module is named

application = ASGIStaticFilesHandler(get_asgi_application())
