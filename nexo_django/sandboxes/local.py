"""Documented re-export of :mod:`nexo_django.core.sandboxes.local`."""

from ..core.sandboxes.local import *  # noqa: F403
