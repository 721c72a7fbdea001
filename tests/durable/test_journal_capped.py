"""``journal.capped``: an event's data is kept as it is when its JSON text fits, else a preview.
It measures only what may not fit (issue 34): the shortcut must give the same answer as measuring."""

from __future__ import annotations

import random
from typing import Any

from nexo_django.durable.journal import _bound, _measure, capped


def _value(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.random()
    if depth > 4 or pick < 0.35:
        return rng.choice([
            "", "plain", 'a\x00\n"\\é😀\ud800\x1f' * rng.randint(0, 40), 10 ** rng.randint(0, 25) * rng.choice([1, -1]),
            1.5e300, -2.2250738585072014e-308, -0.0, float("nan"), float("-inf"), True, False, None,
        ])  # fmt: skip
    if pick < 0.7:
        return {"\x01" * rng.randint(0, 3) + "k" * rng.randint(0, 30): _value(rng, depth + 1) for _ in range(rng.randint(0, 5))}
    return [_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]


def _measured(value: Any, limit: int) -> Any:
    """What ``capped`` answered before the shortcut: the text written, then compared."""
    if not value and type(value) in (dict, list) and limit >= 2:
        return value
    text = _measure(value)
    return value if len(text) <= limit else {"truncated": True, "preview": text[:limit]}


def test_the_bound_is_never_below_the_text_written() -> None:
    rng = random.Random(34)
    for _ in range(3_000):
        value = _value(rng)
        bound = _bound(value, 10**9)
        if bound <= 10**9:
            assert bound >= len(_measure(value)), value


def test_capped_answers_as_measuring_does_at_every_limit() -> None:
    rng = random.Random(7)
    for _ in range(800):
        value = _value(rng)
        for limit in (0, 2, 20, 200, 2000):
            assert repr(capped(value, limit)) == repr(_measured(value, limit)), (value, limit)


def test_a_value_that_is_not_plain_json_is_measured() -> None:
    class Named:
        def __str__(self) -> str:
            return "x" * 50

    assert _bound({"who": Named()}, 2000) > 2000  # not bounded: measured (default=str)
    assert capped({"who": Named()}, 20) == {"truncated": True, "preview": '{"who": "' + "x" * 11}
    assert capped({"who": Named()}, 2000)["who"].__class__ is Named
