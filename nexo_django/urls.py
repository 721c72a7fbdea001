"""Optional pages for runs: ``path("runs/", include("nexo_django.urls"))``.

Names (namespace ``nexo_django``): ``run_list``, ``run_detail``, ``run_status`` (JSON).
"""

from __future__ import annotations

from django.urls import path

from . import views

app_name = "nexo_django"

urlpatterns = [
    path("", views.RunListView.as_view(), name="run_list"),
    path("<uuid:pk>/", views.RunDetailView.as_view(), name="run_detail"),
    path("<uuid:pk>/status/", views.RunStatusView.as_view(), name="run_status"),
]
