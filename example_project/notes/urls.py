from __future__ import annotations

from django.urls import path

from example_project.notes import views

app_name = "notes"

urlpatterns = [
    path("", views.home, name="home"),
]
