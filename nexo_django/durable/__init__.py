"""Durable runs on the ORM and django-rq: the core's loop with a database journal."""
