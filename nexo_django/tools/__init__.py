"""Documented re-export: the tools are the core's (:mod:`nexo_django.core.tools`)."""

from ..core.tools import *  # noqa: F403
