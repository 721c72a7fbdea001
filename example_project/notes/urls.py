from __future__ import annotations

from django.urls import path

from example_project.notes import chat, views

app_name = "notes"

urlpatterns = [
    path("", views.home, name="home"),
    # A workflow: facts, the Scribe's notes, a person's choice, the announcement.
    path("workflow/", views.start_workflow, name="start_workflow"),
    # The chat page: ask, see the answer grow, approve inline, ask a follow-up.
    path("chat/", chat.new_chat, name="new_chat"),
    path("chat/<uuid:pk>/", chat.chat, name="chat"),
]
