"""Documented re-export: the sandboxes are the core's (:mod:`nexo_django.core.sandboxes`)."""

from ..core.sandboxes import *  # noqa: F403
