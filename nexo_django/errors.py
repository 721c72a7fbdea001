"""The exception tree (documented re-export of :mod:`nexo_django.core.errors`), with Django's flavour.

Here, on the Django side, :class:`ConfigurationError` gains ``ImproperlyConfigured`` as a base: the
core stays free of Django, and the class it raises is still the one Django and a project treat as
a configuration error (``except ImproperlyConfigured`` catches it). ``nexo_django/__init__`` imports
this module first, so every import of the package applies it before any error can be raised.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from .core import errors as _core
from .core.errors import *  # noqa: F403  (the re-export)
from .core.errors import ConfigurationError

if not issubclass(ConfigurationError, ImproperlyConfigured):
    ConfigurationError.__bases__ = (_core.NexoError, ImproperlyConfigured)
