"""The person's side of workflows: the questions of the approval inbox, answered with a form built
from each question's JSON Schema, and a workflow run's steps on its admin page.

Answers go through :func:`nexo_django.durable.workflow_questions.answer` only (the decide permission,
four eyes, the schema, once); posted with CSRF, checked in the view.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.forms.fields import InvalidJSONInput
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
)
from django.http.response import HttpResponseBase
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timesince import timesince
from django.views.decorators.clickjacking import xframe_options_deny

from .. import schema_forms
from ..bounded import bounded_json, bounded_text
from ..core.errors import AlreadyDecided, InvalidAnswer, WorkflowError
from ..display import mark_hidden
from ..durable import workflow_questions, workflow_runs
from ..jsonbody import BadJSON, read_json
from ..models import AgentRun, OpenQuestion, RunKind, StepKind, StepStatus, WorkflowStep
from . import audit
from .base import NexoModelAdmin

#: characters of a checkpoint's result shown on a run's page
STEP_RESULT_BUDGET = 4_000


def answer_field(schema: Any) -> forms.Field:
    """The form field of a question whose answer is one value (:mod:`nexo_django.schema_forms`),
    or the JSON box for a schema the form cannot express (or no schema)."""
    form = schema_forms.build(schema)
    if form is not None and form.single:
        return schema_forms.django_fields(form)["answer"]
    help_text = schema.get("description", "") if isinstance(schema, dict) else ""
    return BoundedJSONField(widget=forms.Textarea(attrs={"rows": 6, "cols": 60}), help_text=help_text or "JSON")


class BoundedJSONField(forms.JSONField):
    """A JSON text area read by the one JSON reader (:mod:`nexo_django.jsonbody`): its size and
    nesting bounded before it is parsed. Django's own ``json.loads`` raised ``RecursionError`` (a
    500) on an answer nested 100,000 deep; here the form says why."""

    what = "the answer"

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and value.strip() and not self.disabled:
            try:
                read_json(value, what=self.what)
            except BadJSON as exc:
                raise ValidationError(str(exc), code="invalid") from None
        return super().to_python(value)

    def bound_data(self, data: Any, initial: Any) -> Any:
        # The form shown again with its error parses what was sent once more: bounded too.
        if isinstance(data, str) and not self.disabled:
            try:
                read_json(data, what=self.what)
            except BadJSON:
                return InvalidJSONInput(data)
        return super().bound_data(data, initial)


class AnswerForm(forms.Form):
    """The answer's form, built from the question's schema (:mod:`nexo_django.schema_forms`): a
    field per property of a flat object, one field for one value, the JSON box otherwise. Its
    ``cleaned_data["answer"]`` is the answer."""

    def __init__(self, *args: Any, schema: Any = None, order: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.schema_form = schema_forms.build(schema, order=order)
        if self.schema_form is None or self.schema_form.single:
            self.fields["answer"] = answer_field(schema)
        else:
            self.fields.update(schema_forms.django_fields(self.schema_form))

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.schema_form is not None and not self.errors:
            cleaned["answer"] = schema_forms.from_django(self.schema_form, cleaned)
        return cleaned


@admin.register(OpenQuestion)
class OpenQuestionAdmin(NexoModelAdmin):
    """Workflows' questions waiting for a person, beside the pending calls of the inbox."""

    list_display = ("asked", "question_text", "workflow_column", "run_column", "deadline")
    list_display_links = ("asked", "question_text")
    search_fields = ("run__id", "name")
    ordering = ("created_at", "id")
    list_select_related = ("run", "run__created_by")
    answer_template = "admin/nexo_django/openquestion/answer.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[OpenQuestion]:
        return super().get_queryset(request).filter(kind=StepKind.QUESTION, status=StepStatus.WAITING)

    def get_answer_form(self, request: HttpRequest, step: WorkflowStep, data: Any = None) -> AnswerForm:
        return AnswerForm(data, schema=step.schema, order=step.field_order)

    @admin.display(description="asked", ordering="created_at")
    def asked(self, obj: WorkflowStep) -> str:
        return f"{timesince(obj.created_at)} ago"

    @admin.display(description="question")
    def question_text(self, obj: WorkflowStep) -> SafeString:
        return format_html("<strong>{}</strong><br><small>{}</small>", mark_hidden(obj.name),
                           bounded_text(obj.question, budget=1000, chars=300).html)

    @admin.display(description="workflow", ordering="workflow")
    def workflow_column(self, obj: WorkflowStep) -> str:
        return obj.workflow.rsplit(".", 1)[-1]

    @admin.display(description="run")
    def run_column(self, obj: WorkflowStep) -> SafeString:
        return self.run_link(obj.run_id)

    @admin.display(description="deadline", ordering="expires_at")
    def deadline(self, obj: WorkflowStep) -> str:
        return str(obj.expires_at) if obj.expires_at else "none"

    @method_decorator(xframe_options_deny)
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method == "POST":
            raise PermissionDenied  # no bulk answers: each answer is its own form
        response = super().changelist_view(request, {"title": "Questions from workflows", **(extra_context or {})})
        if request.method == "GET":
            export = reverse(f"{self.admin_site.name}:nexo_django_openquestion_export", args=["csv"])
            messages.info(request, format_html(
                'Every question asked, with its answer and who gave it: <a href="{}" id="answers-csv">CSV</a> · '
                '<a href="{}" id="answers-json">JSON</a>.', export, export.replace("/csv/", "/json/")))
        return response

    @method_decorator(xframe_options_deny)
    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return answer_view(self, request, object_id)

    def export_view(self, request: HttpRequest, fmt: str) -> HttpResponseBase:
        return answers_export_view(self, request, fmt)

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("export/<str:fmt>/", wrap(self.export_view), name="nexo_django_openquestion_export"),
            *super().get_urls(),
        ]


