"""The Slack channel: a Block Kit message per waiting call, Approve / Deny buttons, and the
interactivity endpoint that decides from them.

``NEXO["CHANNELS"]["ops"] = {"BACKEND": "slack", "TOKEN": "xoxb-...", "SIGNING_SECRET": "...",
"CHANNEL": "C0123456789"}``; Slack's Request URL for interactivity is the ``channel_endpoint`` URL of
``nexo_django.channel_urls`` with the channel's name (``/nexo/channels/ops/``).

Sending (the outbox): ``chat.postMessage`` for a request (the call's target, a bounded view of its
arguments as plain text, the deadline, links to the run and the decision page, two buttons whose
value binds the call's id and digest), a threaded reply for a reminder, and ``chat.update`` of that
message when the call is decided or expires and when its run ends (who decided what, through
which channel, and the outcome once the call ran). A workflow's question (``question.asked``) is
a message of its own with the question, a link to the admin, and buttons that answer it (a choice,
or a modal built from its schema: :mod:`.slack_questions`), updated when it is answered or expires. Slack's ``ok``/``error`` and a 429's
``Retry-After`` are honoured. Web API calls go over httpx with the fetch guard's connect-time
rules (``BASE_URL`` must resolve to public addresses unless its host is in ``ALLOW_PRIVATE``).

Receiving: :meth:`SlackChannel.verify` checks Slack's signing secret (``v0`` HMAC over
``v0:timestamp:body``, five minutes either way) and refuses a request seen before, before a byte of
the body is parsed; :meth:`SlackChannel.decide` maps the Slack user to a Django user
(:meth:`SlackChannel.get_user`: by the verified email ``users.info`` gives, or your own hook) and
decides through the admin's path. A click that cannot decide (already decided, expired) updates the
message with what happened; one that is refused (no permission, four eyes, a stale digest) tells
the person why in an ephemeral message, and decides nothing.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, QueryDict
from django.utils import timezone
from django.utils.module_loading import import_string

from ..core.errors import AlreadyDecided, ApprovalExpired, ApprovalRefused, NexoError, StaleDecision
from ..display import mark_hidden
from ..durable import binding, refusals, schedule_notices
from ..durable.outbox import DeliveryFailed, NothingToSay, notice_key
from ..durable.policy import check as policy_check
from ..durable.policy import reviewer
from ..jsonbody import read_json
from ..models import (
    AgentRun,
    CallStatus,
    Notice,
    NoticeStatus,
    RunStatus,
    StepStatus,
    ToolCall,
    WorkflowStep,
)
from . import slack_questions
from .base import Channel, Refused, admin_url, question_of, question_urls, run_urls, subject
from .signing import SignatureError, verify_slack

log = logging.getLogger("nexo_django.channels.slack")

APPROVE, DENY = "nexo_approve", "nexo_deny"
#: the ``metadata.event_type`` of every message the outbox posts (its ``event_payload`` carries
#: the notice's key): how a post whose record was lost is found again
EVENT_TYPE = "nexo_notice"
#: how long before its recorded intent an earlier post of a notice is looked for (clocks differ),
#: and how many pages of history (``LOOKUP_LIMIT`` messages each) at most
LOOKBACK_SECONDS = 300.0
LOOKUP_PAGES = 5
LOOKUP_LIMIT = 200


class Answered(DeliveryFailed):
    """Slack answered and did not do it (``ok: false``, a 429): nothing was posted."""
VERDICTS = {"approved": "Approved", "denied": "Denied"}


def plain(text: Any, limit: int) -> str:
    """Model-produced text for a ``plain_text`` object: hidden characters shown, bounded."""
    shown = mark_hidden(text, keep="\n")
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def target_of(call: ToolCall) -> str:
    args = call.args if isinstance(call.args, dict) else {}
    for key in ("path", "url", "command", "pattern", "query"):
        if isinstance(args.get(key), str):
            return args[key]
    return call.name


def _when(at: Any) -> str:
    return "none (it waits until someone decides)" if at is None else at.strftime("%Y-%m-%d %H:%M UTC")


class SlackChannel(Channel):
    defaults = {"TOKEN": "", "SIGNING_SECRET": "", "CHANNEL": "", "BASE_URL": "https://slack.com/api/",
                "ALLOW_PRIVATE": [], "TIMEOUT": 10, "ARGS_CHARS": 600, "GET_USER": None}
    required = ("TOKEN", "SIGNING_SECRET", "CHANNEL")

    # --- the Web API ---------------------------------------------------------------------

    def api(self, method: str, *, form: bool = False, **fields: Any) -> dict[str, Any]:
        """Call a Web API method; its answer when ``ok``, else :class:`DeliveryFailed` with
        Slack's ``error`` (and a 429's ``Retry-After``)."""
        url = str(self.options["BASE_URL"]).rstrip("/") + "/" + method
        headers = {"Authorization": f"Bearer {self.options['TOKEN']}"}
        client = self.client(url, float(self.options["TIMEOUT"]))
        try:
            if form:
                response = client.post(url, data=fields, headers=headers)
            else:
                response = client.post(url, json=fields, headers=headers)
        except Exception as exc:  # connection refused, the guard's refusal, a timeout
            raise DeliveryFailed(f"{method}: {type(exc).__name__}: {exc}") from exc
        if response.status_code == 429:
            try:
                wait: float | None = float(response.headers.get("Retry-After", ""))
            except ValueError:
                wait = None
            raise Answered(f"{method}: rate limited by Slack", retry_after=wait)
        if response.status_code != 200:
            raise DeliveryFailed(f"{method}: HTTP {response.status_code}")
        try:
            data = response.json()
        except ValueError:
            raise DeliveryFailed(f"{method}: the answer is not JSON") from None
        if not isinstance(data, dict) or data.get("ok") is not True:
            error = data.get("error") if isinstance(data, dict) else None
            raise Answered(f"{method}: {error or 'not ok'}")
        return data

    # --- the message ---------------------------------------------------------------------

    def blocks(self, call: ToolCall, run: AgentRun) -> tuple[str, list[dict[str, Any]]]:
        """The message of ``call`` as it stands now: its fallback text and its blocks."""
        agent = run.agent.rsplit(".", 1)[-1]
        summary = plain(f"{agent} wants to run {call.name} on {target_of(call)}", 150)
        args = json.dumps(call.args, ensure_ascii=False, indent=1, default=str)
        urls = run_urls(run)
        links = [f"<{u}|{label}>" for u, label in ((admin_url(call), "Decision page"), (urls["page_url"], "Run"))
                 if u and u.startswith(("http://", "https://"))]
        blocks: list[dict[str, Any]] = [
            {"type": "header", "text": {"type": "plain_text", "text": summary, "emoji": False}},
            {"type": "section", "text": {"type": "plain_text", "emoji": False,
                                         "text": plain(args, int(self.options["ARGS_CHARS"]))}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(
                [f"Deadline: {_when(call.expires_at)}", f"Run {str(run.pk)[:8]}", *links])}]},
        ]
        if routed := policy_check.note(call, timezone.now()):  # who decides it, and how many have
            blocks.insert(2, {"type": "context", "elements": [{"type": "plain_text", "emoji": False,
                                                               "text": plain(routed, 300)}]})
        bound = binding.version_note(call)
        if bound:  # the version this message shows the write against, which Approve binds
            blocks.insert(2, {"type": "context", "elements": [{"type": "plain_text", "emoji": False,
                                                               "text": plain(bound, 300)}]})
        state = self.state(call, run)
        if state is None:
            value = f"{call.pk}:{call.digest}"
            blocks.append({"type": "actions", "block_id": f"nexo_{call.pk}", "elements": [
                {"type": "button", "action_id": APPROVE, "style": "primary", "value": value,
                 "text": {"type": "plain_text", "text": "Approve"}},
                {"type": "button", "action_id": DENY, "style": "danger", "value": value,
                 "text": {"type": "plain_text", "text": "Deny"}},
            ]})
        else:
            blocks.append({"type": "section", "text": {"type": "plain_text", "text": plain(state, 2900), "emoji": False}})
        return summary + (f" — {state}" if state else ""), blocks

    def state(self, call: ToolCall, run: AgentRun) -> str | None:
        """What happened to ``call`` in words (None while it waits for a decision)."""
        if call.status == CallStatus.PENDING_APPROVAL:
            if call.expires_at is not None and call.expires_at <= timezone.now():
                return f"Expired at {_when(call.expires_at)}: nobody decided in time; it can no longer be decided."
            return None
        decision = getattr(call, "decision", None)
        if call.status == CallStatus.EXPIRED and (decision is None or decision.source == "expiry"):
            text = "Expired: nobody decided in time." if decision else f"Not decided: the run is {run.status}."
        elif decision is None:
            text = f"Status: {call.status}."
        else:
            who = str(decision.decided_by or "nobody")
            if decision.channel_user:
                who += f" ({decision.channel_user})"
            text = (f"{VERDICTS.get(decision.verdict, decision.verdict)} by {who} via {decision.source} "
                    f"at {decision.decided_at.strftime('%Y-%m-%d %H:%M:%S UTC')}.")
            if decision.note:
                text += f" Note: {decision.note}"
        if call.status == CallStatus.SUCCEEDED:
            text += " Outcome: it ran. " + json.dumps(call.result, ensure_ascii=False, default=str)[:500]
        elif call.status == CallStatus.FAILED:
            text += " Outcome: it failed. " + json.dumps(call.result, ensure_ascii=False, default=str)[:500]
        elif call.status == CallStatus.OUTCOME_UNKNOWN:
            text += " Outcome: unknown (its worker stopped while it ran)."
        if run.status in (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED):
            text += f" The run is {run.status}."
        return text

    def _requests(self, notice: Notice) -> list[Notice]:
        found = Notice.objects.filter(channel=self.name, kind="approval.requested", run_id=notice.run_id)
        if notice.tool_call_id:
            found = found.filter(tool_call_id=notice.tool_call_id)
        return list(found.order_by("id"))

    def update(self, call: ToolCall, run: AgentRun, where: dict[str, Any]) -> dict[str, Any]:
        text, blocks = self.blocks(call, run)
        data = self.api("chat.update", channel=where["channel"], ts=where["ts"], text=text, blocks=blocks)
        return {"channel": data.get("channel", where["channel"]), "ts": data.get("ts", where["ts"])}

    # --- send ----------------------------------------------------------------------------

    def _reply(self, notice: Notice, where: dict[str, Any], text: str) -> dict[str, Any]:
        """A reply (a reminder) in the thread of the message posted at ``where``; its receipt."""
        return self.post(notice, channel=where["channel"], thread_ts=where["ts"], text=plain(text, 300))

    def post(self, notice: Notice, **fields: Any) -> dict[str, Any]:
        """``chat.postMessage`` of ``notice``, at most once. ``chat.postMessage`` takes no
        idempotency key, so the intent is recorded (committed in the notice's receipt) before the
        post, and the notice's key goes in the message's ``metadata``. A delivery that finds an
        intent (its process died, or the answer was lost, after the post may have reached Slack)
        looks for that message first (:meth:`find_post`) and posts only if there is none."""
        receipt = notice.receipt if isinstance(notice.receipt, dict) else {}
        intent = receipt.get("intent")
        if isinstance(intent, int | float):
            found = self.find_post(notice, fields, float(intent))
            if found is not None:
                return found
        mine = Notice.objects.filter(pk=notice.pk, status=NoticeStatus.PENDING, claim=notice.claim)
        if not mine.update(receipt={"intent": time.time()}):
            raise DeliveryFailed("another delivery took this notice meanwhile")
        try:
            data = self.api("chat.postMessage", **fields,
                            metadata={"event_type": EVENT_TYPE, "event_payload": {"key": notice.key}})
        except Answered:
            mine.update(receipt=None)  # Slack said no: nothing to look for next time
            raise
        return {"channel": data.get("channel"), "ts": data.get("ts")}

    def find_post(self, notice: Notice, fields: dict[str, Any], intent: float) -> dict[str, Any] | None:
        """The receipt of a message of ``notice`` posted since shortly before ``intent`` (its
        metadata carries the notice's key), or None. ``conversations.history`` (a reply:
        ``conversations.replies`` of its thread) with ``include_all_metadata``, newest first, a
        bounded number of pages (``cursor`` / ``response_metadata.next_cursor``). The app needs the
        ``channels:history`` scope (``groups:history`` for a private channel): without it, or while
        Slack cannot answer, the notice waits (and fails in the end) rather than posting twice."""
        where = fields["channel"]
        query: dict[str, Any] = {"channel": where, "include_all_metadata": "true", "limit": LOOKUP_LIMIT,
                                 "oldest": f"{max(intent - LOOKBACK_SECONDS, 0):.6f}"}
        method = "conversations.history"
        if fields.get("thread_ts"):
            method, query["ts"] = "conversations.replies", fields["thread_ts"]
        for _ in range(LOOKUP_PAGES):
            try:
                data = self.api(method, form=True, **query)
            except Answered as exc:
                raise DeliveryFailed(f"{exc} (finding an earlier post of this notice before posting again: give the "
                                     "app the channels:history or groups:history scope)",
                                     retry_after=exc.retry_after) from None
            for message in data.get("messages") or []:
                meta = message.get("metadata") if isinstance(message, dict) else None
                if not isinstance(meta, dict) or meta.get("event_type") != EVENT_TYPE:
                    continue
                payload = meta.get("event_payload")
                if isinstance(payload, dict) and payload.get("key") == notice.key:
                    return {"channel": where, "ts": message.get("ts")}
            cursor = (data.get("response_metadata") or {}).get("next_cursor")
            if not data.get("has_more") or not cursor:
                return None
            query["cursor"] = cursor
        log.warning("slack: no earlier post of %s in %d pages of %s; posting it", notice.key, LOOKUP_PAGES, where)
        return None

    def send(self, notice: Notice) -> dict[str, Any] | None:
        if notice.kind == schedule_notices.KIND:
            title, text = schedule_notices.text(notice)
            blocks = [{"type": "section", "text": {"type": "plain_text", "text": plain(text, 2900), "emoji": False}}]
            return self.post(notice, channel=self.options["CHANNEL"], text=plain(title, 300), blocks=blocks)
        run, call = subject(notice)
        if run is None:
            raise NothingToSay("the run no longer exists")
        if notice.kind.startswith("question."):
            return self._question(notice, run)
        if notice.kind == "approval.requested":
            if call is None or call.status != CallStatus.PENDING_APPROVAL:
                raise NothingToSay("the call was settled before it was announced")
            if not reviewer.before_notice(call):  # its policy's reviewer first (durable.policy.reviewer)
                raise DeliveryFailed("the reviewer agent is still reviewing the call", retry_after=2)
            text, blocks = self.blocks(call, run)
            return self.post(notice, channel=self.options["CHANNEL"], text=text, blocks=blocks)
        requests = self._requests(notice)
        if any(r.status == NoticeStatus.PENDING for r in requests):
            raise DeliveryFailed("the request's message is not posted yet", retry_after=2)
        posted = [r for r in requests if r.status == NoticeStatus.DELIVERED and r.receipt]
        if not posted:
            raise NothingToSay("no message of this channel to update")
        if notice.kind == "approval.reminder":
            if call is None or call.status != CallStatus.PENDING_APPROVAL:
                raise NothingToSay("the call was settled meanwhile")
            return self._reply(notice, posted[0].receipt or {},
                               f"Reminder: {call.name} still waits for a decision (deadline {_when(call.expires_at)}).")
        if notice.kind == "approval.escalated":  # durable.policy.escalation
            if call is None or call.status != CallStatus.PENDING_APPROVAL:
                raise NothingToSay("the call was settled meanwhile")
            groups = ", ".join((notice.payload or {}).get("to") or []) or "its escalation groups"
            return self._reply(notice, posted[0].receipt or {},
                               f"Escalated: nobody decided {call.name} in time; {groups} may decide it now "
                               f"(deadline {_when(call.expires_at)}).")
        updated = []
        for request in posted:
            found = ToolCall.objects.filter(run_id=run.pk, tool_call_id=request.tool_call_id).select_related("decision").first()
            if found is not None:
                updated.append(self.update(found, run, request.receipt or {}))
        return {"updated": updated}

    # --- a workflow's questions: announced with a link to answer them, then updated --------

    def question_blocks(self, step: WorkflowStep, run: AgentRun) -> tuple[str, list[dict[str, Any]]]:
        """The message of a workflow's question as it stands: its fallback text and its blocks;
        while it waits, the buttons that answer it (:mod:`.slack_questions`)."""
        workflow = run.agent.rsplit(".", 1)[-1]
        summary = plain(f"{workflow} asks: {step.name}", 150)
        urls = question_urls(step)
        links = [f"<{u}|{label}>" for u, label in ((urls["admin_url"], "Answer it"), (run_urls(run)["page_url"], "Run"))
                 if u and u.startswith(("http://", "https://"))]
        blocks: list[dict[str, Any]] = [
            {"type": "header", "text": {"type": "plain_text", "text": summary, "emoji": False}},
            {"type": "section", "text": {"type": "plain_text", "emoji": False, "text": plain(step.question, 2900)}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(
                [f"Deadline: {_when(step.expires_at)}", f"Run {str(run.pk)[:8]}", *links])}]},
        ]
        if step.status == StepStatus.ANSWERED:
            answer = json.dumps(step.result, ensure_ascii=False, default=str)
            state = f"Answered by {step.answered_by or 'someone'} at {_when(step.answered_at)}: {answer}"
        elif step.status == StepStatus.EXPIRED:
            state = f"Not answered: it ended at {_when(step.answered_at or step.expires_at)} (expired, or the run was cancelled)."
        else:
            return summary, [*blocks, slack_questions.actions_block(step)]
        blocks.append({"type": "section", "text": {"type": "plain_text", "text": plain(state, 2900), "emoji": False}})
        return f"{summary} — {plain(state, 300)}", blocks

    def _question(self, notice: Notice, run: AgentRun) -> dict[str, Any]:
        step = question_of(notice)
        if step is None:
            raise NothingToSay("the question no longer exists")
        if notice.kind == "question.asked":
            if step.status != StepStatus.WAITING:
                raise NothingToSay("the question was answered or ended before it was announced")
            text, blocks = self.question_blocks(step, run)
            return self.post(notice, channel=self.options["CHANNEL"], text=text, blocks=blocks)
        asked = Notice.objects.filter(key=notice_key(self.name, "question.asked", run.pk, step.name)).first()
        if asked is not None and asked.status == NoticeStatus.PENDING:
            raise DeliveryFailed("the question's message is not posted yet", retry_after=2)
        if asked is None or asked.status != NoticeStatus.DELIVERED or not asked.receipt:
            raise NothingToSay("no message of this channel to update")
        where = asked.receipt
        if notice.kind == "question.reminder":
            if step.status != StepStatus.WAITING:
                raise NothingToSay("the question was answered or ended meanwhile")
            return self._reply(notice, where, f"Reminder: {step.name} still waits for an answer (deadline {_when(step.expires_at)}).")
        text, blocks = self.question_blocks(step, run)
        data = self.api("chat.update", channel=where["channel"], ts=where["ts"], text=text, blocks=blocks)
        return {"updated": [{"channel": data.get("channel", where["channel"]), "ts": data.get("ts", where["ts"])}]}

    # --- receive -------------------------------------------------------------------------

    def verify(self, request: HttpRequest) -> None:
        try:
            verify_slack(self.options["SIGNING_SECRET"], request.headers.get("X-Slack-Request-Timestamp"),
                         request.headers.get("X-Slack-Signature"), request.body)
        except SignatureError as exc:
            raise Refused(str(exc)) from None
        self.remember(request.headers["X-Slack-Signature"])

    def get_user(self, slack_user: str, payload: dict[str, Any]) -> Any:
        """The Django user who clicked, or None. Override it (in a subclass, or name a
        ``callable(channel, slack_user, payload)`` in ``GET_USER``). By default: ``users.info``
        (the app needs the ``users:read.email`` scope), and if Slack says the email is confirmed,
        the one active user with that email (case-insensitive); none or several: None."""
        hook = self.options.get("GET_USER")
        if hook:
            return import_string(hook)(self, slack_user, payload)
        info = self.api("users.info", form=True, user=slack_user).get("user") or {}
        email = (info.get("profile") or {}).get("email")
        if not isinstance(email, str) or not email or info.get("is_email_confirmed") is not True:
            return None
        if info.get("deleted") or info.get("is_bot"):
            return None
        model = get_user_model()
        field = model.get_email_field_name()
        found = list(model._default_manager.filter(**{f"{field}__iexact": email, "is_active": True})[:2])
        return found[0] if len(found) == 1 else None

    def decide(self, request: HttpRequest) -> HttpResponse:
        try:
            payload = read_json(QueryDict(request.body).get("payload") or "", what="the payload field")
            if isinstance(payload, dict) and payload.get("type") == "view_submission":
                return slack_questions.on_submission(self, payload)
            action = payload["actions"][0]
            if str(action.get("action_id", "")).startswith(slack_questions.ACTIONS):
                return slack_questions.on_action(self, payload, action)
            action_id, value = action["action_id"], action["value"]
            slack_user = payload["user"]["id"]
            team = (payload.get("team") or {}).get("id") or payload["user"].get("team_id", "")
            container = payload.get("container") or {}
            where = {"channel": container.get("channel_id") or (payload.get("channel") or {}).get("id"),
                     "ts": container.get("message_ts") or (payload.get("message") or {}).get("ts")}
            call_pk, digest = str(value).split(":", 1)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return HttpResponse("not an action of this app", status=400)
        if action_id not in (APPROVE, DENY) or not call_pk.isdigit():
            return HttpResponse("not an action of this app", status=400)
        if any("\x00" in str(text) for text in (digest, slack_user, team)):
            # PostgreSQL's text holds no NUL: refused here, not as a raw error from a query.
            return HttpResponse("the payload's ids and digest may not hold a NUL character", status=400)
        call = ToolCall.objects.filter(pk=int(call_pk)).select_related("run").first()
        if call is None:
            return self._tell(where, slack_user, "This call no longer exists.")
        try:
            user = self.get_user(slack_user, payload)
        except NexoError as exc:
            return self._tell(where, slack_user, f"Could not look you up in Slack ({exc}); nothing was decided.")
        try:
            self.decide_call(call, approved=action_id == APPROVE, user=user, digest=digest,
                             channel_user=f"slack:{team}/{slack_user}")
        except PermissionDenied as exc:
            reason = str(exc) or "you may not decide this call"
            return self._tell(where, slack_user, f"Nothing was decided: {reason}.")
        except (StaleDecision, ApprovalRefused) as exc:
            return self._tell(where, slack_user, f"Nothing was decided: {exc}.")
        except (AlreadyDecided, ApprovalExpired, AgentRun.DoesNotExist):
            # What already happened, on the message itself.
            current = ToolCall.objects.filter(pk=call.pk).select_related("run", "decision").first()
            if current is not None and where["channel"] and where["ts"]:
                try:
                    self.update(current, current.run, where)
                except DeliveryFailed as exc:
                    log.warning("slack: updating the message of %s failed: %s", call.pk, exc)
            return HttpResponse(status=200)
        if refused := refusals.refused(call):  # recorded; the message is updated by its notice
            return self._tell(where, slack_user, f"Approved, but the sandbox refused it now, so it could not run: "
                                                 f"the run failed. {plain(refused, 2000)}")
        return HttpResponse(status=200)

    def _tell(self, where: dict[str, Any], slack_user: str, text: str) -> HttpResponse:
        if where.get("channel"):
            try:
                self.api("chat.postEphemeral", channel=where["channel"], user=slack_user, text=text)
            except DeliveryFailed as exc:
                log.warning("slack: telling %s failed: %s", slack_user, exc)
        return HttpResponse(status=200)

