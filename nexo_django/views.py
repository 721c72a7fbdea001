"""Optional pages for durable runs: a list, a run's page that refreshes itself, a JSON status.

Mount them with ``path("runs/", include("nexo_django.urls"))``. Every view shows only the runs
:func:`visible_runs` lets the user see (others answer 404); override ``get_queryset`` on a
subclass to narrow that further. The templates (``nexo_django/run_list.html``,
``nexo_django/run_detail.html``, both extending ``nexo_django/base.html``) are overridable from a
project's own templates folder.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import PermissionDenied
from django.core.handlers.asgi import ASGIRequest
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseForbidden,
    HttpResponseRedirect,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404
from django.urls import NoReverseMatch, reverse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.generic import DetailView, ListView

from . import run_pages
from .bounded import (
    BLOCK_BYTES,
    MESSAGE_BYTES,
    bounded_json,
    bounded_text,
    long_strings,
    message_view,
)
from .core.errors import (
    AlreadyDecided,
    ApprovalExpired,
    ApprovalRefused,
    FollowUpRefused,
    InvalidAnswer,
    InvalidEditedArguments,
    StaleDecision,
    WorkflowError,
)
from .display import is_hidden
from .durable import live, outcomes, refusals, runs, schedules, workflow_questions, workflow_runs
from .durable.queue_health import queue_warning
from .jsonbody import BadJSON, request_json
from .models import (
    ACTIVE_RUN_STATUSES,
    AgentRun,
    CallStatus,
    RunEvent,
    RunKind,
    RunMessage,
    RunStatus,
    ToolCall,
)

#: Runs of a conversation a run's page lists at most (the ones nearest the run shown).
CONVERSATION_LIMIT = 50

#: Permissions that let a user see every run, not only the runs they started.
SEE_ALL_PERMISSIONS = ("nexo_django.view_agentrun", "nexo_django.decide_toolcall")

#: Admin pages a pending call links to, first that exists wins: the approval inbox, then the
#: plain ToolCall admin.
INBOX_URL_NAMES = ("admin:nexo_django_pendingapproval_change", "admin:nexo_django_toolcall_change")


def visible_runs(user: Any) -> QuerySet[AgentRun]:
    """The runs ``user`` may see: their own, or all of them with a permission in
    :data:`SEE_ALL_PERMISSIONS`. Anonymous users see none."""
    if user is None or not user.is_authenticated or not user.is_active:
        return AgentRun.objects.none()
    if any(user.has_perm(p) for p in SEE_ALL_PERMISSIONS):
        return AgentRun.objects.all()
    return AgentRun.objects.filter(created_by=user)


def inbox_url(call: ToolCall) -> str | None:
    """Where a person decides ``call`` in the admin, or None when no admin page is mounted."""
    for name in INBOX_URL_NAMES:
        try:
            return reverse(name, args=[call.pk])
        except NoReverseMatch:
            continue
    return None


#: Admin page where a person settles a run that needs attention.
RUN_ADMIN_URL_NAME = "admin:nexo_django_agentrun_change"

#: What a person who started a run reads about it when it did not go well: the run's state in
#: plain words. The error itself (a URL, a Redis address, a traceback's last line) and the
#: commands that fix things are the operator's: staff see them (see :func:`shows_operator_details`).
PLAIN_ERRORS: dict[str, str] = {
    RunStatus.FAILED: "This run stopped because of an error. The people who run this service can see what went wrong.",
    RunStatus.NEEDS_ATTENTION: "This run waits for a person to look at it before it can go on.",
}


def shows_operator_details(user: Any) -> bool:
    """Whether ``user`` sees the operator's detail (errors, queue warnings, the fix): staff."""
    return bool(user is not None and getattr(user, "is_staff", False) and user.is_active)


def run_admin_url(run: AgentRun) -> str | None:
    try:
        return reverse(RUN_ADMIN_URL_NAME, args=[run.pk])
    except NoReverseMatch:
        return None


def public_error(run: AgentRun) -> str:
    """The run's error as its starter reads it: the reason of a cancel, or plain words."""
    if not run.error:
        return ""
    return PLAIN_ERRORS.get(run.status, run.error if run.status == RunStatus.CANCELLED else "")


def visible(text: str) -> str:
    """Plain text (a terminal, a log) with invisible and bidi characters written as ⟦U+XXXX⟧;
    HTML pages use :func:`nexo_django.display.reveal`, which also escapes."""
    return "".join(f"⟦U+{ord(c):04X}⟧" if is_hidden(c, keep="\n\t") else c for c in text)


