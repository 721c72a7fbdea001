"""The views behind the admin classes: decide one call, decide many, look after a run.

Every view that changes something checks ``has_decide_permission`` itself (``admin_view`` checks
only ``is_staff``), takes a POST only (CSRF-protected by the admin site), and changes state through
:mod:`nexo_django.runs` alone. With an inline queue the run continues at commit, inside this
request; otherwise a worker picks it up.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from django.contrib import messages
from django.contrib.admin import helpers
from django.core.exceptions import BadRequest, PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.timesince import timesince

from .. import run_pages
from ..bounded import (
    bounded_json,
    bounded_text,
    count_hidden,
    long_strings,
    preview,
)
from ..core.errors import (
    AlreadyDecided,
    ApprovalExpired,
    ApprovalRefused,
    InvalidEditedArguments,
    StaleDecision,
    TransitionError,
)
from ..display import is_hidden, json_diff, json_for_editor, mark_hidden, reveal
from ..durable import dispatch, outcomes, refusals, rule_history, runs
from ..durable.policy import check as policy_check
from ..durable.policy import quorum as policy_quorum
from ..durable.policy.check import PolicyRefusal
from ..jsonbody import read_json
from ..models import AgentRun, Approval, CallStatus, Decision, RunStatus, ToolCall, args_digest
from ..views import conversation_entries, neighbours
from . import rules as admin_rules
from .base import NexoModelAdmin
from .forms import (
    APPROVE,
    APPROVE_ALWAYS,
    APPROVE_EDITED,
    BACK,
    DENY_STOP,
    EDITED_MAX_CHARS,
    REVIEW_EDIT,
    BulkDenyForm,
    encode_file_version,
)
from .insight import timeline as insight_timeline
from .loading import (
    CALL_CELL_BYTES,
    Stored,
    cell_shown,
    load,
    load_many,
    preview_shown,
    transcript_context,
)
from .schedules import scheduled_by
from .workflows import workflow_context

#: the inbox's and the run page's admins (``nexo_django.admin``), which import this module:
#: named by their base here, with the hooks of their own reached as ``Any``
type PendingApprovalAdmin = Any
type AgentRunAdmin = Any

STATUS_WORDS: dict[str, str] = {
    RunStatus.QUEUED: "is queued: a worker will continue it",
    RunStatus.RUNNING: "is running",
    RunStatus.SUSPENDED: "waits for another decision",
    RunStatus.DONE: "is done",
    RunStatus.FAILED: "failed",
    RunStatus.CANCELLED: "was cancelled",
    RunStatus.NEEDS_ATTENTION: "needs attention",
}


def refuse_post_without_permission(model_admin: NexoModelAdmin, request: HttpRequest) -> None:
    """Read-only users get the pages but no POST at all: an action they cannot see is refused
    with 403 rather than quietly ignored."""
    if request.method == "POST" and not model_admin.has_decide_permission(request):
        raise PermissionDenied


def refuse_nul_in_query(request: HttpRequest) -> None:
    """A NUL in the query string (a list filter, a search) is a 400: no database column holds one
    (PostgreSQL refuses it in any text value), so the filter could never match."""
    for key, values in request.GET.lists():
        if "\x00" in key or any("\x00" in value for value in values):
            raise BadRequest(f"the query parameter {key!r} holds a NUL character; remove it")


def _changelist_url(model_admin: Any) -> str:
    opts = model_admin.model._meta
    return reverse(f"{model_admin.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist")


def _status_words(run: AgentRun, *, stopping: bool) -> str:
    """What happens to the run next, as it is: a queued run whose job did not reach Redis waits
    for the reconciler, and a run stopped by its approver is queued only to be closed."""
    if run.status != RunStatus.QUEUED:
        return STATUS_WORDS.get(run.status, run.status)
    why = dispatch.unsent(run.pk)
    if stopping:
        if why:
            return (f"stops: nothing more of it runs. Its job could not be sent to a worker ({why}); "
                    "it is closed as cancelled when the reconciler (manage.py nexo_reconcile) sends it again")
        return "stops: nothing more of it runs (a worker closes it as cancelled)"
    if why:
        return (f"is queued, but its job could not be sent to a worker ({why}): it continues when the "
                "reconciler (manage.py nexo_reconcile) sends it again")
    return STATUS_WORDS[RunStatus.QUEUED]


def where_it_went(model_admin: NexoModelAdmin, run_ids: list[Any], *, stopping: bool = False) -> SafeString:
    """ "Run 1a2b3c4d is done." for each run, linked to the run's page."""
    found = AgentRun.objects.filter(pk__in=run_ids).only("id", "status", "agent")
    return format_html_join(
        " ", "{} run {} {}.",
        ((run.agent_name, model_admin.run_link(run.pk), _status_words(run, stopping=stopping)) for run in found),
    )


