"""Documented re-export: model providers are the core's (:mod:`nexo_django.core.llm`)."""

from ..core.llm import *  # noqa: F403
