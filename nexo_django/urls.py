"""Optional pages for runs: ``path("runs/", include("nexo_django.urls"))``.

Names (namespace ``nexo_django``): ``run_list``, ``run_detail``, ``run_status``, ``run_events``,
``run_stream`` (Server-Sent Events, under ASGI), ``call_decide`` and ``question_answer`` (JSON, session
auth; deciding and answering are POSTs with the CSRF token).
"""

from __future__ import annotations

from django.urls import path

from . import views

app_name = "nexo_django"

urlpatterns = [
    path("", views.RunListView.as_view(), name="run_list"),
    path("<uuid:pk>/", views.RunDetailView.as_view(), name="run_detail"),
    path("<uuid:pk>/status/", views.RunStatusView.as_view(), name="run_status"),
    path("<uuid:pk>/events/", views.RunEventsView.as_view(), name="run_events"),
    path("<uuid:pk>/stream/", views.RunStreamView.as_view(), name="run_stream"),
    path("<uuid:pk>/calls/<int:call_pk>/decide/", views.CallDecisionView.as_view(), name="call_decide"),
    path("<uuid:pk>/questions/<str:key>/answer/", views.QuestionAnswerView.as_view(), name="question_answer"),
]