def who_decided(call: ToolCall) -> str:
    """For an approver who lost a race: who decided the call, how and when (or what ended it)."""
    decision = Decision.objects.filter(tool_call_id=call.pk).select_related("decided_by").first()
    if decision is None:
        current = ToolCall.objects.filter(pk=call.pk).values_list("status", flat=True).first()
        return f"nobody decided it: its run ended first (the call is {current or 'gone'})"
    by = str(decision.decided_by) if decision.decided_by_id else f"the system ({decision.source})"
    how = str(decision.verdict) + (" with edited arguments" if decision.args is not None else "")
    how += " and stopped the run" if decision.stop else ""
    note = f', noting "{decision.note}"' if decision.note else ""
    return f"{by} {how} it {timesince(decision.decided_at, depth=1)} ago{note}"


def _base_context(model_admin: Any, request: HttpRequest, title: str, obj: Any = None) -> dict[str, Any]:
    opts = model_admin.model._meta
    # {% url 'admin:...' %} in the templates resolves to this site, as in Django's own admin views.
    request.current_app = model_admin.admin_site.name
    return {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": opts,
        "app_label": opts.app_label,
        "original": obj,
        "has_view_permission": True,
        "can_decide": model_admin.has_decide_permission(request, obj),
    }


#: Runs that need attention named at most on the inbox, the oldest first.
NEEDS_ATTENTION_SHOWN = 10


def announce_needs_attention(model_admin: PendingApprovalAdmin, request: HttpRequest) -> None:
    """Above the inbox: each run that needs a person though it has no pending call, what to
    decide, and the link to decide it (its run page: run the call again, or not)."""
    found = list(model_admin.get_needs_attention(request)[: NEEDS_ATTENTION_SHOWN + 1])
    if not found:
        return
    unknown: dict[Any, list[str]] = {}
    for call in ToolCall.objects.filter(run_id__in=[r.pk for r in found], status=CallStatus.OUTCOME_UNKNOWN):
        unknown.setdefault(call.run_id, []).append(f"{call.name} ({call.tool_call_id})")
    for run in found[:NEEDS_ATTENTION_SHOWN]:
        calls = unknown.get(run.pk)
        what = (
            f"decide whether {', '.join(calls)} runs again: its worker stopped while it ran"
            if calls else "look at it: it stopped for a person"
        )
        messages.warning(request, format_html(
            "{} run {} needs a person: {}.", mark_hidden(run.agent_name), model_admin.run_link(run.pk), mark_hidden(what),
        ))
    if len(found) > NEEDS_ATTENTION_SHOWN:
        messages.warning(request, "More runs need a person: see the runs filtered by status “needs attention”.")


# --- one call ------------------------------------------------------------------------------------


def _find_call(
    model_admin: PendingApprovalAdmin, request: HttpRequest, object_id: str, *, defer_args: bool = False
) -> ToolCall | None:
    # A page defers the arguments and loads them by size (admin.loading); a decision needs no more.
    try:
        calls = model_admin.get_queryset(request).filter(pk=object_id)
        return (calls.defer("args") if defer_args else calls).first()
    except (ValueError, ValidationError):
        return None


def _refuse(model_admin: Any, request: HttpRequest) -> HttpResponse | None:
    """Decisions only by POST, and only with the decide permission, checked here in the view
    (``admin_view`` checks staff only); viewing needs the view permission."""
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD, POST"})
    if request.method == "POST" and not model_admin.has_decide_permission(request):
        raise PermissionDenied
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    return None


