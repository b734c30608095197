import argparse
import gc
import logging
import os
import sys

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from workers import log_capture
from workers.config import WorkerConfig
from workers.config import worker_class as load_worker_class
from workers.management import BACKEND_CHECKS


class Command(BaseCommand):
    help = "Run a worker for job queues and batch queues (the queue's kind decides)."
    requires_system_checks = BACKEND_CHECKS

    def add_arguments(self, parser) -> None:
        parser.add_argument("--queue", action="append", required=True, dest="queues")
        parser.add_argument("--concurrency", type=int, default=1, help="jobs at once (threads)")
        parser.add_argument("--processes", type=int, default=0, help="isolated child processes")
        parser.add_argument("--burst", action="store_true", help="exit once nothing is claimable")
        parser.add_argument("--name", default=None)
        parser.add_argument("--worker-id", default=None, help=argparse.SUPPRESS)
        parser.add_argument("--lease-seconds", type=float)
        parser.add_argument("--heartbeat-seconds", type=float)
        parser.add_argument("--poll-seconds", type=float)
        parser.add_argument("--shutdown-grace-seconds", type=float)
        parser.add_argument(
            "--poll-only", action="store_true", help="no LISTEN (transaction poolers)"
        )

    def handle(self, *args, **o) -> None:
        try:
            # Before any child is forked: a wrong WORKER_CLASS stops the supervisor too.
            worker_class = load_worker_class()
        except ImproperlyConfigured as error:
            raise CommandError(str(error)) from error
        # What set-up and this command's imports made lives as long as the process:
        # out of the collector's way (its full collections would walk it all again,
        # and in forked --processes children copy the pages it touches).
        gc.freeze()
        if not os.environ.get("CONTROLPLANE_LOG_LEVEL"):
            # The worker's own lines (start, stop, failures, retries) show by default;
            # CONTROLPLANE_LOG_LEVEL wins (DEBUG adds a line per claim and success).
            logging.getLogger("workers").setLevel(logging.INFO)
        if o["processes"] and o["processes"] > 1:
            from workers.supervisor import Supervisor  # only a supervisor needs it

            child_args = [a for q in o["queues"] for a in ("--queue", q)]
            child_args += ["--concurrency", str(o["concurrency"])]
            if o["burst"]:
                child_args.append("--burst")
            if o["poll_only"]:
                child_args.append("--poll-only")
            for flag in (
                "lease_seconds",
                "heartbeat_seconds",
                "poll_seconds",
                "shutdown_grace_seconds",
            ):
                if o[flag] is not None:
                    child_args += [f"--{flag.replace('_', '-')}", str(o[flag])]
            sys.exit(Supervisor(child_args, o["processes"], burst=o["burst"]).run())
        overrides = {
            k: o[k]
            for k in (
                "lease_seconds",
                "heartbeat_seconds",
                "poll_seconds",
                "shutdown_grace_seconds",
            )
            if o[k] is not None
        }
        if o["poll_only"]:
            overrides["poll_only"] = True
        if o["name"]:
            overrides["name"] = o["name"]
        try:
            config = WorkerConfig(
                queues=tuple(dict.fromkeys(o["queues"])),
                concurrency=o["concurrency"],
                burst=o["burst"],
                worker_id=o["worker_id"],
                **overrides,
            )
        except ValueError as error:
            raise CommandError(str(error)) from error
        # What operations log and print goes to their jobs' logs (JOB_LOG_CAPTURE).
        log_capture.install()
        code = worker_class(config).run()
        sys.stdout.flush()
        sys.stderr.flush()
        if code != 0:
            os._exit(code)  # do not wait for operation threads that ran past the grace
        sys.exit(0)
