"""Documented re-export of :mod:`nexo_django.core.llm.http`."""

from ..core.llm.http import *  # noqa: F403
