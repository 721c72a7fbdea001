"""The example's ASGI application serves its static files (issue 33, item 8): under uvicorn, with
``DEBUG`` off as in production, the admin had no CSS. Called in process, as uvicorn calls it."""

from __future__ import annotations

import asyncio

import httpx
from django.test import override_settings


def _get(path: str) -> httpx.Response:
    from example_project.asgi import application

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://testserver") as client:
            return await client.get(path)

    return asyncio.run(get())


@override_settings(DEBUG=False)
def test_the_example_serves_the_admin_css_with_debug_off() -> None:
    response = _get("/static/admin/css/base.css")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/css") and b"body" in response.content
    assert _get("/static/nexo_django/admin.css").status_code == 200  # the app's own
    assert _get("/static/admin/css/no-such-file.css").status_code == 404
