"""``manage.py nexo_insight --rebuild``: count the whole decision history again into the approvals
dashboard's tallies (docs/admin.md, "The approvals dashboard").

Each decision adds to the tallies in its own commit; an installation that had decisions before
the tallies existed (or whose tallies were edited by hand) counts its history once with this. It
reads the decisions in chunks by primary key, in one transaction: the dashboard shows the old
tallies until it commits, then the new ones.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from nexo_django.durable.insight import tally


class Command(BaseCommand):
    help = "Count the decision history again into the approvals dashboard's tallies (--rebuild)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rebuild", action="store_true", help="empty the tallies and count every decision again")
        parser.add_argument("--chunk", type=int, default=20_000, help="decisions read at a time (default 20000)")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["rebuild"]:
            raise CommandError("say what to do: manage.py nexo_insight --rebuild counts every decision again")
        if options["chunk"] < 1:
            raise CommandError(f"--chunk {options['chunk']}: read at least one decision at a time")
        counted = tally.rebuild(chunk=options["chunk"])
        self.stdout.write(f"counted {counted} decisions into the approvals dashboard's tallies")
