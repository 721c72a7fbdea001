"""Model providers. ``"openai:<model>"`` and ``"anthropic:<model>"`` strings, or a model object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigurationError
from .anthropic import AnthropicModel
from .base import Completion, Message, Model, add_usage, assistant
from .openai import OpenAIModel

__all__ = ["PROVIDERS", "Completion", "Message", "Model", "add_usage", "assistant", "resolve_model"]

PROVIDERS = ("openai", "anthropic")


def resolve_model(value: Any, provider_settings: Mapping[str, Mapping[str, Any]] | None = None) -> Model:
    """Turn ``"provider:model"`` into a model object; pass a model object through."""
    if not isinstance(value, str):
        if hasattr(value, "complete"):
            return value
        raise ConfigurationError(f"model must be a 'provider:model' string or a model object, not {value!r}")
    provider, sep, name = value.partition(":")
    if not sep or not name:
        raise ConfigurationError(
            f"model {value!r} must be 'provider:model', e.g. 'openai:gpt-4.1-mini' or "
            "'anthropic:claude-sonnet-4-5'"
        )
    options = dict((provider_settings or {}).get(provider, {}))
    if provider == "openai":
        return OpenAIModel(name, **options)
    if provider == "anthropic":
        return AnthropicModel(name, **options)
    raise ConfigurationError(f"unknown model provider {provider!r} in {value!r}; known: {', '.join(PROVIDERS)}")
