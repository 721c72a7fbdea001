"""Why a reply ended, in words, and what the loop must not do with a reply that ended early.

A tool call in a reply cut off by the output limit (Anthropic ``stop_reason: "max_tokens"`` or
``"model_context_window_exceeded"``, Chat Completions ``finish_reason: "length"``) may have lost
the end of its arguments: a ``purge`` without its ``where``. Such a call never runs; it carries an
``"error"`` naming the reason, which the loop returns to the model as the call's result, so the
model can make the call again (shorter) and the transcript stays valid for the provider. A reply
that is empty because it was cut off or filtered fails the turn with a :class:`ProviderError`
that says why, instead of ending the run with an empty answer.
"""

from __future__ import annotations

from typing import Any

from .http import ProviderError


def cut_off_call(reason: str) -> str:
    return (
        f"not run: the reply was cut off ({reason}) before this call was complete, so its arguments "
        "may be incomplete; make the call again, with shorter arguments if they are long"
    )


def refused_call(reason: str) -> str:
    return f"not run: the model stopped with a refusal ({reason}) while writing this call"


def mark_calls(calls: list[dict[str, Any]], error: str) -> None:
    for call in calls:
        call["error"] = error


def empty_reply(provider: str, why: str) -> ProviderError:
    return ProviderError(provider, f"the model's reply is empty: {why}")


def cut_off_empty(provider: str, reason: str, setting: str) -> ProviderError:
    return empty_reply(provider, f"it was cut off at the output token limit ({reason}); raise {setting}")


def filtered_empty(provider: str, reason: str) -> ProviderError:
    return empty_reply(provider, f"the provider's content filter stopped it ({reason})")


def refusal_text(reason: str) -> str:
    # What the person reading the run sees as the final answer, as with Chat Completions' refusal.
    return f"The model declined to answer ({reason})."
