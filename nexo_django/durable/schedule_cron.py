"""rq's cron configuration for the schedules: ``python manage.py rqcron nexo_django.durable.schedule_cron``.

rq's cron scheduler (django-rq's ``rqcron``) enqueues :func:`~nexo_django.durable.jobs.tick_schedules`
on the run queue every ``NEXO["SCHEDULE_TICK"]`` seconds; a worker runs it. Several cron
schedulers may run (one per machine): each tick is a compare-and-set per slot, so each slot
still starts one run. Loaded by ``rqcron`` once Django is set up.
"""

from __future__ import annotations

from rq import cron

from ..conf import nexo_settings
from . import dispatch
from .jobs import tick_schedules

TICK = cron.register(tick_schedules, dispatch.queue_name(), interval=int(nexo_settings.SCHEDULE_TICK),
                     job_timeout=300, result_ttl=600, failure_ttl=24 * 3600)
