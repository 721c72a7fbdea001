#!/usr/bin/env python
"""Django's command-line utility for the example project."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    # Import the project as ``example_project`` from the repository root, here, in rq workers
    # and in the tests alike: a run stores its agent's dotted path, and every process that
    # resumes it must import the agent under that same name.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
