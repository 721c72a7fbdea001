from __future__ import annotations

from django.apps import AppConfig


class NotesConfig(AppConfig):
    name = "example_project.notes"
    label = "notes"
    verbose_name = "Notes"