_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})")
#: Other pending calls of the run listed on a decision page.
OTHER_PENDING_SHOWN = 20
#: HTML bytes of the pre-filled editor; past it the arguments are too long to edit on a page.
EDITOR_MAX_BYTES = 600_000


def _lost_race(model_admin: PendingApprovalAdmin, request: HttpRequest, object_id: str) -> str | None:
    """For a decision posted on a call someone decided meanwhile: who, how and when."""
    if request.method != "POST" or not model_admin.has_decide_permission(request):
        return None
    try:
        call = ToolCall.objects.filter(pk=object_id).first()
    except (ValueError, ValidationError):
        return None
    if call is None:
        return None
    return mark_hidden(f"{call.name} call {call.tool_call_id} is no longer waiting for a decision: {who_decided(call)}")


def decision_view(model_admin: PendingApprovalAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    refused = _refuse(model_admin, request)
    if refused is not None:
        return refused
    call = _find_call(model_admin, request, object_id, defer_args=request.method != "POST")
    if call is None:
        decided = _lost_race(model_admin, request, object_id)
        messages.warning(request, f"Nothing changed: {decided}." if decided else
                         "That call is no longer waiting for a decision (it was decided, or its run ended).")
        return HttpResponseRedirect(_changelist_url(model_admin))
    if request.method == "POST":
        if not model_admin.has_decide_permission(request, call):
            raise PermissionDenied
        form = model_admin.get_decision_form(request, call, data=request.POST)
        action = request.POST.get("action")
        if form.is_valid():
            action = form.cleaned_data["action"]
            if action == REVIEW_EDIT:
                return _review_page(model_admin, request, call, form.cleaned_data)
            if action != BACK:
                return _decide(model_admin, request, call, action, form.cleaned_data)
            # "Back to editing": the editor again, with the edited text kept.
            text = form.cleaned_data.get("edited_args", "")
            with contextlib.suppress(ValueError):  # jsonbody.BadJSON too: kept as typed
                text = json_for_editor(read_json(text, what="the edited arguments"))
            form = model_admin.get_decision_form(request, call, initial={
                "digest": call.digest, "note": form.cleaned_data.get("note", ""), "edited_args": text,
            })
            return _edit_page(model_admin, request, call, form)
        if action in (REVIEW_EDIT, APPROVE_EDITED, BACK):
            return _edit_page(model_admin, request, call, form)
        return _decision_page(model_admin, request, call, form)
    # The decision form carries the digest and the note only: what Approve and Deny post never
    # grows with the arguments (the editor is a page of its own).
    form = model_admin.get_decision_form(request, call, initial={"digest": call.digest})
    return _decision_page(model_admin, request, call, form)


def edit_view(model_admin: PendingApprovalAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """The editor of one call's arguments, a page apart from the decision page; it posts to the
    decision page (review, then confirm)."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
    refused = _refuse(model_admin, request)
    if refused is not None:
        return refused
    call = _find_call(model_admin, request, object_id, defer_args=True)
    if call is None:
        messages.warning(request, "That call is no longer waiting for a decision (it was decided, or its run ended).")
        return HttpResponseRedirect(_changelist_url(model_admin))
    if outcomes.is_expired(call):  # nothing to edit towards: its decision page says it expired
        return HttpResponseRedirect(model_admin.call_url(call.pk))
    text = _editor_text(call)
    form = model_admin.get_decision_form(request, call, initial={"digest": call.digest, "edited_args": text or ""})
    return _edit_page(model_admin, request, call, form, editable=text is not None)


def _editor_text(call: ToolCall) -> str | None:
    """The arguments as the editor shows them, or None when they are longer than an edit may be
    (their stored size is asked first: a 50 MB argument is not loaded for nothing)."""
    stored = load(ToolCall, call.pk, "args")
    if stored.big or stored.size > EDITED_MAX_CHARS:
        return None
    text = json_for_editor(stored.value)
    return text if len(text) <= EDITED_MAX_CHARS else None


def _edit_page(
    model_admin: PendingApprovalAdmin, request: HttpRequest, call: ToolCall, form: Any, *, editable: bool | None = None
) -> HttpResponse:
    if editable is None:
        editable = _editor_text(call) is not None
    context = {
        **_base_context(model_admin, request, mark_hidden(f"Edit the arguments of {call.name}"), call),
        "call": call,
        "tool_name": reveal(call.name),
        "call_id": bounded_text(call.tool_call_id, budget=2_000, chars=200).html,
        "form": form,
        "editable": editable,
        "edited_max": EDITED_MAX_CHARS,
        "decision_url": model_admin.call_url(call.pk),
        "arguments_url": model_admin.pending_arguments_url(call.pk),
    }
    return TemplateResponse(request, model_admin.edit_template, context)


def _decision_page(
    model_admin: PendingApprovalAdmin, request: HttpRequest, call: ToolCall, form: Any, *, editing: bool = False
) -> HttpResponse:
    run = call.run
    pending = list(model_admin.get_other_pending(request, call).defer("args")[: OTHER_PENDING_SHOWN + 1])
    stored_others = load_many(ToolCall, [c.pk for c in pending[:OTHER_PENDING_SHOWN]], "args")
    other = [
        {"url": model_admin.call_url(c.pk), "name": reveal(c.name), "preview": preview_shown(stored_others.get(c.pk))}
        for c in pending[:OTHER_PENDING_SHOWN]
    ]
    stored = load(ToolCall, call.pk, "args")
    call.nexo_args_size = stored.size  # type: ignore[attr-defined]  # read by admin.previews
    if stored.big:
        # Too big to load into a page: the start of its stored JSON text, as stored.
        prefix = stored.prefix or ""
        args = bounded_text(prefix, keep="\n")
        args.clipped = True
        hidden, exact = count_hidden(prefix)
        # Stored JSON text may write hidden characters as \uXXXX escapes (SQLite keeps ASCII): count those too.
        hidden += sum(1 for code in _ESCAPE.findall(prefix) if is_hidden(chr(int(code, 16))))
        exact = False
        strings: list[Any] = []
    else:
        if "args" in call.get_deferred_fields():
            call.args = stored.value
        args = bounded_json(stored.value)
        hidden, exact = count_hidden(stored.value)
        strings = long_strings(stored.value)
    call_preview = model_admin.get_call_preview(request, call)
    if not form.is_bound:
        # Approve is bound to the file version this page's diff was made from.
        form.initial["file_version"] = encode_file_version(call_preview.version)
    expired = outcomes.is_expired(call)
    context = {
        **_base_context(model_admin, request, mark_hidden(f"Decide: {call.name} in {run.agent_name} run {str(run.pk)[:8]}"), call),
        # From the deadline on it is expired, reconciled or not: no buttons.
        "expired": outcomes.expired_sentence(call) if expired else "",
        "call": call,
        "run": run,
        "run_link": model_admin.run_link(run.pk),
        "tool_name": reveal(call.name),
        "call_id": bounded_text(call.tool_call_id, budget=2_000, chars=200).html,
        "started_by": str(run.created_by) if run.created_by_id else "—",
        "scheduled_by": scheduled_by(model_admin.admin_site.name, run),
        "age": timesince(call.created_at),
        "args_html": args.html,
        "args_clipped": args.clipped,
        "args_size": stored.size,
        "args_big": stored.big,
        "hidden_count": hidden,
        "hidden_exact": exact,
        "long_strings": strings,
        "arguments_url": model_admin.pending_arguments_url(call.pk),
        "edit_url": model_admin.call_edit_url(call.pk),
        "preview": call_preview,
        # The file is not the version the notices showed: the approver is told whose diff this is.
        # The approval policy that routes it (durable.policy): who decides, how many have, and
        # whether this person may.
        **_policy_context(call, request.user),
        "changed_since_asked": call_preview.version is not None and call.suspension_version is not None
        and call_preview.version != call.suspension_version,
        "form": form,
        "editing": editing,
        "other_pending": other,
        "other_pending_more": len(pending) > OTHER_PENDING_SHOWN,
        **admin_rules.always_allow_context(model_admin, request, call, head=stored.prefix),
        **transcript_context(model_admin, request, run),
    }
    if expired:
        context["can_decide"] = False
    return TemplateResponse(request, model_admin.decision_template, context)


def _review_page(
    model_admin: PendingApprovalAdmin, request: HttpRequest, call: ToolCall, data: dict[str, Any]
) -> HttpResponse:
    edited = data["args"]
    context = {
        **_base_context(model_admin, request, mark_hidden(f"Review edited arguments of {call.name}"), call),
        "call": call,
        "tool_name": reveal(call.name),
        "diff": json_diff(call.args, edited),
        "edited_html": bounded_json(edited).html,
        "digest": data["digest"],
        "note": data.get("note", ""),
        # Compact ASCII JSON: a hidden input keeps it byte for byte (no newlines, no hidden characters).
        "edited_args": json.dumps(edited, ensure_ascii=True),
        "edited_digest": args_digest(edited),
        "decision_url": model_admin.call_url(call.pk),
        "approve_edited": APPROVE_EDITED,
        "back": BACK,
    }
    return TemplateResponse(request, model_admin.review_template, context)


def _policy_context(call: ToolCall, user: Any) -> dict[str, str]:
    now = timezone.now()
    note = policy_check.note(call, now)
    if not note:
        return {}
    return {"policy_note": mark_hidden(note), "policy_drift": mark_hidden(policy_check.drift(call)),
            "policy_refusal": mark_hidden(policy_check.refusal(call, user, now))}


def _decide(
    model_admin: PendingApprovalAdmin, request: HttpRequest, call: ToolCall, action: str, data: dict[str, Any]
) -> HttpResponse:
    approved = action in (APPROVE, APPROVE_EDITED, APPROVE_ALWAYS)
    here = model_admin.call_url(call.pk)
    decided: Any = None
    try:
        if action == APPROVE_ALWAYS:
            refused = admin_rules.approve_always(model_admin, request, call, data)
            if refused is not None:
                return refused
        else:
            decided = runs.decide(
                call, approved=approved, by=request.user, note=data.get("note", ""),
                args=data.get("args") if action == APPROVE_EDITED else None,
                stop=action == DENY_STOP, digest=data["digest"], source="admin",
                file_version=data.get("shown_version") if action == APPROVE else None,
            )
    except ApprovalExpired:
        messages.warning(request, f"Nothing changed: {mark_hidden(outcomes.expired_sentence(call))}")
        return HttpResponseRedirect(_changelist_url(model_admin))
    except AlreadyDecided as exc:
        messages.warning(request, f"Nothing changed: {mark_hidden(exc)}: {mark_hidden(who_decided(call))}.")
        return HttpResponseRedirect(_changelist_url(model_admin))
    except (StaleDecision, InvalidEditedArguments, ApprovalRefused) as exc:
        messages.error(request, f"Nothing changed: {mark_hidden(exc)}")
        return HttpResponseRedirect(here)
    except PolicyRefusal as exc:  # the call's approval policy (durable.policy.check)
        messages.error(request, f"Nothing changed: {mark_hidden(exc)}.")
        return HttpResponseRedirect(here)
    if sandbox_said := refusals.refused(call):
        # Recorded (the approval, the call and its run failed): said as an error, not a success.
        messages.error(request, format_html(
            "Approved, but the sandbox refused {} ({}) now, so it could not run: the run failed. {}. {}",
            reveal(call.name), reveal(call.tool_call_id), mark_hidden(sandbox_said), model_admin.run_link(call.run_id),
        ))
        return HttpResponseRedirect(_changelist_url(model_admin))
    if isinstance(decided, Approval):  # one of several approvals its policy needs (durable.policy.quorum)
        so_far = policy_quorum.progress(call, None, policy_check.counts(call, timezone.now()))
        messages.success(request, format_html(
            "Your approval of {} ({}) is recorded: {}. It runs when the last approval needed lands.",
            reveal(call.name), reveal(call.tool_call_id), mark_hidden(so_far)))
        return HttpResponseRedirect(here)
    verb = {APPROVE: "Approved", APPROVE_EDITED: "Approved with edited arguments", DENY_STOP: "Denied (run stopped)",
            APPROVE_ALWAYS: "Approved (and a standing rule now allows such calls)"}
    messages.success(request, format_html(
        "{} {} ({}). {}", verb.get(action, "Denied"), reveal(call.name), reveal(call.tool_call_id),
        where_it_went(model_admin, [call.run_id], stopping=action == DENY_STOP),
    ))
    following = model_admin.get_other_pending(request, call).first()
    return HttpResponseRedirect(model_admin.call_url(following.pk) if following else _changelist_url(model_admin))


# --- many calls ----------------------------------------------------------------------------------


def _selected_calls(
    model_admin: PendingApprovalAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> list[ToolCall] | None:
    """The calls to decide, or None (with a message) when one selected call is gone."""
    calls = list(queryset.order_by("created_at", "id"))
    # Four eyes, bulk included: one call of a run this user started refuses the whole action.
    if any(not model_admin.has_decide_permission(request, c) for c in calls):
        raise PermissionDenied
    if request.POST.get("select_across") == "1":
        return calls
    selected = set(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME))
    missing = selected - {str(c.pk) for c in calls}
    if missing:
        gone = ToolCall.objects.filter(pk__in=missing).order_by("id")
        names = mark_hidden(", ".join(f"{c.name} {c.tool_call_id} ({c.status})" for c in gone) or ", ".join(sorted(missing)))
        messages.error(request, f"Nothing was decided: {names} is no longer waiting for a decision. Reload and try again.")
        return None
    return calls


def _decide_all_or_nothing(
    model_admin: PendingApprovalAdmin, request: HttpRequest, calls: list[ToolCall], *, approved: bool, note: str,
    digests: dict[int, str | None],
) -> None:
    ended: set[Any] = set()  # runs a refused call failed (durable.refusals): their other calls ended too
    try:
        with transaction.atomic():
            for call in calls:
                if call.run_id in ended:
                    continue
                runs.decide(call, approved=approved, by=request.user, note=note, digest=digests.get(call.pk),
                            source="admin-bulk")
                if refusals.refused(call):
                    ended.add(call.run_id)
    except (TransitionError, PolicyRefusal) as exc:
        # The whole transaction rolled back: no decision, no wake-up was sent.
        messages.error(request, f"Nothing was decided: {mark_hidden(exc)}" + ("." if isinstance(exc, PolicyRefusal) else ""))
        return
    for call in calls:
        if refused := refusals.refused(call):
            messages.error(request, format_html(
                "The sandbox refused {} ({}) now, so it could not run: its run failed. {}. {}",
                reveal(call.name), reveal(call.tool_call_id), mark_hidden(refused), model_admin.run_link(call.run_id),
            ))
    calls = [c for c in calls if c.run_id not in ended]
    if not calls:
        return
    verb = "Approved" if approved else "Denied"
    run_ids = list(dict.fromkeys(c.run_id for c in calls))
    messages.success(request, format_html(
        "{} {} call(s). {}", verb, len(calls), where_it_went(model_admin, run_ids)
    ))


def bulk_approve(model_admin: PendingApprovalAdmin, request: HttpRequest, queryset: QuerySet[Any]) -> None:
    if not model_admin.has_decide_permission(request):
        raise PermissionDenied
    calls = _selected_calls(model_admin, request, queryset)
    if calls is None:
        return
    digests: dict[int, str | None] = {c.pk: request.POST.get(f"digest_{c.pk}") for c in calls}
    unseen = [c for c in calls if not digests[c.pk]]
    if unseen:
        names = mark_hidden(", ".join(f"{c.name} {c.tool_call_id}" for c in unseen[:5]))
        more = " …" if len(unseen) > 5 else ""
        messages.error(request, f"Nothing was approved: {names}{more} was not shown on this page. "
                                "Approve only calls you can see.")
        return
    _decide_all_or_nothing(model_admin, request, calls, approved=True, note="", digests=digests)


def bulk_deny(model_admin: PendingApprovalAdmin, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
    if not model_admin.has_decide_permission(request):
        raise PermissionDenied
    calls = _selected_calls(model_admin, request, queryset)
    if calls is None:
        return None
    form = BulkDenyForm(request.POST if request.POST.get("confirm") == "yes" else None)
    if form.is_bound and form.is_valid():
        _decide_all_or_nothing(model_admin, request, calls, approved=False, note=form.cleaned_data["note"], digests={})
        return None
    context = {
        **_base_context(model_admin, request, "Deny the selected calls"),
        "calls": [{"pk": c.pk, "name": reveal(c.name), "preview": preview(c.args), "run": model_admin.run_link(c.run_id)}
                  for c in calls],
        "form": form,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, model_admin.bulk_deny_template, context)


# --- runs ----------------------------------------------------------------------------------------

RUN_ACTIONS = ("cancel", "retry", "rerun", "do_not_rerun")


def run_detail_view(model_admin: AgentRunAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    refused = _refuse(model_admin, request)
    if refused is not None:
        return refused
    try:
        run = model_admin.get_queryset(request).select_related("created_by").filter(pk=object_id).first()
    except (ValueError, ValidationError):
        run = None
    if run is None:
        raise Http404("No such run, or it is not yours to see.")
    if request.method == "POST":
        return _run_action(model_admin, request, run)
    # The calls a window at a time (counts by status above it): a turn can hold 10,000.
    calls_window = run_pages.calls_window(run, start=run_pages.int_param(request, "calls_from"))
    calls = calls_window.rows
    # Arguments and results by size: a call of 50 MB is shown by the start of its stored text.
    stored_args = load_many(ToolCall, [c.pk for c in calls], "args")
    stored_results = load_many(ToolCall, [c.pk for c in calls], "result")
    events_window = run_pages.window(
        model_admin.get_events(request, run), "id", limit=model_admin.events_limit,
        start=0 if request.GET.get("events") == "all" else run_pages.int_param(request, "events_from"), tail=True,
    )
    events = events_window.rows
    context = {
        **_base_context(model_admin, request, f"{run.agent_name} run {str(run.pk)[:8]}", run),
        "run": run,
        "prompt_html": bounded_text(run.prompt).html,
        "result_html": bounded_text(run.result).html if run.result is not None else None,
        "error_html": bounded_text(run.error).html if run.error else None,
        "started_by": str(run.created_by) if run.created_by_id else "—",
        "scheduled_by": scheduled_by(model_admin.admin_site.name, run),
        "calls": [_call_row(model_admin, c, stored_args[c.pk], stored_results[c.pk], run) for c in calls],
        "calls_window": calls_window,
        "call_counts": run_pages.call_counts(run),
        "has_unknown": ToolCall.objects.filter(run=run, status=CallStatus.OUTCOME_UNKNOWN).exists(),
        "can_cancel": not run.is_terminal,
        "can_retry": run.status in (RunStatus.NEEDS_ATTENTION, RunStatus.FAILED),
        "queue_warning": model_admin.get_queue_warning(request, run),
        "events": [{"seq": e.id, "type": e.type, "data": bounded_json(e.data, budget=4_000, string_chars=500).html,
                    "at": e.created_at} for e in events],
        "events_window": events_window,
        **transcript_context(model_admin, request, run),
        **_conversation_context(model_admin, request, run),
        **workflow_context(model_admin, run),
    }
    # The picture of the run, from the events and steps loaded above (no query of its own).
    context["timeline_svg"] = insight_timeline.of_run(events)
    context["workflow_svg"] = insight_timeline.of_workflow(context.get("workflow_steps") or [])
    return TemplateResponse(request, model_admin.detail_template, context)


def _conversation_context(model_admin: AgentRunAdmin, request: HttpRequest, run: AgentRun) -> dict[str, Any]:
    """The run's conversation (the runs before and after it), each linked to its admin page."""
    visible = model_admin.get_queryset(request)

    def url(other: AgentRun) -> str:
        return reverse("admin:nexo_django_agentrun_change", args=[other.pk])

    context: dict[str, Any] = {"conversation": conversation_entries(run, visible, url)}
    for side, other in neighbours(run, visible).items():
        context[side] = other
        context[f"{side}_url"] = url(other) if other is not None else None
    return context


def _call_row(model_admin: AgentRunAdmin, call: ToolCall, args: Stored, result: Stored, run: AgentRun) -> dict[str, Any]:
    decision = getattr(call, "decision", None)
    expired = outcomes.is_expired(call)
    # The outcome reads the row's result; the page loaded it by size (a big one: its error unread).
    value = result.value if not result.big else None
    happened = outcomes.of(status=call.status, result=value, verdict=decision.verdict if decision else None,
                           source=decision.source if decision else "", stop=bool(decision and decision.stop),
                           run_status=run.status)
    return {
        "pk": call.pk,
        "id": reveal(call.tool_call_id),
        "name": reveal(call.name),
        "capability": call.capability,
        "status": call.status,
        "pending": call.status == CallStatus.PENDING_APPROVAL and not expired,
        "expired": expired and decision is None,
        "outcome": happened.text,
        "outcome_kind": happened.kind,
        "unknown": call.status == CallStatus.OUTCOME_UNKNOWN,
        "decide_url": model_admin.call_url(call.pk),
        "arguments_url": model_admin.run_call_arguments_url(call.run_id, call.pk),
        # Each call's cell is bounded; the full arguments are a download away.
        "args": cell_shown(args),
        "result": cell_shown(result) if result.big or result.value is not None else None,
        "decision": None if decision is None else {
            "verdict": decision.verdict,
            "by": str(decision.decided_by) if decision.decided_by_id else "system",
            "at": decision.decided_at,
            "note": reveal(decision.note),
            "edited": bounded_json(decision.args, budget=CALL_CELL_BYTES, string_chars=2_000).html
            if decision.args is not None else None,
            "stop": decision.stop,
            "source": decision.source,
            "digest": decision.digest,
            "rule_said": rule_history.describe(decision.rule_said),
        },
    }


def _run_action(model_admin: AgentRunAdmin, request: HttpRequest, run: AgentRun) -> HttpResponse:
    action = request.POST.get("action")
    here = model_admin.run_url(run.pk)
    if action not in RUN_ACTIONS:
        messages.error(request, "Unknown action; nothing changed.")
        return HttpResponseRedirect(here)
    try:
        if action == "cancel":
            if not runs.cancel_run(run, by=request.user, reason=f"cancelled in the admin by {request.user}"):
                raise TransitionError(f"run {str(run.pk)[:8]} is {run.status} and cannot be cancelled")
        elif action == "retry":
            if not runs.retry_run(run, by=request.user):
                raise TransitionError(f"run {str(run.pk)[:8]} is {run.status}, not needs_attention or failed")
        else:
            call = ToolCall.objects.filter(run=run, pk=request.POST.get("call") or 0).first()
            if call is None:
                raise TransitionError("that call is not part of this run")
            # Settle and continue together: if the run cannot continue, the settlement is undone too.
            with transaction.atomic():
                runs.resolve_unknown(call, by=request.user, rerun=action == "rerun", note=request.POST.get("note", "")[:2000])
                # Once a person settled every unknown outcome, the run continues.
                if not ToolCall.objects.filter(run=run, status=CallStatus.OUTCOME_UNKNOWN).exists():
                    runs.retry_run(run, by=request.user)
    except (TransitionError, ValueError) as exc:
        messages.error(request, f"Nothing changed: {mark_hidden(exc)}")
        return HttpResponseRedirect(here)
    messages.success(request, where_it_went(model_admin, [run.pk]))
    return HttpResponseRedirect(here)


def bulk_cancel(model_admin: AgentRunAdmin, request: HttpRequest, queryset: QuerySet[AgentRun]) -> None:
    if not model_admin.has_decide_permission(request):
        raise PermissionDenied
    cancelled = [run.pk for run in queryset if runs.cancel_run(run, by=request.user, reason=f"cancelled in the admin by {request.user}")]
    messages.success(request, f"Cancelled {len(cancelled)} run(s).")
