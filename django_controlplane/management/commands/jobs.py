"""``manage.py jobs list|show|cancel|retry|purge``: the operator's actions, from a shell.

Thin over what the REST API and the dashboard already use, so the shell sees
and changes jobs exactly as they do:

- filters are read by ``jobs.selectors.job_filters_from_query`` (the spellings
  ``GET /jobs`` accepts), and lists page newest first through ``job_list``;
- ``--json`` prints the API's job JSON (``django_controlplane.api.serializers``);
- cancel and retry of named jobs go through ``jobs.operator_actions``; by
  filter, through the API's batched walk (``jobs.bulk_actions``). Either way
  each change is a guarded transition whose event
  carries ``by`` (``--by``, the login name by default), and an
  ``OperatorAction`` row records it, the filter once for a bulk action;
- purge deletes finished jobs (never queued or running ones) in batches,
  leaves first like the reaper's retention, and records one ``OperatorAction``.

Exit codes: 0 when something was shown or done; 1 when nothing was done
(nothing matched, a refused change, an unknown job, a bulk action without
``--yes``); 2 for bad usage (options argparse refuses, and values no filter
accepts such as an unknown status or a malformed id). Options and output
helpers are in ``django_controlplane.management.jobs_cli``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from django_controlplane.api.serializers import EventSerializer, JobDetailSerializer, JobSerializer
from django_controlplane.management import jobs_cli as cli
from jobs import audit, bulk_actions, operator_actions, selectors
from jobs.conf import knob
from jobs.models import Job, JobEvent
from jobs.states import TERMINAL

FILTERS = selectors.FILTER_KEYS
PURGE_FILTERS = ("status", "queue", "operation")
FINISHED = tuple(sorted(s.value for s in TERMINAL))
PAST = {"cancel": "cancelled", "retry": "retried"}


class Command(BaseCommand):
    help = (
        "Inspect and act on jobs: list, show, cancel, retry, purge; pause and resume queues. "
        "Filters are those of GET /jobs; see 'manage.py jobs SUBCOMMAND --help'."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")

        listing = sub.add_parser("list", help="Jobs matching the filters, newest first.")
        cli.add_filters(listing)
        listing.add_argument(
            "--limit",
            type=cli.limit,
            default=cli.DEFAULT_LIMIT,
            help=f"At most this many jobs (1 to {cli.MAX_LIMIT}, default {cli.DEFAULT_LIMIT}).",
        )
        listing.add_argument("--json", action="store_true", help="One job JSON per line.")

        show = sub.add_parser("show", help="One job's fields and its timeline.")
        show.add_argument("job_id", metavar="ID")
        show.add_argument("--json", action="store_true", help="The job JSON with its events.")

        for name, what in (
            ("cancel", "Cancel queued or running jobs (and their descendants)."),
            ("retry", "Put failed or cancelled jobs back on their queues."),
        ):
            act = sub.add_parser(
                name,
                help=what,
                description=f"{what} Name them by id, or by a filter: a filter only "
                "counts them unless --yes is given.",
            )
            act.add_argument("job_ids", nargs="*", metavar="ID")
            cli.add_filters(act)
            act.add_argument("--all", action="store_true", help="Every job, without a filter.")
            act.add_argument("--yes", action="store_true", help="Go ahead with a bulk action.")
            act.add_argument("--reason", default="", help="Written into each job's timeline.")
            cli.add_actor(act)

        for name, what in (
            ("pause", "Stop workers claiming from these queues (running jobs go on)."),
            ("resume", "Let workers claim from these queues again."),
        ):
            toggle = sub.add_parser(name, help=what, description=what)
            toggle.add_argument("queues", nargs="+", metavar="QUEUE")
            cli.add_actor(toggle)

        purge = sub.add_parser(
            "purge", help="Delete finished jobs (succeeded, failed, cancelled) and their events."
        )
        purge.add_argument(
            "--older-than",
            required=True,
            type=cli.age,
            metavar="AGE",
            help="Finished longer ago than this: 7d, 12h, 30m, 45s or plain seconds.",
        )
        purge.add_argument(
            "--status",
            action="append",
            metavar="STATUS",
            help="Default: all of " + ", ".join(FINISHED),
        )
        purge.add_argument("--queue", action="append", metavar="QUEUE")
        purge.add_argument("--operation", action="append", metavar="OPERATION")
        purge.add_argument("--dry-run", action="store_true", help="Count, delete nothing.")
        purge.add_argument(
            "--batch-size",
            type=cli.batch_size,
            default=None,
            help="Jobs deleted per transaction (default: RETENTION_BATCH_SIZE).",
        )
        purge.add_argument("--reason", default="", help="Kept in the audit log.")
        cli.add_actor(purge)

    def handle(self, *args: Any, **options: Any) -> None:
        handler = {
            "list": self.list_jobs,
            "show": self.show_job,
            "cancel": self.act,
            "retry": self.act,
            "purge": self.purge,
            "pause": self.pause_or_resume,
            "resume": self.pause_or_resume,
        }[options["subcommand"]]
        handler(options)

    # --- list and show -----------------------------------------------------------

    def list_jobs(self, o: dict[str, Any]) -> None:
        jobs, more = newest_jobs(cli.filters(o, FILTERS), o["limit"])
        if o["json"]:
            for job in jobs:
                self.stdout.write(cli.to_json(JobSerializer(job).data))
        elif jobs:
            rows = [
                [
                    str(job.pk),
                    cli.clip(job.operation),
                    cli.clip(job.queue),
                    job.status,
                    f"{job.attempts}/{job.max_attempts}",
                    cli.when(job.created_at),
                ]
                for job in jobs
            ]
            headers = ["ID", "OPERATION", "QUEUE", "STATUS", "ATTEMPTS", "CREATED (UTC)"]
            self._lines(cli.table(headers, rows))
        else:
            self.stdout.write("No job matches.")
        if more:
            self.stderr.write(
                f"More jobs match than the {len(jobs)} shown: raise --limit "
                f"(up to {cli.MAX_LIMIT}) or narrow the filters."
            )

    def show_job(self, o: dict[str, Any]) -> None:
        job = cli.existing_jobs([cli.job_id(o["job_id"])])[0]
        job.children_counts = selectors.job_children_counts(job.pk)
        data = dict(JobDetailSerializer(job).data)
        events = list(timeline(job.pk))
        if o["json"]:
            events_json = EventSerializer(events, many=True).data
            self.stdout.write(cli.to_json({**data, "events": events_json}))
            return
        children = data.pop("children")
        if any(children.values()):
            data["children"] = " ".join(f"{state}={n}" for state, n in children.items())
        width = max(len(key) for key in data)
        self._lines(f"{key:<{width}}  {cli.field_text(value)}" for key, value in data.items())
        self.stdout.write("")
        self.stdout.write(f"Timeline ({cli.count(len(events)).replace('job', 'event')})")
        rows = [
            [str(e.seq), cli.when(e.ts, ms=True), e.level, cli.clip(e.event), cli.clip(e.message)]
            for e in events
        ]
        self._lines(cli.table(["SEQ", "TS (UTC)", "LEVEL", "EVENT", "MESSAGE"], rows))

    # --- cancel and retry --------------------------------------------------------

    def act(self, o: dict[str, Any]) -> None:
        action = o["subcommand"]
        ids = list(dict.fromkeys(cli.job_id(raw) for raw in o["job_ids"]))
        filters = cli.filters(o, FILTERS)
        by, reason = cli.actor(o["by"]), cli.reason(o["reason"])
        if ids and (not filters.is_empty or o["all"]):
            raise cli.usage("Name the jobs either by id or by a filter, not both.")
        if ids:
            self._act_on_ids(action, ids, by=by, reason=reason)
        elif filters.is_empty and not o["all"]:
            raise cli.usage(
                f"Name the jobs to {action}: ids, a filter (--status, --queue, --operation, "
                "--parent, --q, --created-after, --created-before, …), or --all for every job."
            )
        else:
            self._act_on_filter(action, filters, by=by, reason=reason, go=o["yes"])

    def _act_on_ids(self, action: str, ids: list[uuid.UUID], *, by: str, reason: str) -> None:
        """Each named job through the one-job service (its event and audit row)."""
        cli.existing_jobs(ids)  # an unknown id stops everything before anything changes
        one = operator_actions.cancel_job if action == "cancel" else operator_actions.retry_job
        allowed = " or ".join(bulk_actions.ACTIONS[action])
        changed = 0
        for pk in ids:
            if one(pk, user=by, reason=reason):
                changed += 1
                self.stdout.write(f"{PAST[action].capitalize()} job {pk}.")
                continue
            status = Job.objects.filter(pk=pk).values_list("status", flat=True).first()
            self.stderr.write(
                f"Job {pk} is {status or 'gone'}: only {allowed} jobs can be "
                f"{PAST[action]}; it was left as it is."
            )
        if not changed:
            raise CommandError("Nothing was changed.", returncode=1)

    def _act_on_filter(
        self, action: str, filters: selectors.JobFilters, *, by: str, reason: str, go: bool
    ) -> None:
        """Count first; with ``go`` (``--yes``) change them in batches and audit it once."""
        statuses = bulk_actions.ACTIONS[action]
        eligible = selectors.job_queryset(filters).filter(status__in=statuses).order_by().count()
        if not eligible:
            raise CommandError(
                f"No {' or '.join(statuses)} job matches: nothing to {action}.", returncode=1
            )
        if not go:
            also = " (and their queued or running descendants)" if action == "cancel" else ""
            self.stdout.write(f"{cli.count(eligible)} would be {PAST[action]}{also}.")
            raise CommandError(
                f"Nothing was changed: run again with --yes to {action} them.", returncode=1
            )
        bulk = bulk_actions.bulk_cancel if action == "cancel" else bulk_actions.bulk_retry
        changed = bulk(
            filters, user=by, reason=reason, described={"scope": "filter", **filters.describe()}
        )
        self.stdout.write(f"{PAST[action].capitalize()} {cli.count(changed)}.")
        if not changed:
            raise CommandError("Nothing was changed.", returncode=1)

    # --- purge -------------------------------------------------------------------

    # --- queues -----------------------------------------------------------------

    def pause_or_resume(self, o: dict[str, Any]) -> None:
        """Each queue through the audited service the API and the dashboard use."""
        paused = o["subcommand"] == "pause"
        by = cli.actor(o["by"])
        for name in dict.fromkeys(o["queues"]):
            if not name.strip() or len(name) > 200:
                raise cli.usage(f"{name!r}: a queue name is 1 to 200 characters.")
            if reason := selectors.unstorable_text(name):
                raise cli.usage(f"{name!r}: {reason}")
            operator_actions.set_paused(name, paused, user=by)
            self.stdout.write(f"{'Paused' if paused else 'Resumed'} queue {name}.")

    def purge(self, o: dict[str, Any]) -> None:
        filters = cli.filters(o, PURGE_FILTERS)
        active = [s for s in filters.status if s not in FINISHED]
        if active:
            raise cli.usage(
                f"purge only deletes finished jobs: --status must be {', '.join(FINISHED)}, "
                f"not {', '.join(active)}."
            )
        age: timedelta = o["older_than"]
        try:
            cutoff = timezone.now() - age
        except OverflowError:
            raise cli.usage(
                "--older-than reaches back before year 1: give a shorter age."
            ) from None
        before = f"finished before {cli.when(cutoff)} UTC"
        if o["dry_run"]:
            n = purgeable(filters, cutoff).count()
            self.stdout.write(f"{cli.count(n)} {before} would be deleted (dry run: none was).")
            return
        by, reason = cli.actor(o["by"]), cli.reason(o["reason"])
        size = o["batch_size"] or int(knob("RETENTION_BATCH_SIZE"))
        deleted = 0
        try:
            for n in purge_batches(filters, cutoff, size):
                deleted += n
        finally:
            audit.record_action(
                by,
                audit.PURGE,
                target=before,
                count=deleted,
                filters={"older_than_seconds": age.total_seconds(), **filters.describe()},
                reason=reason,
            )
        self.stdout.write(f"Deleted {cli.count(deleted)} {before}.")
        if not deleted:
            raise CommandError("Nothing was deleted.", returncode=1)

    def _lines(self, lines: Any) -> None:
        for line in lines:
            self.stdout.write(line)


# --- reads -----------------------------------------------------------------------------


def newest_jobs(filters: selectors.JobFilters, limit: int) -> tuple[list[Job], bool]:
    """Up to ``limit`` jobs, newest first, through the API's keyset pages; and whether
    more match."""
    jobs: list[Job] = []
    cursor: str | None = None
    while True:
        size = min(limit - len(jobs), selectors.MAX_PAGE_SIZE)
        page = selectors.job_list(filters, cursor, size)
        jobs.extend(page.results)
        cursor = page.next_cursor
        if cursor is None or len(jobs) >= limit:
            return jobs, cursor is not None


def timeline(job_id: uuid.UUID) -> Iterator[JobEvent]:
    """Every event of the job, ascending, a page at a time."""
    after = 0
    while True:
        page = selectors.job_events_after(job_id, after, selectors.MAX_EVENT_LIMIT)
        yield from page
        if len(page) < selectors.MAX_EVENT_LIMIT:
            return
        after = page[-1].seq


# --- purge -----------------------------------------------------------------------------


def finished(filters: selectors.JobFilters, cutoff: datetime) -> QuerySet[Job]:
    """Finished jobs matching ``filters`` that finished before ``cutoff``."""
    qs = Job.objects.filter(status__in=filters.status or FINISHED, finished_at__lt=cutoff)
    return filters.apply(qs).order_by()


def _kept(filters: selectors.JobFilters, cutoff: datetime) -> Q:
    """The jobs a purge keeps: the negation of ``finished`` (purge filters only)."""
    kept = (
        ~Q(status__in=filters.status or FINISHED)
        | Q(finished_at__isnull=True)
        | Q(finished_at__gte=cutoff)
    )
    if filters.queue:
        kept |= ~Q(queue__in=filters.queue)
    if filters.operation:
        kept |= ~Q(operation__in=filters.operation)
    return kept


def purgeable(filters: selectors.JobFilters, cutoff: datetime) -> QuerySet[Job]:
    """What a purge deletes, for ``--dry-run``: matching jobs with no child it keeps.

    Exact for jobs with children and no deeper descendants; a grandchild that
    is kept also keeps its grandparent, which this still counts.
    """
    kept_child = Job.objects.filter(_kept(filters, cutoff), parent_id=OuterRef("pk"))
    return finished(filters, cutoff).filter(~Exists(kept_child))


def purge_batches(filters: selectors.JobFilters, cutoff: datetime, size: int) -> Iterator[int]:
    """Delete up to ``size`` jobs per transaction until none is left; yield each batch's count.

    Leaves first, as the reaper's retention does: a job with children stays
    while they exist, so a parent goes in a later batch, and a job whose
    children this purge keeps (still running, or outside the filter) is
    never deleted from under them. On PostgreSQL the pick locks its rows and
    skips locked ones (a retry in flight, the reaper, another purge); the
    DELETE repeats every condition; the ORM deletes the jobs' events, batch
    messages and receipts with them (Django's cascade), in the same
    transaction. Not the reaper's ``delete_finished_jobs``: that one takes no
    filters.
    """
    while True:
        with transaction.atomic():
            leaves = finished(filters, cutoff).filter(
                ~Exists(Job.objects.filter(parent_id=OuterRef("pk")))
            )
            pick = leaves
            if connection.features.has_select_for_update_skip_locked:
                pick = pick.select_for_update(skip_locked=True, of=("self",))
            ids = list(pick.values_list("pk", flat=True)[:size])
            if not ids:
                return
            _, per_model = leaves.filter(pk__in=ids).only("pk").delete()
        deleted = per_model.get(Job._meta.label, 0)
        if not deleted:
            return  # every picked job changed meanwhile; picking again would find the same
        yield deleted
