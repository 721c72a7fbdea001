"""Step 2, continued: start a run from a view. The run's own page comes from nexo_django.urls."""

from __future__ import annotations

from pathlib import Path

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from example_project.notes.agents import AGENTS, SCRIBE_PROMPT
from example_project.notes.workflows import PublishNotes
from nexo_django.views import visible_runs


class PromptForm(forms.Form):
    agent = forms.ChoiceField(
        choices=[("scribe", "Scribe: writes; publishing waits for a person"), ("reviewer", "Reviewer: read-only")]
    )
    prompt = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 80}), initial=SCRIBE_PROMPT,
                             max_length=4000)


@login_required
def home(request: HttpRequest) -> HttpResponse:
    form = PromptForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        agent = AGENTS[form.cleaned_data["agent"]]
        workspace = Path(settings.NOTES_WORKSPACE)
        workspace.mkdir(parents=True, exist_ok=True)
        # Enqueued when this request's transaction commits; a worker (or, with the inline
        # queue, this process) runs it. model=None plays the agent's scripted story.
        run = agent.run_later(
            form.cleaned_data["prompt"], user=request.user, cwd=workspace, model=settings.NOTES_MODEL
        )
        return redirect("nexo_django:run_detail", pk=run.pk)
    runs = visible_runs(request.user).order_by("-created_at")[:10]
    return render(request, "notes/home.html", {"form": form, "runs": runs, "model": settings.NOTES_MODEL})


@login_required
@require_POST
def start_workflow(request: HttpRequest) -> HttpResponse:
    """Step 2b: start the PublishNotes workflow (docs/workflows.md); its page is the run page."""
    workspace = Path(settings.NOTES_WORKSPACE)
    workspace.mkdir(parents=True, exist_ok=True)
    version = (request.POST.get("version") or "1.0").strip()[:20] or "1.0"
    run = PublishNotes.run_later({"version": version, "model": settings.NOTES_MODEL}, user=request.user, cwd=workspace)
    return redirect("nexo_django:run_detail", pk=run.pk)
