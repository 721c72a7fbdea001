from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("", include("example_project.notes.urls")),
    # The run pages and their JSON status, from nexo_django (optional).
    path("runs/", include("nexo_django.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    # Step 3: people decide pending calls in the admin.
    path("admin/", admin.site.urls),
]
