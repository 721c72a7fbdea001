"""The ``Channel`` base: how a chat tool, a webhook or anything else takes part in approvals.

A channel does three things (docs/channels.md shows the Slack channel as the worked example):

- :meth:`Channel.send` delivers one notice of the outbox (a call waits, was decided, expired; a
  run ended). It returns what later notices need (a message id), raises
  :class:`~nexo_django.durable.outbox.DeliveryFailed` to be tried again later, or
  :class:`~nexo_django.durable.outbox.NothingToSay` when there is nothing to deliver.
- :meth:`Channel.verify` checks a request from outside (signature over the raw body, timestamp
  window, replay) **before anything of it is read**; :class:`Refused` otherwise.
- :meth:`Channel.decide` reads the verified request and decides through :meth:`decide_call`: the
  same path as the admin (the decide permission, four eyes, the digest the person saw, expiry,
  exactly once), recorded with ``Decision.source`` = the channel's name and
  ``Decision.channel_user`` = who clicked, in the channel's own terms.
"""

from __future__ import annotations

import hashlib
import threading
import time
from datetime import timedelta
from typing import Any

import httpx
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from ..conf import nexo_settings
from ..core.tools import netguard
from ..durable import runs, workflow_questions
from ..durable.outbox import Refused
from ..models import (
    DECISION_SOURCES,
    AgentRun,
    ChannelRequest,
    Decision,
    Notice,
    ToolCall,
    WorkflowStep,
)

__all__ = ["Channel", "Refused"]

#: accepted requests are remembered this long to refuse a replay (past it, the timestamp is)
REMEMBER = timedelta(minutes=10)
#: decision sources the app uses itself: a channel may not take one of these names
RESERVED_SOURCES = frozenset({*DECISION_SOURCES, "bulk", "email"})


