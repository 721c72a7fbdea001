"""The webhook channel: each notice POSTed as a signed JSON event to one URL.

``NEXO["CHANNELS"]["audit"] = {"BACKEND": "webhook", "URL": "https://hooks.example.com/nexo",
"SECRET": "...", "INCLUDE_ARGS": False, "ALLOW_PRIVATE": []}``. The body::

    {"type": "approval.requested", "id": "<the idempotency key>", "created": "<ISO 8601>",
     "run": {"id", "agent", "status", "admin_url", "page_url"},
     "call": {"id", "tool_call_id", "name", "capability", "digest", "status", "expires_at",
              "admin_url"[, "policy"][, "args"]},
     "decision": {"verdict", "source", "decided_by", "channel_user", "decided_at", "note"},
     "question": {...}}

``call`` is there for the ``approval.*`` types, ``decision`` once there is one; the arguments only
with ``INCLUDE_ARGS``. The ``question.*`` types (a workflow's question asked, answered, expired)
carry ``"question": {"id", "key", "question", "schema", "status", "expires_at", "answered_by",
"answered_at", "source", "channel_user", "mcp", "admin_url", "answer_url"}`` instead (``answer_url``: the JSON endpoint that takes
``{"answer": ...}`` with a session; ``id``: the question's, for the signed answer below). Headers: ``X-Nexo-Signature: t=<unix>,v1=<HMAC-SHA256(SECRET, t + "." +
body)>`` (:func:`nexo_django.channels.signing.verify_signature` checks it), ``Idempotency-Key`` and
``X-Nexo-Event`` (the type). A 2xx answer delivers it; anything else is tried again (``Retry-After``
honoured), with the same key.

With ``"DECIDE": True`` the channel also takes decisions: a POST to its endpoint
(``nexo_django.channel_urls``) signed the same way with the same ``SECRET``, verified (signature,
five-minute window, replay) before its body is read, decided through the admin's checks
(:meth:`WebhookChannel.decide`); a body with ``"question"`` answers a workflow's question the same
way (:meth:`WebhookChannel.answer`, through the one answering function).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.utils.module_loading import import_string

from ..core.errors import (
    AlreadyDecided,
    ApprovalExpired,
    ApprovalRefused,
    InvalidAnswer,
    StaleDecision,
    WorkflowError,
)
from ..durable import refusals, schedule_notices
from ..durable.outbox import DeliveryFailed, Refused
from ..durable.policy import check as policy_check
from ..durable.policy import reviewer
from ..jsonbody import read_json
from ..models import AgentRun, CallStatus, Notice, StepKind, ToolCall, WorkflowStep
from .base import Channel, admin_url, question_of, question_urls, run_urls, subject
from .signing import SignatureError, sign, verify_signature


def retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None


def describe_call(call: ToolCall, *, args: bool) -> dict[str, Any]:
    found: dict[str, Any] = {
        "id": call.pk, "tool_call_id": call.tool_call_id, "name": call.name, "capability": call.capability,
        "digest": call.digest, "status": call.status,
        "expires_at": call.expires_at.isoformat() if call.expires_at else None, "admin_url": admin_url(call),
    }
    if call.name == "write" and call.capability == "write":
        # The version of the file the notice shows the write against: what an approval binds.
        found["file_version"] = call.suspension_version
    if call.status == CallStatus.FAILED and (refused := refusals.refused(call)):
        found["refused"] = refused  # the sandbox refused it at decision time: its run failed
    if (policy := policy_check.payload(call, timezone.now())) is not None:
        found["policy"] = policy  # the approval policy that routes it: groups, quorum, approvals so far
    if args:
        found["args"] = call.args
    return found


def describe_decision(call: ToolCall) -> dict[str, Any] | None:
    decision = getattr(call, "decision", None)
    if decision is None:
        return None
    return {"verdict": decision.verdict, "source": decision.source, "decided_by": str(decision.decided_by or ""),
            "channel_user": decision.channel_user, "decided_at": decision.decided_at.isoformat(), "note": decision.note}


def describe_question(step: WorkflowStep) -> dict[str, Any]:
    return {
        "id": step.pk, "key": step.name, "question": step.question, "schema": step.schema, "status": step.status,
        "expires_at": step.expires_at.isoformat() if step.expires_at else None,
        "answered_by": str(step.answered_by) if step.answered_by_id else None,
        "answered_at": step.answered_at.isoformat() if step.answered_at and step.status == "answered" else None,
        "source": step.answer_source or None, "channel_user": step.channel_user or None,
        # An MCP server's ask (durable.elicitation): its tool, mode, the link of a url-mode ask, the
        # round; never its requestState (the server's own).
        "mcp": {k: step.request.get(k) for k in ("tool", "mode", "url", "round")} if isinstance(step.request, dict) else None,
        **question_urls(step),
    }


def event(notice: Notice, run: AgentRun | None, call: ToolCall | None, *, args: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"type": notice.kind, "id": notice.key, "created": notice.created_at.isoformat()}
    if run is not None:
        body["run"] = {"id": str(run.pk), "agent": run.agent, "status": run.status, **run_urls(run)}
    step = question_of(notice)
    if step is not None:
        body["question"] = describe_question(step)
    if notice.kind == schedule_notices.KIND:
        body["schedule"] = schedule_notices.describe(notice)
    if call is not None:
        body["call"] = describe_call(call, args=args)
        decision = describe_decision(call)
        if decision is not None:
            body["decision"] = decision
    return body


class WebhookChannel(Channel):
    defaults = {"URL": "", "SECRET": "", "INCLUDE_ARGS": False, "ALLOW_PRIVATE": [], "TIMEOUT": 10,
                "DECIDE": False, "GET_USER": None}
    required = ("URL", "SECRET")

    @classmethod
    def check(cls, name: str, options: dict[str, Any]) -> list[str]:
        problems = super().check(name, options)
        url = str(options.get("URL") or "")
        if url and not url.startswith(("https://", "http://")):
            problems.append(f"URL {url!r} must be an http(s) URL")
        return problems

    def send(self, notice: Notice) -> dict[str, Any] | None:
        run, call = subject(notice)
        if notice.kind == "approval.requested" and call is not None and not reviewer.before_notice(call):
            raise DeliveryFailed("the reviewer agent is still reviewing the call", retry_after=2)
        body = json.dumps(event(notice, run, call, args=bool(self.options["INCLUDE_ARGS"])),
                          ensure_ascii=False, default=str, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": notice.key, "X-Nexo-Event": notice.kind,
                   "X-Nexo-Signature": sign(self.options["SECRET"], body), "User-Agent": "nexo-django"}
        url = str(self.options["URL"])
        client = self.client(url, float(self.options["TIMEOUT"]))
        try:
            response = client.post(url, content=body, headers=headers)
        except Exception as exc:  # a connection refused, a timeout, the guard's refusal: it says why
            raise DeliveryFailed(f"POST {url}: {type(exc).__name__}: {exc}") from exc
        if not 200 <= response.status_code < 300:
            raise DeliveryFailed(f"POST {url}: HTTP {response.status_code}", retry_after=retry_after(response))
        return {"status": response.status_code}

    # --- deciding from a signed request (only with "DECIDE": True) ---------------------------

    def verify(self, request: HttpRequest) -> None:
        if not self.options["DECIDE"]:
            raise Refused(f"channel {self.name!r} takes no decisions (its DECIDE option is off)")
        try:
            t = verify_signature(self.options["SECRET"], request.headers.get("X-Nexo-Signature"), request.body)
        except SignatureError as exc:
            raise Refused(str(exc)) from None
        # Remembered as the one header the app would write for this body and time, not as sent:
        # the same signature spelled another way (spaces, order, another v1, "t=0...") verifies
        # too, and was taken again as a new request.
        self.remember(sign(self.options["SECRET"], request.body, t))

    def get_user(self, body: dict[str, Any]) -> Any:
        """The Django user the sending system says decided (``body["user"]``), or None. By default
        the active user with that username; name a ``callable(channel, body)`` in ``GET_USER`` (or
        override this) to map your systems' ids. The signature proves the system, which vouches
        for the person: give ``DECIDE`` only to a system that authenticates its users."""
        hook = self.options.get("GET_USER")
        if hook:
            return import_string(hook)(self, body)
        model = get_user_model()
        return model._default_manager.filter(**{model.USERNAME_FIELD: body["user"], "is_active": True}).first()

    def decide(self, request: HttpRequest) -> HttpResponse:
        """``{"call": <id>, "digest": "...", "verdict": "approve" | "deny", "user": "...", "note": ""}``:
        200 with the decision (with ``"refused": true`` and the ``"error"`` when the sandbox refused
        the approved call's target now: the call and its run failed); 400 a malformed body; 403 a person who may not decide; 404 no such
        call; 409 already decided, expired, or a stale digest (nothing recorded then)."""
        try:
            body = read_json(request.body)
        except ValueError:
            body = None
        if isinstance(body, dict) and "question" in body:
            return self.answer(body)
        try:
            if not isinstance(body, dict):
                raise ValueError("not an object")
            call_pk, digest, person = int(body["call"]), str(body["digest"]), str(body["user"])
            note = str(body.get("note", ""))[:2000]
            if body["verdict"] not in ("approve", "deny"):
                raise ValueError(body["verdict"])
            if "\x00" in digest or "\x00" in person:
                # PostgreSQL's text holds no NUL: refused here, not as a raw error from a query.
                raise ValueError("a NUL character")
        except (ValueError, KeyError, TypeError):
            return JsonResponse({"error": 'give {"call", "digest", "verdict": "approve" | "deny", "user"}'},
                                status=400)
        call = ToolCall.objects.filter(pk=call_pk).select_related("run").first()
        if call is None:
            return JsonResponse({"error": "no such call"}, status=404)
        try:
            decision = self.decide_call(call, approved=body["verdict"] == "approve", user=self.get_user(body),
                                        digest=digest, channel_user=f"webhook:{person}"[:255], note=note)
        except PermissionDenied as exc:
            return JsonResponse({"error": str(exc) or "may not decide"}, status=403)
        except (AlreadyDecided, ApprovalExpired, ApprovalRefused, StaleDecision) as exc:
            return JsonResponse({"error": str(exc)}, status=409)
        if refused := refusals.refused(call):
            # Recorded: the approval, and the call and its run failed (durable.refusals).
            return JsonResponse({"verdict": decision.verdict, "source": decision.source, "call": call.pk,
                                 "refused": True, "error": refused, "run_status": "failed"})
        return JsonResponse({"verdict": decision.verdict, "source": decision.source, "call": call.pk})

    def answer(self, body: dict[str, Any]) -> HttpResponse:
        """``{"question": <its id>, "answer": <JSON>, "user": "..."}`` (the ``question.id`` of a
        ``question.*`` event): 200 with who answered; 400 a malformed body or an answer the schema
        refuses (``error`` says why); 403 a person who may not answer; 404 no such question; 409
        answered already (by whom) or ended. Nothing is recorded but a 200's answer."""
        usage = 'give {"question": <its id>, "answer": <JSON>, "user": "..."} (or "action": "decline" | "cancel")'
        try:
            step_pk, person = body["question"], str(body["user"])
            if type(step_pk) is not int or set(body) - {"question", "answer", "user", "action"} or not (
                    "answer" in body or "action" in body) or not isinstance(body.get("action", ""), str):
                raise ValueError(usage)
            if "\x00" in person:
                raise ValueError("a NUL character")  # PostgreSQL's text holds none: refused here
        except (ValueError, KeyError, TypeError):
            return JsonResponse({"error": usage}, status=400)
        step = WorkflowStep.objects.filter(pk=step_pk, kind=StepKind.QUESTION).select_related("run").first()
        if step is None:
            return JsonResponse({"error": "no such question"}, status=404)
        try:
            answered = self.answer_question(step, body.get("answer"), user=self.get_user(body),
                                            channel_user=f"webhook:{person}", action=body.get("action") or "accept")
        except PermissionDenied as exc:
            return JsonResponse({"error": str(exc) or "may not answer"}, status=403)
        except AlreadyDecided as exc:  # ApprovalExpired too
            return JsonResponse({"error": str(exc), "expired": isinstance(exc, ApprovalExpired)}, status=409)
        except InvalidAnswer as exc:
            return JsonResponse({"error": str(exc)}, status=400)
        except WorkflowError as exc:
            return JsonResponse({"error": str(exc)}, status=404)
        return JsonResponse({"question": step.pk, "key": answered.name, "status": answered.status,
                             "answered_by": str(answered.answered_by), "source": answered.answer_source})