def transcript_entries(messages: list[dict[str, Any]], *, budget: int = MESSAGE_BYTES) -> list[dict[str, Any]]:
    """The transcript as safe pieces for a template (escaped, hidden characters shown), each
    message at most ``budget`` bytes of HTML."""
    entries = []
    for message in messages:
        entry = message_view(message, budget=budget)
        content = message.get("content")
        entry["is_error"] = message.get("role") == "tool" and isinstance(content, dict) and "error" in content
        entries.append(entry)
    return entries


#: Stored JSON of a pending call's arguments the status endpoint serves (a bigger one: None).
JSON_ARGS_MAX = 256_000


def run_status(run: AgentRun, *, operator: bool = True, pending_after: int | None = None) -> dict[str, Any]:
    """What the JSON status endpoint answers; ``version`` changes whenever the page would. With
    ``operator`` false, the error is in plain words (:func:`public_error`). Bounded whatever the
    number of calls: the calls by status, and the first ``run_pages.PENDING_SHOWN`` pending ones
    (after call ``pending_after``; ``pending_next`` is the URL of the next ones)."""
    pending, pending_total = run_pages.pending_window(run, after=pending_after)
    versions = runs.file_versions_now(run, pending)
    messages = run.messages.count()
    more = pending_total > len(pending) and bool(pending) and (
        ToolCall.objects.filter(run=run, status=CallStatus.PENDING_APPROVAL, id__gt=pending[-1].pk).exists()
    )
    return {
        "id": str(run.pk),
        "agent": run.agent_name,
        "status": run.status,
        "status_label": run.get_status_display(),
        "active": run.status in ACTIVE_RUN_STATUSES,
        "terminal": run.is_terminal,
        "result": run.result,
        "error": run.error if operator else public_error(run),
        "messages": messages,
        "pending": [
            {"id": c.pk, "tool_call_id": c.tool_call_id, "name": c.name, "capability": c.capability,
             "digest": c.digest, "inbox_url": inbox_url(c),
             # What is decided: the arguments (up to JSON_ARGS_MAX of stored JSON; past it, None and
             # their size), and for a write the version of the file it would replace, to bind an
             # approval to.
             "args": c.args if (c.args_size or 0) <= JSON_ARGS_MAX else None, "args_size": c.args_size,
             "file_version": versions[c.pk],
             # From its deadline on a call is expired, whether or not the reconciler has run.
             "expires_at": c.expires_at.isoformat() if c.expires_at else None,
             "expired": outcomes.is_expired(c)}
            for c in pending
        ],
        "pending_total": pending_total,
        "pending_next": (
            reverse("nexo_django:run_status", args=[run.pk]) + f"?pending_after={pending[-1].pk}" if more else None
        ),
        "calls": run_pages.call_counts(run),
        "updated_at": run.updated_at.isoformat(),
        # A call passing its deadline changes the page too (it reads expired, reconciled or not).
        "version": f"{run.status}:{messages}:{pending_total}:{sum(outcomes.is_expired(c) for c in pending)}:"
                   f"{run.updated_at.isoformat()}",
        # A workflow run: its steps, open questions and its agents' waiting calls.
        **(workflow_runs.status_of(run) if run.kind == RunKind.WORKFLOW else {}),
    }


