"""The example project: the three steps of using nexo_django, and nothing more (docs/example.md)."""
