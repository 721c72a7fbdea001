"""A workflow's question answered in Slack: buttons or a select in the message for an ``enum`` or
boolean answer, a modal (``views.open`` with the click's ``trigger_id``) built from the schema for
any other, read back and validated on ``view_submission`` with the errors shown in the modal
(``response_action: errors``).

Every answer goes through :meth:`nexo_django.channels.base.Channel.answer_question`, the one
answering function (the decide permission, four eyes, expiry, the schema, compare-and-set);
the person Slack vouches for is mapped to a Django user by the channel's ``get_user``. The message
is updated, on every channel it was posted to, by the ``question.answered`` notice the answer's
commit writes. A click or a submission that cannot answer tells the person why (an ephemeral
message, or the modal's error) and changes nothing; the loser of two answers is told who answered.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse, JsonResponse

from .. import schema_forms
from ..core.errors import AlreadyDecided, InvalidAnswer, NexoError, WorkflowError
from ..durable.outbox import DeliveryFailed
from ..jsonbody import BadJSON, read_json
from ..models import StepKind, StepStatus, WorkflowStep


class SlackChannel(Protocol):
    """What this module needs of :class:`nexo_django.channels.slack.SlackChannel`."""

    def api(self, method: str, *, form: bool = False, **fields: Any) -> dict[str, Any]: ...
    def get_user(self, slack_user: str, payload: dict[str, Any]) -> Any: ...
    def answer_question(self, step: WorkflowStep, value: Any, *, user: Any, channel_user: str,
                        action: str = "accept") -> WorkflowStep: ...
    def _tell(self, where: dict[str, Any], slack_user: str, text: str) -> HttpResponse: ...

log = logging.getLogger("nexo_django.channels.slack")

#: the action ids of a question's message and the modal's callback id
PICK, OPEN, DECLINE = "nexo_answer_pick", "nexo_answer_open", "nexo_answer_decline"
CALLBACK = "nexo_answer"
ACTIONS = (PICK, OPEN, DECLINE)
#: buttons in the message at most; more choices are a select
BUTTONS = 5
#: what a modal's JSON box takes (Slack's plain_text_input holds 3,000 characters)
JSON_BOX = "f0"


def choices(form: schema_forms.Form | None) -> list[tuple[Any, str]] | None:
    """The choices a question's message offers as buttons or a select (an enum or a boolean that
    is the whole answer), or None: the question is answered in a modal."""
    if form is None or not form.single:
        return None
    field = form.fields[0]
    if field.kind == "boolean":
        return [(True, "Yes"), (False, "No")]
    if field.kind == "enum":
        return list(field.choices)
    return None


def actions_block(step: WorkflowStep) -> dict[str, Any]:
    """The message's way to answer ``step``: a button per choice (a select past :data:`BUTTONS`),
    each value ``<step id>:<choice number>``, or one button that opens the modal; an MCP server's
    ask has a *Decline* button too."""
    block = _choices_block(step)
    if isinstance(step.request, dict):
        block["elements"].append({"type": "button", "action_id": DECLINE, "value": str(step.pk), "style": "danger",
                                  "text": schema_forms.slack_text("Decline", 75)})
    return block


def _choices_block(step: WorkflowStep) -> dict[str, Any]:
    found = choices(schema_forms.form_of(step))
    if found is None:
        return {"type": "actions", "block_id": f"nexo_q{step.pk}", "elements": [
            {"type": "button", "action_id": OPEN, "value": str(step.pk), "style": "primary",
             "text": schema_forms.slack_text("Answer…", 75)}]}
    options = [(f"{step.pk}:{i}", label) for i, (_, label) in enumerate(found)]
    if len(options) > BUTTONS:
        return {"type": "actions", "block_id": f"nexo_q{step.pk}", "elements": [
            {"type": "static_select", "action_id": PICK, "placeholder": schema_forms.slack_text("Choose the answer", 150),
             "options": [{"text": schema_forms.slack_text(label, 75), "value": value} for value, label in options]}]}
    return {"type": "actions", "block_id": f"nexo_q{step.pk}", "elements": [
        {"type": "button", "action_id": f"{PICK}_{i}", "value": value, "text": schema_forms.slack_text(label, 75)}
        for i, (value, label) in enumerate(options)]}


def modal(step: WorkflowStep, where: dict[str, Any]) -> dict[str, Any]:
    """The modal of ``step``: the question, then an input per field of its form (a JSON box where
    the form cannot express the schema). ``private_metadata`` names the question and the message."""
    form = schema_forms.form_of(step)
    if form is not None:
        inputs = schema_forms.slack_blocks(form)
    else:
        inputs = [{"type": "input", "block_id": JSON_BOX, "label": schema_forms.slack_text("Answer (JSON)", 2000),
                   "element": {"type": "plain_text_input", "action_id": "value", "multiline": True, "max_length": 3000},
                   "hint": schema_forms.slack_text("Any JSON matching the question's schema", 2000)}]
    metadata = json.dumps({"step": step.pk, "channel": where.get("channel"), "ts": where.get("ts")})
    return {
        "type": "modal", "callback_id": CALLBACK, "private_metadata": metadata[:3000],
        "title": schema_forms.slack_text("Answer", 24), "submit": schema_forms.slack_text("Answer", 24), "close": schema_forms.slack_text("Cancel", 24),
        "blocks": [{"type": "section", "text": schema_forms.slack_text(f"{step.name}: {step.question}", 3000)}, *inputs][:100],
    }


def _step(pk: Any) -> WorkflowStep | None:
    if type(pk) is not int and not (isinstance(pk, str) and pk.isdigit() and len(pk) < 19):
        return None
    return WorkflowStep.objects.filter(pk=int(pk), kind=StepKind.QUESTION).select_related("run", "answered_by").first()


def _who(channel: SlackChannel, payload: dict[str, Any]) -> tuple[str, str]:
    user = payload["user"]
    slack_user = str(user["id"])
    team = str((payload.get("team") or {}).get("id") or user.get("team_id", ""))
    if "\x00" in slack_user + team:
        raise ValueError("a NUL character")
    return slack_user, f"slack:{team}/{slack_user}"


def _answer(channel: SlackChannel, step: WorkflowStep, value: Any, payload: dict[str, Any], slack_user: str,
            who: str, action: str = "accept") -> str:
    """Answer through the one function; "" when recorded, else the sentence that says why not."""
    try:
        user = channel.get_user(slack_user, payload)
    except NexoError as exc:
        return f"Could not look you up in Slack ({exc}); nothing was answered."
    try:
        channel.answer_question(step, value, user=user, channel_user=who, action=action)
    except PermissionDenied as exc:
        return f"Nothing was answered: {str(exc) or 'you may not answer this question'}."
    except (AlreadyDecided, InvalidAnswer, WorkflowError) as exc:  # answered by someone (named), expired, refused
        return f"Nothing was answered: {exc}."
    return ""


def on_action(channel: SlackChannel, payload: dict[str, Any], action: dict[str, Any]) -> HttpResponse:
    """A click in a question's message: a choice answers it; "Answer…" opens its modal."""
    action_id = str(action.get("action_id") or "")
    try:
        slack_user, who = _who(channel, payload)
        container = payload.get("container") or {}
        where = {"channel": container.get("channel_id") or (payload.get("channel") or {}).get("id"),
                 "ts": container.get("message_ts") or (payload.get("message") or {}).get("ts")}
        if action_id in (OPEN, DECLINE):
            step_pk, index = action["value"], None
        else:
            raw = (action.get("selected_option") or {}).get("value") if action.get("type") == "static_select" \
                else action["value"]
            step_pk, index = str(raw).split(":", 1)
    except (ValueError, KeyError, TypeError, AttributeError):
        return HttpResponse("not an action of this app", status=400)
    step = _step(step_pk)
    if step is None:
        return channel._tell(where, slack_user, "This question no longer exists.")
    if step.status != StepStatus.WAITING:
        return channel._tell(where, slack_user, f"Nothing was answered: {_closed(step)}.")
    if action_id == DECLINE:
        refused = _answer(channel, step, None, payload, slack_user, who, action="decline")
        return channel._tell(where, slack_user, refused) if refused else HttpResponse(status=200)
    if index is None:
        trigger = payload.get("trigger_id")
        if not isinstance(trigger, str) or not trigger:
            return HttpResponse("the click has no trigger_id", status=400)
        try:
            channel.api("views.open", trigger_id=trigger, view=modal(step, where))
        except DeliveryFailed as exc:
            log.warning("slack: opening the answer's modal of %s failed: %s", step.pk, exc)
            return channel._tell(where, slack_user, f"Could not open the answer's form ({exc}); answer it in the admin.")
        return HttpResponse(status=200)
    found = choices(schema_forms.form_of(step))
    if found is None or not index.isdigit() or int(index) >= len(found):
        return channel._tell(where, slack_user, "Nothing was answered: that choice is not one of this question's.")
    refused = _answer(channel, step, found[int(index)][0], payload, slack_user, who)
    return channel._tell(where, slack_user, refused) if refused else HttpResponse(status=200)


