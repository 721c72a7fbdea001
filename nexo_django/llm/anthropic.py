"""Documented re-export of :mod:`nexo_django.core.llm.anthropic`."""

from ..core.llm.anthropic import *  # noqa: F403
