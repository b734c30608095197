"""``manage.py workflow start|show|cancel``: workflows from a shell.

- ``start FILE.json`` (or ``-`` for stdin): the JSON of ``jobs.workflow_specs``
  (as ``POST /workflows`` and workflow schedules take it), started in one
  transaction with its ``start_workflow`` audit row; prints the new
  workflow's id.
- ``show ID``: its status, result, step counts and steps (``--json``: one line).
- ``cancel ID``: cancels its queued and running steps, with ``--reason``,
  through ``jobs.operator_actions.cancel_workflow`` (audited), as ``--by``
  (default: the login name), as ``manage.py jobs cancel`` does for jobs.

Exit codes: 0 done; 1 no such workflow, or nothing to cancel (it had ended);
2 bad input (unreadable file, not JSON, a workflow refused by field, an id
that is not a UUID), with the reason on stderr.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from django_controlplane.management import jobs_cli as cli
from jobs import audit, operator_actions
from jobs.exceptions import EnqueueError
from jobs.models import Job, Workflow
from jobs.schedules.workflow_check import workflow_problems
from jobs.workflow_specs import start_workflow
from jobs.workflows import ACTIVE_WORKFLOW, step_counts

DEFAULT_STEPS = 50
NOT_FOUND = 1


class Command(BaseCommand):
    help = (
        "Start a workflow from JSON, show one, or cancel one. "
        "See 'manage.py workflow SUBCOMMAND --help'."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")

        start = sub.add_parser(
            "start",
            help="Start a workflow from a JSON file ('-': standard input); print its id.",
            description='The JSON: {"name": ..., "on_failure": "cancel"|"run"|"hold", '
            '"steps": [{"name": ..., "operation": ..., "payload": {...}, '
            '"depends_on": ["<step name>", ...]}, ...]} (docs/operations-and-cli.md).',
        )
        start.add_argument("file", metavar="FILE", help="A JSON file, or '-' for stdin.")
        cli.add_actor(start)

        show = sub.add_parser("show", help="A workflow's status, result and steps.")
        show.add_argument("workflow_id", metavar="ID")
        show.add_argument(
            "--steps",
            type=cli.limit,
            default=DEFAULT_STEPS,
            help=f"Show at most this many steps (default {DEFAULT_STEPS}).",
        )
        show.add_argument("--json", action="store_true", help="One line of JSON.")

        cancel = sub.add_parser(
            "cancel", help="Cancel a workflow's queued and running steps (audited)."
        )
        cancel.add_argument("workflow_id", metavar="ID")
        cancel.add_argument("--reason", default="", help="Written into each step's timeline.")
        cli.add_actor(cancel)

    def handle(self, *args: Any, **o: Any) -> None:
        getattr(self, f"_{o['subcommand']}")(o)

    def _start(self, o: dict[str, Any]) -> None:
        by = cli.actor(o["by"])
        spec = read_spec(o["file"])
        problems = workflow_problems(spec, prefix="")
        if problems:  # named by step, as start_workflow does not always
            raise cli.usage(refusal(EnqueueError("The workflow was not started.", problems)))
        try:
            with transaction.atomic():
                run = start_workflow(spec)
                steps = Job.objects.filter(workflow=run).count()
                audit.record_action(by, audit.START_WORKFLOW, target=str(run.pk), count=steps)
        except EnqueueError as error:
            raise cli.usage(refusal(error)) from None
        self.stdout.write(str(run.pk))

    def _show(self, o: dict[str, Any]) -> None:
        run = existing(o["workflow_id"])
        steps = list(
            Job.objects.filter(workflow=run)
            .order_by("created_at", "id")
            .values_list("step", "operation", "status", "id")[: o["steps"]]
        )
        counts = step_counts(run.pk)
        if o["json"]:
            self.stdout.write(cli.to_json(workflow_json(run, counts, steps)))
            return
        total = sum(counts.values())
        lines = [
            f"id          {run.pk}",
            f"name        {cli.field_text(run.name)}",
            f"status      {run.status}",
            f"on_failure  {run.on_failure}",
            f"schedule    {run.schedule_id or '-'}",
            f"created     {cli.when(run.created_at, ms=True)}",
            f"finished    {cli.when(run.finished_at, ms=True)}",
            f"result      {cli.field_text(run.result)}",
            f"steps       {total} ("
            + ", ".join(f"{status} {n}" for status, n in counts.items())
            + ")",
            "",
            *cli.table(
                ["STEP", "OPERATION", "STATUS", "JOB"],
                [[cli.clip(s), cli.clip(op), status, str(pk)] for s, op, status, pk in steps],
            ),
        ]
        if total > len(steps):
            lines.append(f"… {total - len(steps)} more (--steps N shows more)")
        self.stdout.write("\n".join(lines))

    def _cancel(self, o: dict[str, Any]) -> None:
        by, reason = cli.actor(o["by"]), cli.reason(o["reason"])
        run = existing(o["workflow_id"])
        try:  # audited even when it had ended, as every face's cancel is
            changed = operator_actions.cancel_workflow(run.pk, user=by, reason=reason or None)
        except Workflow.DoesNotExist:  # deleted in between
            raise CommandError(
                f"No workflow with id {run.pk} exists.", returncode=NOT_FOUND
            ) from None
        if run.status not in ACTIVE_WORKFLOW:
            raise CommandError(
                f"Nothing was changed: workflow {run.pk} had already ended ({run.status}).",
                returncode=NOT_FOUND,
            )
        self.stdout.write(f"cancelled workflow {run.pk}: {cli.count(changed)} cancelled")


def read_spec(name: str) -> Any:
    """The JSON of ``name`` (``-``: standard input); refusals are usage errors (exit 2)."""
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise cli.usage(f"Cannot read {cli.clip(name)!r}: {error}") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as error:
        raise cli.usage(f"{cli.clip(name)!r} is not valid JSON: {error}") from None


def refusal(error: EnqueueError) -> str:
    """The refusal with every field's messages, one per line."""
    lines = [error.message]
    for field, messages in (error.errors or {}).items():
        lines.extend(f"  {cli.safe(field)}: {cli.safe(m)}" for m in messages)
    return "\n".join(lines)


def existing(raw: str) -> Workflow:
    """The workflow ``raw`` names: a malformed id is bad input (2), an unknown one 1."""
    try:
        pk = uuid.UUID(raw.strip())
    except ValueError:
        raise cli.usage(f"{cli.clip(raw)!r} is not a workflow id: ids are UUIDs.") from None
    run = Workflow.objects.filter(pk=pk).first()
    if run is None:
        raise CommandError(f"No workflow with id {pk} exists.", returncode=NOT_FOUND)
    return run


def workflow_json(
    run: Workflow, counts: dict[str, int], steps: list[tuple[str, str, str, uuid.UUID]]
) -> dict[str, Any]:
    return {
        "id": run.pk,
        "name": run.name,
        "status": run.status,
        "on_failure": run.on_failure,
        "schedule": run.schedule_id,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "result": run.result,
        "step_counts": counts,
        "steps": [
            {"step": step, "operation": op, "status": status, "job": pk}
            for step, op, status, pk in steps
        ],
    }
