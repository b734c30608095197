"""Rename a database made before the ``controlplane`` app label (see ``jobs.relabel``)."""

from __future__ import annotations

from django.core.management.base import BaseCommand
from django.db import DEFAULT_DB_ALIAS, connections

from jobs.relabel import relabel


class Command(BaseCommand):
    help = (
        "Once, before `migrate`, on a database made by a version whose tables were jobs_*: "
        "rename them to controlplane_* and relabel the migration and permission records. "
        "Does nothing on any other database."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)

    def handle(self, *args, **options) -> None:
        renamed = relabel(connections[options["database"]])
        if renamed:
            self.stdout.write(f"Renamed {len(renamed)} tables: {', '.join(renamed)}.")
        else:
            self.stdout.write("Nothing to rename: no tables of the old jobs_* layout here.")
