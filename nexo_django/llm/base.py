"""Documented re-export of :mod:`nexo_django.core.llm.base`."""

from ..core.llm.base import *  # noqa: F403
