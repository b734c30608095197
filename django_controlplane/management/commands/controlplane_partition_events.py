"""Partition the events table by job id range, or make it plain again (``jobs.event_layout``)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import NotSupportedError

from jobs.event_layout import rebuild_event_table
from jobs.partitions import event_partitions


class Command(BaseCommand):
    help = (
        "PostgreSQL: rebuild controlplane_jobevent partitioned by RANGE of job_id, so the "
        "reaper's retention drops whole partitions (--undo: a plain table again). One "
        "transaction under an exclusive lock on the table: stop workers first."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--undo", action="store_true", help="make the table plain again")

    def handle(self, *args, **options) -> None:
        partitioned = not options["undo"]
        try:
            changed = rebuild_event_table(partitioned=partitioned)
        except NotSupportedError as exc:
            raise CommandError(str(exc)) from exc
        layout = f"partitioned ({len(event_partitions())} ranges)" if partitioned else "plain"
        verb = "is now" if changed else "was already"
        self.stdout.write(f"controlplane_jobevent {verb} {layout}.")
