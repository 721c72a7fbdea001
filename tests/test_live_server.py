"""The live server the browser tests use (tests/conftest.py): its thread has a database
connection of its own, unless the test database really is in memory (issue 33, item 7)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from django.db import connection, connections

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_live_server_thread_never_shares_the_tests_connection_to_a_database_file(live_server: Any) -> None:
    shared = live_server.thread.connections_override
    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        assert shared == {"default": connections["default"]}  # the only way to reach it
        return
    # Shared, the server thread would close this test's connection after each request.
    assert shared == {}
    for _ in range(3):
        assert httpx.get(f"{live_server.url}/admin/login/", timeout=15).status_code == 200
        assert connection.connection is None or connection.is_usable()
