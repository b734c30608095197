import json

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from jobs.enqueue import enqueue
from jobs.exceptions import EnqueueError
from jobs.models import OnFailure
from jobs.uniqueness import UniqueWhile


class Command(BaseCommand):
    help = (
        "Enqueue one job and print its id. While another job holds --unique-key, print that "
        "job's id instead and say so on stderr. With --depends-on the job waits until those "
        "jobs have succeeded (or, by --on-failure, one has failed)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("operation")
        parser.add_argument("--payload", default="{}", help="JSON object")
        parser.add_argument("--queue")
        parser.add_argument("--priority", type=int, default=0)
        parser.add_argument("--run-after", help="ISO 8601 with a timezone")
        parser.add_argument("--max-attempts", type=int)
        parser.add_argument("--parent")
        parser.add_argument(
            "--idempotency-key", help="the same as --unique-key with --unique-while until_retention"
        )
        parser.add_argument("--unique-key", help="keep duplicates out while a job holds this key")
        parser.add_argument(
            "--unique-while",
            choices=UniqueWhile.values,
            help="how long a job holds its key (default: active, while queued or running)",
        )
        parser.add_argument(
            "--timeout-seconds", type=float, help="longest run (default: the operation's)"
        )
        parser.add_argument(
            "--retry",
            help="this job's retry override, a JSON object: backoff_seconds, "
            "backoff_max_seconds, jitter, strategy, max_retry_later, retry_later_max_seconds",
        )
        parser.add_argument(
            "--key",
            action="append",
            dest="keys",
            metavar="KEY",
            help="a flow key added to the operation's own, such as account:42 or a template "
            "filled from the payload, account:{account_id} (repeatable)",
        )
        parser.add_argument(
            "--depends-on",
            action="append",
            dest="depends_on",
            metavar="JOB_ID",
            help="a job this one waits for: it starts once every such job has succeeded "
            "(repeatable)",
        )
        parser.add_argument(
            "--on-failure",
            choices=OnFailure.values,
            help="when a job it depends on fails: cancel this one (the default), run it "
            "anyway, or hold it for an operator",
        )

    def handle(self, *args, **o) -> None:
        try:
            payload = json.loads(o["payload"])
        except json.JSONDecodeError as error:
            raise CommandError(f"--payload is not valid JSON: {error}") from error
        retry = None
        if o["retry"]:
            try:
                retry = json.loads(o["retry"])
            except json.JSONDecodeError as error:
                raise CommandError(f"--retry is not valid JSON: {error}") from error
        run_after = None
        if o["run_after"]:
            run_after = parse_datetime(o["run_after"])
            if run_after is None:
                raise CommandError("--run-after must be an ISO 8601 datetime with a timezone.")
        try:
            job = enqueue(
                o["operation"],
                payload,
                queue=o["queue"],
                priority=o["priority"],
                run_after=run_after,
                max_attempts=o["max_attempts"],
                parent=o["parent"],
                idempotency_key=o["idempotency_key"],
                unique_key=o["unique_key"],
                unique_while=o["unique_while"],
                timeout_seconds=o["timeout_seconds"],
                retry=retry,
                keys=o["keys"],
                depends_on=o["depends_on"] or None,
                on_failure=o["on_failure"],
            )
        except EnqueueError as error:
            details = "; ".join(f"{k}: {' '.join(v)}" for k, v in error.errors.items())
            raise CommandError(f"{error.message} {details}") from error
        if job.duplicate:
            self.stderr.write(
                f"duplicate: job {job.pk} ({job.status}) holds unique key {job.unique_key!r}; "
                "nothing was enqueued."
            )
        self.stdout.write(str(job.pk))
