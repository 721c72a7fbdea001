"""Forms of the approval pages. They parse and check; deciding is ``runs.decide``'s job."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django import forms

from ..core.errors import InvalidEditedArguments
from ..jsonbody import BadJSON, read_json
from ..models import ToolCall, args_digest

APPROVE = "approve"
DENY = "deny"
DENY_STOP = "deny_stop"
REVIEW_EDIT = "review_edit"
APPROVE_EDITED = "approve_edited"
BACK = "back"
APPROVE_ALWAYS = "approve_always"

ACTION_CHOICES = [
    (APPROVE, "Approve"),
    (DENY, "Deny"),
    (DENY_STOP, "Deny and stop the run"),
    (REVIEW_EDIT, "Review edited arguments"),
    (APPROVE_EDITED, "Approve with edited arguments"),
    (BACK, "Back to editing"),
    (APPROVE_ALWAYS, "Approve, and always allow this tool for this agent"),
]
EDIT_ACTIONS = frozenset({REVIEW_EDIT, APPROVE_EDITED})

NOTE_MAX_CHARS = 2000
EDITED_MAX_CHARS = 200_000

EditedArgsCheck = Callable[[ToolCall, dict[str, Any]], None]


def encode_file_version(version: str | None) -> str:
    """The hidden field's text: ``""`` nothing shown, ``"new"`` no file, ``"v:<version>"``."""
    if version is None:
        return ""
    return f"v:{version}" if version else "new"


def decode_file_version(text: str) -> str | None:
    if text == "new":
        return ""
    if text.startswith("v:") and len(text) > 2:
        return text[2:]
    return None


class DecisionForm(forms.Form):
    """One decision on one call. ``digest`` is the digest of the arguments the page showed."""

    action = forms.ChoiceField(choices=ACTION_CHOICES)
    digest = forms.CharField(min_length=64, max_length=64, widget=forms.HiddenInput)
    note = forms.CharField(
        required=False, max_length=NOTE_MAX_CHARS, label="Note",
        help_text="Sent to the model with a denial, and kept with the decision.",
        widget=forms.Textarea(attrs={"rows": 2, "cols": 80}),
    )
    # No max_length here: the cap applies to edits only (clean()). The decision page posts no
    # editor at all (it is a page of its own), so Approve never carries the arguments.
    edited_args = forms.CharField(
        required=False, label="Edited arguments (JSON)", strip=False,
        widget=forms.Textarea(attrs={"rows": 10, "cols": 80, "spellcheck": "false", "class": "nexo-json"}),
    )
    #: "Always allow": the fnmatch pattern of paths the new rule allows (path tools only).
    rule_path = forms.CharField(required=False, max_length=1000, label="for paths like", strip=True)
    #: The file version the page's diff was made from (:func:`encode_file_version`): a plain
    #: Approve is bound to it.
    file_version = forms.CharField(required=False, max_length=140, widget=forms.HiddenInput)
    #: Digest of the edited arguments shown on the review page; what is confirmed is what was shown.
    edited_digest = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)

    def __init__(self, *args: Any, call: ToolCall, check_edited: EditedArgsCheck, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.call = call
        self.check_edited = check_edited

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        data["shown_version"] = decode_file_version(data.get("file_version") or "")
        action = data.get("action")
        if action not in EDIT_ACTIONS or "edited_args" in self.errors:
            return data
        text = data.get("edited_args") or ""
        if len(json.dumps(self.call.args, ensure_ascii=False, default=str)) > EDITED_MAX_CHARS:
            self.add_error("edited_args", f"These arguments are longer than an edit may be ({EDITED_MAX_CHARS} "
                                          "characters): deny with a note instead.")
            return data
        if not text.strip():
            self.add_error("edited_args", "Write the arguments to approve, as a JSON object.")
            return data
        if len(text) > EDITED_MAX_CHARS:
            self.add_error("edited_args", f"Edited arguments are limited to {EDITED_MAX_CHARS} characters.")
            return data
        try:
            edited = read_json(text, what="the edited arguments", max_bytes=4 * EDITED_MAX_CHARS)
        except BadJSON as exc:
            self.add_error("edited_args", f"{str(exc)[0].upper()}{str(exc)[1:]}.")
            return data
        if not isinstance(edited, dict):
            self.add_error("edited_args", "The arguments must be a JSON object ({...}).")
            return data
        if args_digest(edited) == self.call.digest:
            self.add_error("edited_args", "These are the stored arguments, unchanged: use Approve instead.")
            return data
        if action == APPROVE_EDITED and data.get("edited_digest") != args_digest(edited):
            self.add_error("edited_args", "The edited arguments changed after you reviewed them; review them again.")
            return data
        try:
            self.check_edited(self.call, edited)
        except InvalidEditedArguments as exc:
            self.add_error("edited_args", str(exc))
            return data
        data["args"] = edited
        return data


class BulkDenyForm(forms.Form):
    note = forms.CharField(
        required=False, max_length=NOTE_MAX_CHARS, label="Note for the model",
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
    )
