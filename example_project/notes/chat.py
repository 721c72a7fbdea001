"""The chat page: a conversation with the Helper agent. Ask; the answer grows as the model
writes it (under ASGI, from the run's event stream); a call that waits for a person shows
inline with a link to its decision page; once it is approved the run goes on; then ask a
follow-up (``run.follow_up``), which continues the same conversation in a new run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from example_project.notes.agents import CHAT_PROMPT, Helper
from nexo_django.errors import FollowUpRefused
from nexo_django.models import AgentRun, RunEvent, RunStatus
from nexo_django.views import (
    RELOAD_ON,
    inbox_url,
    may_follow_up,
    public_error,
    run_status,
    streams,
    visible_runs,
)


class AskForm(forms.Form):
    prompt = forms.CharField(widget=forms.Textarea(attrs={"rows": 2, "cols": 70}), max_length=4000)


@login_required
def new_chat(request: HttpRequest) -> HttpResponse:
    form = AskForm(request.POST or None, initial={"prompt": CHAT_PROMPT})
    if request.method == "POST" and form.is_valid():
        workspace = Path(settings.NOTES_WORKSPACE)
        workspace.mkdir(parents=True, exist_ok=True)
        run = Helper.run_later(form.cleaned_data["prompt"], user=request.user, cwd=workspace, model=settings.NOTES_MODEL)
        return redirect("notes:chat", pk=run.pk)
    return render(request, "notes/chat.html", {"form": form, "turns": [], "run": None})


@login_required
def chat(request: HttpRequest, pk: Any) -> HttpResponse:
    """The conversation ``pk`` belongs to, as its runs' questions and answers; the person who
    started it asks the follow-ups."""
    run = get_object_or_404(visible_runs(request.user), pk=pk)
    form = AskForm(request.POST or None)
    if request.method == "POST":
        if not may_follow_up(run, request.user):
            raise PermissionDenied("Only the person who started this conversation asks its follow-ups, once it answered.")
        if form.is_valid():
            try:
                new = run.follow_up(form.cleaned_data["prompt"], user=request.user)
            except FollowUpRefused as exc:
                form.add_error("prompt", str(exc))
            else:
                return redirect("notes:chat", pk=new.pk)
    conversation = run.conversation()
    visible = set(visible_runs(request.user).filter(pk__in=[r.pk for r in conversation]).values_list("pk", flat=True))
    turns = [_turn(r) for r in conversation if r.pk in visible]
    last = conversation[-1]
    live = None
    if not last.is_terminal:
        after = RunEvent.objects.filter(run=last).order_by("-id").values_list("id", flat=True).first() or 0
        live = {
            "stream": reverse("nexo_django:run_stream", args=[last.pk]) if streams(request) else None,
            "status": reverse("nexo_django:run_status", args=[last.pk]),
            "after": after, "reload_on": sorted(RELOAD_ON), "version": run_status(last)["version"],
        }
    return render(request, "notes/chat.html", {
        "form": form if may_follow_up(last, request.user) else None, "turns": turns, "run": last, "live": live,
        "latest_url": reverse("notes:chat", args=[last.pk]) if last.pk != run.pk else None,
    })


def _turn(run: AgentRun) -> dict[str, Any]:
    """One question and what became of it: the answer, a call waiting for a person, or why not."""
    pending = [
        {"name": c.name, "path": (c.args or {}).get("path", ""), "url": inbox_url(c)} for c in run.pending_calls()
    ] if run.status == RunStatus.SUSPENDED else []
    return {
        "run": run, "prompt": run.prompt, "answer": run.result, "pending": pending,
        "working": run.status in (RunStatus.QUEUED, RunStatus.RUNNING),
        "problem": public_error(run) if run.status in (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.NEEDS_ATTENTION) else "",
    }
