"""Signals a project can listen to. ``sender`` is the model class."""

from __future__ import annotations

from django.dispatch import Signal

#: kwargs: run, old, new
run_status_changed = Signal()
#: kwargs: tool_call, run
approval_requested = Signal()
#: kwargs: tool_call, decision
approval_decided = Signal()
