"""Documented re-export of :mod:`nexo_django.core.llm.openai`."""

from ..core.llm.openai import *  # noqa: F403