def answer_view(model_admin: OpenQuestionAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD, POST"})
    if not model_admin.has_view_permission(request) or (
        request.method == "POST" and not model_admin.has_decide_permission(request)
    ):
        raise PermissionDenied
    try:
        step = WorkflowStep.objects.select_related("run", "run__created_by", "answered_by").filter(
            pk=int(object_id), kind=StepKind.QUESTION).first()
    except (ValueError, ValidationError):
        step = None
    if step is None:
        raise Http404("No such question.")
    # An MCP server's ask (durable.elicitation): a form, or (url mode) a link; declined or cancelled too.
    server_ask = step.request if isinstance(step.request, dict) else None
    action = str(request.POST.get("action") or "accept") if request.method == "POST" else "accept"
    data = request.POST if request.method == "POST" and action == "accept" else None
    form: forms.Form = (forms.Form(data) if server_ask and server_ask.get("mode") == "url"
                        else model_admin.get_answer_form(request, step, data))
    if request.method == "POST" and (action != "accept" or form.is_valid()):
        value = form.cleaned_data.get("answer") if action == "accept" else None
        try:
            workflow_questions.answer(step.run, step.name, value, by=request.user, source="admin", action=action)
        except (InvalidAnswer, WorkflowError) as exc:
            form.add_error("answer" if "answer" in form.fields else None, str(exc))
        except AlreadyDecided as exc:
            messages.error(request, str(exc))
            return HttpResponseRedirect(request.path)
        except PermissionDenied as exc:
            messages.error(request, str(exc) or "You may not answer this question.")
            return HttpResponseRedirect(request.path)
        else:
            messages.success(request, format_html("Answered {}: the workflow {} goes on.", mark_hidden(step.name),
                                                  model_admin.run_link(step.run_id)))
            return HttpResponseRedirect(reverse(f"{model_admin.admin_site.name}:nexo_django_openquestion_changelist"))
    request.current_app = model_admin.admin_site.name
    opts = model_admin.model._meta
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"Question {step.name}",
        "opts": opts,
        "app_label": opts.app_label,
        "original": step,
        "step": step,
        "key": mark_hidden(step.name),
        "question_html": bounded_text(step.question).html,
        "schema_html": bounded_json(step.schema, budget=STEP_RESULT_BUDGET).html if step.schema is not None else None,
        "run_link": model_admin.run_link(step.run_id),
        "workflow": step.run.agent,
        "started_by": str(step.run.created_by) if step.run.created_by_id else "—",
        "form": form,
        "open": step.status == StepStatus.WAITING,
        "can_decide": model_admin.has_decide_permission(request, step),
        "server_ask": server_ask,
    }
    return TemplateResponse(request, model_admin.answer_template, context)


