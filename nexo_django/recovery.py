"""Documented re-export: the reconciler lives in :mod:`nexo_django.durable.recovery`."""

from .durable.recovery import *  # noqa: F403