def _closed(step: WorkflowStep) -> str:
    if step.status == StepStatus.ANSWERED:
        return f"question {step.name!r} was already answered by {step.answered_by or 'someone'}"
    return f"question {step.name!r} ended without an answer (expired, or its run was cancelled)"


def errors(block_id: str, text: str) -> JsonResponse:
    """What Slack shows under the modal's input ``block_id`` (the modal stays open)."""
    return JsonResponse({"response_action": "errors", "errors": {block_id: text[:2000]}})


def on_submission(channel: SlackChannel, payload: dict[str, Any]) -> HttpResponse:
    """The modal sent: its values read back into the answer, which is answered through the one
    function; any refusal is shown in the modal, under the field it is about."""
    try:
        view = payload["view"]
        if view.get("callback_id") != CALLBACK:
            raise ValueError(view.get("callback_id"))
        meta = read_json(str(view.get("private_metadata") or ""), what="the view's private_metadata")
        slack_user, who = _who(channel, payload)
        state = (view.get("state") or {}).get("values") or {}
    except (ValueError, KeyError, TypeError, AttributeError):
        return HttpResponse("not a view of this app", status=400)
    step = _step(meta.get("step") if isinstance(meta, dict) else None)
    if step is None:
        return errors(JSON_BOX, "This question no longer exists.")
    form = schema_forms.form_of(step)
    if form is None:
        raw = ((state.get(JSON_BOX) or {}).get("value") or {}).get("value") if isinstance(state, dict) else None
        try:
            value = read_json(raw if isinstance(raw, str) else "", what="the answer")
        except BadJSON as exc:
            return errors(JSON_BOX, f"{exc}.")
        problems: dict[str, str] = {}
    else:
        value, problems = schema_forms.from_slack_state(form, state)
    if problems:
        return JsonResponse({"response_action": "errors", "errors": problems})
    first = "f0"
    try:
        user = channel.get_user(slack_user, payload)
    except NexoError as exc:
        return errors(first, f"Could not look you up in Slack ({exc}); nothing was answered.")
    try:
        channel.answer_question(step, value, user=user, channel_user=who)
    except InvalidAnswer as exc:
        names = [f.name for f in form.fields] if form is not None and not form.single else []
        at = exc.path[0] if exc.path else None
        return errors(f"f{names.index(at)}" if at in names else first, str(exc))
    except PermissionDenied as exc:
        return errors(first, f"Nothing was answered: {str(exc) or 'you may not answer this question'}.")
    except (AlreadyDecided, WorkflowError) as exc:
        return errors(first, f"Nothing was answered: {exc}.")
    return HttpResponse(status=200)  # an empty 200 closes the modal; the notice updates the message
