"""The endpoint channels receive requests on (a Slack button, a signed webhook):
``path("nexo/channels/", include("nexo_django.channel_urls"))``.

Verify, then parse: the channel named in the URL checks the request (signature over the raw body,
timestamp window, replay) before anything of it is read, and only then decides from it
(``nexo_django.channels.base.Channel``). No session, no CSRF token: the signature is the proof."""

from __future__ import annotations

import logging
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt

from .durable import outbox

log = logging.getLogger("nexo_django.channels")


@method_decorator([csrf_exempt, never_cache], name="dispatch")
class ChannelEndpointView(View):
    http_method_names = ["post"]

    def get_channel(self, name: str) -> Any:
        try:
            return outbox.channel(name)
        except LookupError:
            return None

    def post(self, request: HttpRequest, name: str) -> HttpResponse:
        channel = self.get_channel(name)
        if channel is None:
            return HttpResponse("no such channel", status=404, content_type="text/plain")
        try:
            channel.verify(request)
        except outbox.Refused as exc:
            log.warning("channel %s: request refused: %s", name, exc)
            return HttpResponse(f"refused: {exc}", status=401, content_type="text/plain")
        response: HttpResponse = channel.decide(request)
        return response
