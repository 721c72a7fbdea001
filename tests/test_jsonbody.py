"""The one bounded JSON reader for request bodies (issue 32, item 7)."""

from __future__ import annotations

import pytest

from nexo_django.jsonbody import MAX_DEPTH, BadJSON, depth, read_json


def test_it_reads_json_within_its_bounds() -> None:
    assert read_json(b'{"verdict": "approve", "note": "[[[{{{"}') == {"verdict": "approve", "note": "[[[{{{"}
    assert read_json(b"", empty={}) == {}
    nested = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert depth(nested) == MAX_DEPTH and read_json(nested) is not None


@pytest.mark.parametrize(("raw", "reason"), [
    (b"[" * 100_000 + b"]" * 100_000, "nests arrays and objects 100,000 deep; at most 64"),
    (b'{"a": ' * 65 + b"1" + b"}" * 65, "nests arrays and objects 65 deep"),
    (b"x" * 1_000_001, "is 1,000,001 bytes of JSON; at most 1,000,000 are read"),
    (b"\xff{}", "is not UTF-8 text"),
    (b"{not json", "is not valid JSON"),
    (b"", "is empty"),
])
def test_it_refuses_with_one_sentence_that_says_why(raw: bytes, reason: str) -> None:
    with pytest.raises(BadJSON, match=reason.replace("(", r"\(")):
        read_json(raw)


@pytest.mark.parametrize("raw", ['"\\"' * 300_000, '["' + '\\"' * 400_000, '"' * 999_999, '"\\' * 300_000])
def test_an_unterminated_string_is_refused_in_linear_time(raw: str) -> None:
    """The string pattern once retried from every quote of an unterminated string: quadratic, a
    1 MB body (within the size bound) held a worker for hours. Now one pass: well under a second
    even on a loaded machine (20 KB took 26 s before)."""
    import time

    started = time.process_time()
    with pytest.raises(BadJSON, match="is not valid JSON"):
        read_json(raw)
    assert time.process_time() - started < 2.0


def test_brackets_inside_strings_do_not_count() -> None:
    assert depth('{"a": "[[[[[[\\"]]]", "b": [1]}') == 2


def test_every_request_body_the_app_parses_goes_through_it() -> None:
    """No view, form or admin page parses request data with ``json.loads`` of its own: the layers
    that face requests (everything outside ``core/`` and ``durable/``, which parse what the
    app itself stored or a model provider sent) read JSON through ``jsonbody``."""
    from pathlib import Path

    import nexo_django

    root = Path(nexo_django.__file__).parent
    stored = {"storable.py", "jsonbody.py"}  # the column codec; the reader itself
    offenders = [
        str(path.relative_to(root)) for path in root.rglob("*.py")
        if path.parts[len(root.parts)] not in ("core", "durable") and path.name not in stored
        and ("json.loads(" in path.read_text() or "loads(request" in path.read_text())
    ]
    assert offenders == []
