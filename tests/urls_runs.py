"""The admin and the run pages (``nexo_django.urls`` under ``runs/``): for tests that serve them
from another process (``asgi_server``)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("runs/", include("nexo_django.urls")),
]
