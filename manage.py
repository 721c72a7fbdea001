#!/usr/bin/env python
"""Django's command-line utility, at the repository root: it runs the example project.

``python manage.py migrate``, ``python manage.py nexo_demo``, ``python manage.py runserver``,
``python manage.py rqworker default`` (with REDIS_URL set). Same as example_project/manage.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    # The agents import as ``example_project.*`` in every process that resumes a run.
    sys.path[0] = str(Path(__file__).resolve().parent)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
