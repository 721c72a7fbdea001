"""Decision channels (docs/channels.md): where people hear of waiting calls and decide them.

``base.Channel`` is the documented base (send, verify, decide); ``webhook`` and ``slack`` are the
channels the app ships; ``signing`` holds the signature checks, importable on their own (a webhook
receiver verifies its requests with :func:`nexo_django.channels.signing.verify_signature`)."""
