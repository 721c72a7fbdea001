"""The full arguments of a call, on demand: a JSON download, never a rendered page, so any size
is safe to send. Whoever may see the call's page may download them; nothing here decides."""

from __future__ import annotations

import json

from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse

from ..models import ToolCall
from .base import NexoModelAdmin
from .views import AgentRunAdmin, PendingApprovalAdmin, _find_call, _refuse


def arguments_response(model_admin: NexoModelAdmin, request: HttpRequest, call: ToolCall | None) -> HttpResponse:
    """The full stored arguments of one call, as a JSON download: never rendered as a page, so
    any size is safe to send; who may see the call's page may download them."""
    if call is None:
        raise Http404("No such call, or it is not yours to see.")
    body = json.dumps(call.args, ensure_ascii=False, indent=2, default=str).encode("utf-8", errors="surrogatepass")
    response = HttpResponse(body, content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="call-{call.pk}-arguments.json"'
    response["X-Content-Type-Options"] = "nosniff"
    response["X-Nexo-Digest"] = call.digest
    return response


def pending_arguments_view(model_admin: PendingApprovalAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
    refused = _refuse(model_admin, request)
    if refused is not None:
        return refused
    return arguments_response(model_admin, request, _find_call(model_admin, request, object_id))


def run_call_arguments_view(model_admin: AgentRunAdmin, request: HttpRequest, object_id: str, call_id: str) -> HttpResponse:
    """The full arguments of one call of a run the user may see, as a download."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
    refused = _refuse(model_admin, request)
    if refused is not None:
        return refused
    try:
        run = model_admin.get_queryset(request).filter(pk=object_id).first()
        call = ToolCall.objects.filter(run=run, pk=int(call_id)).first() if run is not None else None
    except (ValueError, ValidationError):
        call = None
    return arguments_response(model_admin, request, call)