def conversation_entries(
    run: AgentRun, visible: QuerySet[AgentRun], url: Any, *, limit: int = CONVERSATION_LIMIT,
) -> list[dict[str, Any]]:
    """The runs of ``run``'s conversation for a page, first to last: each one's prompt and result
    (bounded, escaped) and ``url(run)``, or only that it exists for a run ``visible`` does not
    hold (another person's). At most ``limit`` runs, those nearest ``run``. Empty when the run
    is a conversation of its own."""
    if run.previous_id is None and not AgentRun.objects.filter(previous_id=run.pk).exists():
        return []
    runs_ = run.conversation()
    here = next((i for i, r in enumerate(runs_) if r.pk == run.pk), 0)
    start = max(0, min(here - limit // 2, len(runs_) - limit))
    shown = runs_[start : start + limit]
    allowed = set(visible.filter(pk__in=[r.pk for r in shown]).values_list("pk", flat=True))
    entries = []
    for index, r in enumerate(shown, start=start + 1):
        entry: dict[str, Any] = {"index": index, "pk": r.pk, "current": r.pk == run.pk, "visible": r.pk in allowed}
        if entry["visible"]:
            entry.update(
                status=r.status, status_label=r.get_status_display(), url=url(r),
                prompt=bounded_text(r.prompt, budget=2_000).html,
                result=bounded_text(r.result, budget=2_000).html if r.result is not None else None,
            )
        entries.append(entry)
    return entries


def neighbours(run: AgentRun, visible: QuerySet[AgentRun]) -> dict[str, AgentRun | None]:
    """The run before and the run after ``run`` in its conversation, each only if ``visible``
    holds it."""
    after = visible.filter(previous_id=run.pk).first()
    before = visible.filter(pk=run.previous_id).first() if run.previous_id is not None else None
    return {"previous": before, "next": after}


def may_follow_up(run: AgentRun, user: Any) -> bool:
    """The person who started the conversation's run may ask a follow-up once it is done or
    cancelled, on the last run of the conversation only."""
    return (
        run.status in (RunStatus.DONE, RunStatus.CANCELLED) and run.created_by_id is not None
        and run.created_by_id == getattr(user, "pk", None)
        and not AgentRun.objects.filter(previous_id=run.pk).exists()
    )


def transcript_window(run: AgentRun, request: HttpRequest) -> dict[str, Any]:
    """The run's transcript for its page: the last :data:`run_pages.MESSAGES_SHOWN` messages, or
    those from ``?transcript_from=<seq>``, with links to the messages before and after."""
    found = run_pages.window(
        RunMessage.objects.filter(run=run).only("seq", "data"), "seq",
        limit=run_pages.MESSAGES_SHOWN, start=run_pages.int_param(request, "transcript_from"), tail=True,
    )
    budget = run_pages.budget_each(run_pages.WINDOW_BYTES, len(found.rows), ceiling=MESSAGE_BYTES)
    return {"transcript": transcript_entries([m.data for m in found.rows], budget=budget), "transcript_window": found}


def pending_entries(run: AgentRun, url: Any) -> dict[str, Any]:
    """The first :data:`run_pages.CALLS_SHOWN` calls waiting for a person, their arguments sharing
    :data:`run_pages.PENDING_BYTES`, and how many wait in all."""
    pending, total = run_pages.pending_window(run, limit=run_pages.CALLS_SHOWN)
    budget = run_pages.budget_each(run_pages.PENDING_BYTES, len(pending), ceiling=BLOCK_BYTES)
    return {
        "pending": [
            {"call": c, "args": bounded_json(c.args, budget=budget).html, "expired": outcomes.is_expired(c),
             "texts": [(key, text.html) for key, text in long_strings(c.args)] if index < run_pages.TEXT_CALLS else [],
             "inbox_url": url(c)} for index, c in enumerate(pending)
        ],
        "pending_total": total,
        "pending_hidden": total - len(pending),
    }


class VisibleRunsMixin:
    request: HttpRequest

    def get_queryset(self) -> QuerySet[AgentRun]:
        return visible_runs(self.request.user)


class RunListView(LoginRequiredMixin, VisibleRunsMixin, ListView):
    template_name = "nexo_django/run_list.html"
    context_object_name = "runs"
    paginate_by = 25

    def get_queryset(self) -> QuerySet[AgentRun]:
        return super().get_queryset().select_related("created_by").order_by("-created_at")


@method_decorator(never_cache, name="dispatch")
class RunDetailView(LoginRequiredMixin, VisibleRunsMixin, DetailView):
    """The run's status, transcript and pending calls (each linked to the admin inbox)."""

    template_name = "nexo_django/run_detail.html"
    context_object_name = "run"

    def get_inbox_url(self, call: ToolCall) -> str | None:
        return inbox_url(call)

    def get_queue_warning(self, run: AgentRun) -> str | None:
        """Why a queued run may wait forever (no worker on its queue), or None."""
        warning = queue_warning(run=run) if run.status == RunStatus.QUEUED else None
        return str(warning) if warning is not None else None

    def get_shows_operator_details(self) -> bool:
        """Staff see the operator's detail (the error, the queue warning and its fix); the
        person who started the run sees its state in plain words."""
        return shows_operator_details(self.request.user)

    def may_cancel(self, run: AgentRun) -> bool:
        """The person who started the run may cancel it while it can still change (staff cancel
        in the admin)."""
        user = self.request.user
        return not run.is_terminal and run.created_by_id is not None and run.created_by_id == user.pk

    def may_follow_up(self, run: AgentRun) -> bool:
        """Whether the user may ask a follow-up here (:func:`may_follow_up`: their own run)."""
        return may_follow_up(run, self.request.user)

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        """Cancel the user's own run, or ask a follow-up on it (CSRF-protected POSTs, like every
        form of the site)."""
        run: AgentRun = self.get_object()
        if request.POST.get("action") == "follow_up":
            return self.follow_up(request, run)
        if request.POST.get("action") != "cancel" or not self.may_cancel(run):
            return HttpResponseForbidden("You can cancel only a run of your own that has not finished.")
        runs.cancel_run(run, by=request.user, reason=f"cancelled by {request.user} on the run's page")
        return HttpResponseRedirect(reverse("nexo_django:run_detail", args=[run.pk]))

    def follow_up(self, request: HttpRequest, run: AgentRun) -> HttpResponse:
        if not self.may_follow_up(run):
            return HttpResponseForbidden(
                "You can follow up only on a run of your own that is done or cancelled, and only on "
                "the last run of its conversation."
            )
        prompt = (request.POST.get("prompt") or "").strip()
        if not prompt:
            return HttpResponse("Write a question to follow up with.", status=400, content_type="text/plain")
        try:
            new = run.follow_up(prompt[:20_000], user=request.user)
        except FollowUpRefused as exc:
            return HttpResponse(str(exc), status=409, content_type="text/plain")
        return HttpResponseRedirect(reverse("nexo_django:run_detail", args=[new.pk]))

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        run: AgentRun = self.object
        context["can_cancel"] = self.may_cancel(run)
        context["can_follow_up"] = self.may_follow_up(run)
        context["schedule"] = schedules.schedule_of(run)
        visible = self.get_queryset()
        context["conversation"] = conversation_entries(
            run, visible, lambda r: reverse("nexo_django:run_detail", args=[r.pk])
        )
        for side, other in neighbours(run, visible).items():
            context[side] = other
            context[f"{side}_url"] = reverse("nexo_django:run_detail", args=[other.pk]) if other else None
        operator = self.get_shows_operator_details()
        status = run_status(run, operator=operator)
        context["status"] = status
        context["operator"] = operator
        context["result"] = bounded_text(run.result or "").html
        context["error"] = bounded_text(status["error"] or "").html
        context.update(transcript_window(run, self.request))
        warning = self.get_queue_warning(run)
        context["queue_warning"] = warning if operator else None
        context["waiting_for_worker"] = warning is not None
        context["attention_url"] = (
            run_admin_url(run) if run.status == RunStatus.NEEDS_ATTENTION and operator else None
        )
        context.update(pending_entries(run, self.get_inbox_url))
        # Under ASGI the page follows the run's event stream (it reloads when what it shows
        # changes); under WSGI it polls the status, faster while the run works.
        live_page = not run.is_terminal and streams(self.request)
        context["stream"] = {
            "url": reverse("nexo_django:run_stream", args=[run.pk]),
            "after": RunEvent.objects.filter(run=run).order_by("-id").values_list("id", flat=True).first() or 0,
            "reload_on": sorted(RELOAD_ON),
        } if live_page else None
        context["poll"] = {
            "url": reverse("nexo_django:run_status", args=[run.pk]),
            "version": status["version"],
            "interval_ms": 1000 if status["active"] else 3000,
        } if not run.is_terminal and not live_page else None
        return context


@method_decorator(never_cache, name="dispatch")
@method_decorator(ensure_csrf_cookie, name="dispatch")
class RunStatusView(View):
    """JSON for the run's page to poll. A run the user may not see is a 404, as if absent. It
    sets the CSRF cookie, so a front end that reads it can POST a decision next."""

    def get_queryset(self) -> QuerySet[AgentRun]:
        return visible_runs(self.request.user)

    def get(self, request: HttpRequest, pk: Any) -> JsonResponse:
        try:
            run = get_object_or_404(self.get_queryset(), pk=pk)
        except Http404:
            return JsonResponse({"error": "no such run"}, status=404)
        return JsonResponse(run_status(run, operator=shows_operator_details(request.user),
                                       pending_after=run_pages.int_param(request, "pending_after")))


#: Events one GET of :class:`RunEventsView` returns at most; ``?after=<id>`` pages on.
EVENTS_PAGE = 200


@method_decorator(never_cache, name="dispatch")
class RunEventsView(View):
    """JSON: the run's events after ``?after=<id>`` (oldest first, at most :data:`EVENTS_PAGE`),
    for single-page and mobile front ends. Session auth; a run the user may not see is a 404."""

    def get(self, request: HttpRequest, pk: Any) -> JsonResponse:
        run = visible_runs(request.user).filter(pk=pk).first()
        if run is None:
            return JsonResponse({"error": "no such run"}, status=404)
        try:
            after = int(request.GET.get("after") or 0)
        except ValueError:
            return JsonResponse({"error": "after must be an event id (a whole number)"}, status=400)
        rows = list(RunEvent.objects.filter(run=run, id__gt=after).order_by("id")[: EVENTS_PAGE + 1])
        events = [live.event_json(e) for e in rows[:EVENTS_PAGE]]
        return JsonResponse({"run": str(run.pk), "events": events, "more": len(rows) > EVENTS_PAGE})


#: Events after which the run's page shows something new (a message, a call waiting, the end):
#: the page reloads on them; it lists the others as they come.
RELOAD_ON = frozenset({
    "model_reply", "tool_result", "suspended", "decision", "expired", "done", "failed", "cancelled",
    "stopped", "retried", "recovered", "outcome_unknown", "outcome_resolved", "gave_up", "security", "end",
})


def streams(request: HttpRequest) -> bool:
    """Whether this request is served by an ASGI server, which can hold an event stream open
    without holding a thread (under WSGI the page polls instead)."""
    return isinstance(request, ASGIRequest)


class RunStreamView(View):
    """Server-Sent Events: the run's events as they commit (``id:`` is the event's id, ``event:``
    its type, ``data:`` the JSON the events endpoint gives), the model's text as it is written
    (``event: delta``, no id: not stored), and ``event: end`` once the run is finished. It resumes
    after ``Last-Event-ID`` (what a browser's ``EventSource`` sends when it reconnects) or
    ``?after=<id>``. An async view: it needs an ASGI server (under WSGI: 501, poll ``status/``)."""

    async def get(self, request: HttpRequest, pk: Any) -> HttpResponse | StreamingHttpResponse:
        user = await request.auser()
        run = await sync_to_async(lambda: visible_runs(user).filter(pk=pk).first())()  # has_perm reads
        if run is None:
            return JsonResponse({"error": "no such run"}, status=404)
        if not streams(request):
            return JsonResponse(
                {"error": "the event stream needs an ASGI server; poll status/ and events/ instead"}, status=501
            )
        raw = request.headers.get("Last-Event-ID") or request.GET.get("after") or "0"
        try:
            after = int(raw)
        except ValueError:
            return JsonResponse({"error": "Last-Event-ID (or after) must be an event id (a whole number)"}, status=400)
        response = StreamingHttpResponse(live.event_stream(run.pk, after), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache, no-store"
        response["X-Accel-Buffering"] = "no"  # nginx: pass each event on as it comes
        return response


@method_decorator(never_cache, name="dispatch")
class CallDecisionView(View):
    """JSON: decide one pending call of a run. POST only, with the session's CSRF token (the
    ``X-CSRFToken`` header, as Django's docs show for JavaScript), by a user holding
    ``nexo_django.decide_toolcall``. The body is JSON::

        {"verdict": "approve" | "deny", "digest": "<the digest the front end showed>",
         "note": "", "stop": false, "args": {...}, "file_version": "..."}

    ``stop`` (with a denial) stops the run; ``args`` (with an approval) are edited arguments, checked
    like the admin's editor; ``file_version`` binds the approval of a ``write`` to the file version
    the front end showed (the status endpoint serves it as ``pending[].file_version``). A stale
    digest, a call decided meanwhile or an expired one is a 409 that says why; edited arguments
    that fail their check are a 400. An approval whose target the sandbox refuses now is recorded
    and fails the call and its run: the answer then has ``"refused": true``, the ``"error"``
    (``SecurityError: ...``) and ``"run_status": "failed"``."""

    http_method_names = ["post"]

    def post(self, request: HttpRequest, pk: Any, call_pk: int) -> JsonResponse:
        run = visible_runs(request.user).filter(pk=pk).first()
        if run is None:
            return JsonResponse({"error": "no such run"}, status=404)
        if not request.user.has_perm("nexo_django.decide_toolcall"):
            return JsonResponse({"error": "deciding needs the permission nexo_django.decide_toolcall"}, status=403)
        try:
            body = request_json(request, empty={})
        except BadJSON as exc:
            return JsonResponse({"error": f"{exc}; send {{\"verdict\": ..., \"digest\": ...}}"}, status=400)
        refused = _decision_refused(body)
        if refused:
            return JsonResponse({"error": refused}, status=400)
        call = ToolCall.objects.filter(run=run, pk=call_pk).first()
        if call is None:
            return JsonResponse({"error": "no such call in this run"}, status=404)
        approved = body["verdict"] == "approve"
        try:
            decision = runs.decide(
                call, approved=approved, by=request.user, note=body.get("note", "")[:2000], digest=body["digest"],
                source="json", stop=bool(body.get("stop")), args=body.get("args"), file_version=body.get("file_version"),
            )
        except ApprovalExpired:
            return JsonResponse({"error": outcomes.expired_sentence(call), "expired": True}, status=409)
        except (AlreadyDecided, StaleDecision, ApprovalRefused) as exc:
            return JsonResponse({"error": str(exc)}, status=409)
        except InvalidEditedArguments as exc:
            return JsonResponse({"error": str(exc)}, status=400)
        except PermissionDenied as exc:
            return JsonResponse({"error": str(exc) or "you may not decide this call"}, status=403)
        run.refresh_from_db()
        if refused := refusals.refused(call):
            # Recorded: the approval, and the call and its run failed (durable.refusals).
            return JsonResponse({"verdict": decision.verdict, "digest": decision.digest, "stop": decision.stop,
                                 "run_status": run.status, "refused": True, "error": refused})
        return JsonResponse({"verdict": decision.verdict, "digest": decision.digest, "stop": decision.stop,
                             "run_status": run.status})


class QuestionAnswerView(View):
    """JSON: answer one open question of a workflow run. POST only, with the session's CSRF token,
    by a user holding ``nexo_django.decide_toolcall`` (and, with ``NEXO["SELF_APPROVAL"]`` off,
    not the run's starter), as the admin's form. The body is ``{"answer": <any JSON>}``; the
    answer is checked against the question's schema (a 400 with the reason, nothing recorded). A
    question answered meanwhile or expired is a 409 that says why and by whom."""

    http_method_names = ["post"]

    def post(self, request: HttpRequest, pk: Any, key: str) -> JsonResponse:
        run = visible_runs(request.user).filter(pk=pk).first()
        if run is None:
            return JsonResponse({"error": "no such run"}, status=404)
        if not request.user.has_perm("nexo_django.decide_toolcall"):
            return JsonResponse({"error": "answering needs the permission nexo_django.decide_toolcall"}, status=403)
        try:
            body = request_json(request, empty={})
        except BadJSON as exc:
            return JsonResponse({"error": f'{exc}; send {{"answer": ...}}'}, status=400)
        if not isinstance(body, dict) or not (set(body) == {"answer"} or set(body) in ({"action"}, {"action", "answer"})):
            return JsonResponse({"error": 'send {"answer": ...}: the answer, as JSON, and nothing else (an MCP '
                                          'server\'s question also takes {"action": "decline" | "cancel"})'}, status=400)
        try:
            step = workflow_questions.answer(run, key, body.get("answer"), by=request.user, source="json",
                                             action=str(body.get("action") or "accept"))
        except WorkflowError as exc:
            return JsonResponse({"error": str(exc)}, status=404)
        except AlreadyDecided as exc:  # ApprovalExpired too: answered meanwhile, or no longer answerable
            return JsonResponse({"error": str(exc), "expired": isinstance(exc, ApprovalExpired)}, status=409)
        except InvalidAnswer as exc:
            return JsonResponse({"error": str(exc)}, status=400)
        except PermissionDenied as exc:
            return JsonResponse({"error": str(exc) or "you may not answer this question"}, status=403)
        run.refresh_from_db()
        return JsonResponse({"key": step.name, "status": step.status, "answered_by": str(request.user),
                             "run_status": run.status})


def _decision_refused(body: Any) -> str:
    """What is wrong with a decision's JSON body, or "" when nothing is."""
    usage = ('give verdict "approve" or "deny", the digest you showed, and optionally a note, '
             '"stop": true (with a denial) or edited "args" (an object, with an approval)')
    if not isinstance(body, dict) or body.get("verdict") not in ("approve", "deny") or not isinstance(body.get("digest"), str):
        return usage
    if not isinstance(body.get("note", ""), str) or not isinstance(body.get("stop", False), bool):
        return usage
    if body.get("stop") and body["verdict"] != "deny":
        return '"stop" goes with a denial: it stops the run instead of telling the model'
    if body.get("args") is not None and (body["verdict"] != "approve" or not isinstance(body["args"], dict)):
        return 'edited "args" are an object, and go with an approval'
    if body.get("file_version") is not None and not isinstance(body["file_version"], str):
        return '"file_version" is the version string the front end showed'
    return ""
