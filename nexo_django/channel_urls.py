"""The channels' endpoint: ``path("nexo/channels/", include("nexo_django.channel_urls"))``; a
channel named ``ops`` receives on ``nexo/channels/ops/`` (name ``nexo_channels:channel_endpoint``)."""

from __future__ import annotations

from django.urls import path

from .channel_views import ChannelEndpointView

app_name = "nexo_channels"

urlpatterns = [path("<str:name>/", ChannelEndpointView.as_view(), name="channel_endpoint")]