class Channel:
    """Subclass it, name the subclass in ``NEXO["CHANNELS"][name]["BACKEND"]`` (a dotted path)."""

    #: options the channel takes beyond the common ones, with their defaults
    defaults: dict[str, Any] = {}
    #: options that must be given (a system check names any that is missing)
    required: tuple[str, ...] = ()

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        self.name = name
        self.options = {**self.defaults, **options}
        self._local = threading.local()

    # --- the three parts -----------------------------------------------------------------

    def send(self, notice: Notice) -> dict[str, Any] | None:
        raise NotImplementedError(f"{type(self).__name__} sends nothing")

    def verify(self, request: HttpRequest) -> None:
        raise Refused(f"channel {self.name!r} takes no requests")

    def decide(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(status=404)

    # --- helpers for subclasses ----------------------------------------------------------

    @classmethod
    def check(cls, name: str, options: dict[str, Any]) -> list[str]:
        """What is wrong with ``options`` (the system checks report each with the channel's name)."""
        return [f"{key} is required" for key in cls.required if not options.get(key)]

    def remember(self, signature: str) -> None:
        """Refuse (:class:`Refused`) a request whose signature was accepted before: a replay."""
        now = timezone.now()
        digest = hashlib.sha256(f"{self.name}\0{signature}".encode()).hexdigest()
        ChannelRequest.objects.filter(received_at__lt=now - REMEMBER).delete()
        try:
            with transaction.atomic():
                ChannelRequest.objects.create(channel=self.name, signature=digest, received_at=now)
        except IntegrityError:
            raise Refused("this request was received before (a replay)") from None

    def decide_call(
        self, call: ToolCall, *, approved: bool, user: Any, digest: str, channel_user: str, note: str = "",
    ) -> Decision:
        """Decide ``call`` as ``user`` through the admin's path; ``PermissionDenied`` when the
        user may not, and what :func:`nexo_django.durable.runs.decide` raises otherwise (already
        decided, stale digest, expired): nothing is recorded then."""
        if user is None or not getattr(user, "is_active", False):
            raise PermissionDenied("this person has no active account here")
        if not user.has_perm("nexo_django.decide_toolcall"):
            raise PermissionDenied(f"{user} may not decide calls (needs nexo_django.decide_toolcall)")
        with transaction.atomic():
            decision = runs.decide(call, approved=approved, by=user, digest=digest, note=note, source=self.name)
            # A Decision, or one Approval of several a policy needs (durable.policy.quorum).
            type(decision).objects.filter(pk=decision.pk).update(channel_user=channel_user[:255])
            decision.channel_user = channel_user[:255]
        return decision

    def answer_question(self, step: WorkflowStep, value: Any, *, user: Any, channel_user: str,
                        action: str = "accept") -> WorkflowStep:
        """Answer ``step`` as ``user`` through the one answering path
        (:func:`nexo_django.durable.workflow_questions.answer`: the decide permission, four eyes,
        expiry, the schema, once), recorded with ``answer_source`` = the channel's name and
        ``channel_user`` = who, in the channel's own terms. Raises what it raises (nothing is
        recorded then)."""
        if user is None or not getattr(user, "is_active", False):
            raise PermissionDenied("this person has no active account here")
        return workflow_questions.answer(step.run, step.name, value, by=user, source=self.name,
                                         channel_user=channel_user[:255], action=action)

    def client(self, url: str, timeout: float) -> httpx.Client:
        """An httpx client for ``url``'s host with the fetch guard's connect-time rules: every
        address the host resolves to must be public, unless the channel's ``ALLOW_PRIVATE`` names
        this host (tests on loopback do); no proxy from the environment; ``timeout`` seconds in
        all from now. Kept per thread and host (connections are reused; every new one is checked
        again): use it, do not close it."""
        host = netguard.canonical_host(httpx.URL(url).host)
        clients: dict[str, tuple[netguard.Guard, httpx.Client]] = self._local.__dict__.setdefault("clients", {})
        found = clients.get(host)
        if found is None:
            allow_private = host in {netguard.canonical_host(h) for h in self.options.get("ALLOW_PRIVATE") or ()}
            guard = netguard.Guard(
                netguard.AllowList.parse([host]), allow_private=allow_private, resolve=netguard.resolver,
                deadline=time.monotonic() + timeout, timeout=timeout,
                private_hint=f'add {host!r} to NEXO["CHANNELS"][{self.name!r}]["ALLOW_PRIVATE"] to reach it',
            )
            client = httpx.Client(transport=netguard.GuardedTransport(guard), timeout=timeout, trust_env=False,
                                  follow_redirects=False)
            found = clients[host] = (guard, client)
        guard, client = found
        guard.deadline = time.monotonic() + timeout
        guard.connected.clear()
        return client


# --- what a notice is about --------------------------------------------------------------------


def subject(notice: Notice) -> tuple[AgentRun | None, ToolCall | None]:
    run = AgentRun.objects.filter(pk=notice.run_id).first() if notice.run_id else None
    call = None
    if run is not None and notice.tool_call_id:
        call = ToolCall.objects.filter(run_id=run.pk, tool_call_id=notice.tool_call_id).select_related("decision").first()
    return run, call


def question_of(notice: Notice) -> WorkflowStep | None:
    """The workflow question a ``question.*`` notice is about (None for other notices)."""
    return workflow_questions.step_of(notice) if notice.kind.startswith("question.") else None


def question_urls(step: WorkflowStep) -> dict[str, str | None]:
    """Where a person answers ``step``: its admin page, and the JSON endpoint a front end posts to."""
    return {"admin_url": absolute("admin:nexo_django_openquestion_change", step.pk),
            "answer_url": absolute("nexo_django:question_answer", step.run_id, step.name)}


def site_url() -> str:
    notify = nexo_settings.NOTIFY if isinstance(nexo_settings.NOTIFY, dict) else {}
    return str(notify.get("SITE_URL") or "").rstrip("/")


def absolute(name: str, *args: Any) -> str | None:
    try:
        return site_url() + reverse(name, args=args)
    except NoReverseMatch:
        return None


def admin_url(call: ToolCall) -> str | None:
    return absolute("admin:nexo_django_pendingapproval_change", call.pk)


def run_urls(run: AgentRun) -> dict[str, str | None]:
    return {"admin_url": absolute("admin:nexo_django_agentrun_change", run.pk),
            "page_url": absolute("nexo_django:run_detail", run.pk)}