def workflow_context(model_admin: Any, run: AgentRun) -> dict[str, Any]:
    """For a workflow run's admin page: its steps in order (checkpoint results bounded, agent runs
    linked, questions and who answered). Nothing for an agent run."""
    if run.kind != RunKind.WORKFLOW:
        return {"parent_link": model_admin.run_link(run.parent_id) if run.parent_id else None}
    rows = []
    for step in workflow_runs.steps_of(run):
        rows.append({
            "seq": step.seq + 1,
            "name": mark_hidden(step.name),
            "kind": step.kind,
            "status": step.status,
            "result": bounded_json(step.result, budget=STEP_RESULT_BUDGET, string_chars=1000).html
            if step.result is not None else None,
            "child": model_admin.run_link(step.child_run_id) if step.child_run_id else None,
            "question": bounded_text(step.question, budget=4000, chars=1000).html if step.kind == StepKind.QUESTION else None,
            "answered_by": str(step.answered_by) if step.answered_by_id else None,
            "answered_at": step.answered_at,
            "expires_at": step.expires_at,
            "created_at": step.created_at,
            "updated_at": step.updated_at,
        })
    return {"workflow_steps": rows, "is_workflow": True}


def open_questions_count() -> int:
    return workflow_questions.open_questions().count()


def announce_questions(model_admin: Any, request: HttpRequest) -> None:
    """Above the inbox of calls: how many workflow questions wait, and where to answer them."""
    waiting = open_questions_count()
    if waiting:
        url = reverse(f"{model_admin.admin_site.name}:nexo_django_openquestion_changelist")
        messages.info(request, format_html(
            '{} question{} from workflows wait{} for an answer: <a href="{}" id="open-questions">answer them</a>.',
            waiting, "s" if waiting != 1 else "", "" if waiting != 1 else "s", url,
        ))


# --- the answers log, downloadable ---------------------------------------------------------------

#: the columns of the answers log (every question asked: answered, ended unanswered, waiting)
ANSWER_COLUMNS = ("asked_at", "run", "workflow", "key", "question", "status", "answer", "answered_by",
                  "answered_at", "expires_at", "source", "channel_user")


def answer_row(step: WorkflowStep) -> dict[str, Any]:
    return {
        "asked_at": step.created_at.isoformat(),
        "run": str(step.run_id),
        "workflow": step.workflow,
        "key": step.name,
        "question": step.question,
        "status": step.status,
        "answer": step.result if step.status == StepStatus.ANSWERED else None,
        "answered_by": str(step.answered_by) if step.answered_by_id else "",
        "answered_at": step.answered_at.isoformat() if step.answered_at else None,
        "expires_at": step.expires_at.isoformat() if step.expires_at else None,
        "source": step.answer_source,
        "channel_user": step.channel_user,
    }


def answers_export_view(model_admin: Any, request: HttpRequest, fmt: str) -> HttpResponseBase:
    """Every question of every workflow, oldest first, with its answer and who gave it (or that it
    ended unanswered), as CSV or JSON, streamed; cells a spreadsheet would run as a formula are
    prefixed with ``'`` (as the decision log's export does)."""
    if (refused := audit.refuse_export(model_admin, request, fmt)) is not None:
        return refused
    steps = (WorkflowStep.objects.filter(kind=StepKind.QUESTION).select_related("answered_by")
             .order_by("created_at", "id").iterator(chunk_size=audit.CHUNK))
    return audit.export_response((answer_row(step) for step in steps), ANSWER_COLUMNS, fmt, "answers")
