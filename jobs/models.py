"""Job, JobEvent, Worker, Queue and batch messages.

Hot-path writes (claim, lease, finish, progress) are raw SQL in
``jobs.transitions``; the ORM serves everything else. Invariants live in the
database too: check constraints, a partial index over claimable rows only
(so the claim stays an index range scan beside millions of finished rows),
and a unique ``(job, seq)`` for the timeline.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone

from jobs.events import RECLAIM_EVENTS
from jobs.states import ACTIVE, TERMINAL, Status, TextChoices
from jobs.uniqueness import HOLDS_KEY, UniqueWhile

PRIORITY_MIN, PRIORITY_MAX = -100, 100


class QueueKind(TextChoices):
    JOB = "job", "Job rows"
    BATCH = "batch", "Batch messages"


class Queue(models.Model):
    """Per-queue settings. A queue exists implicitly once a job names it."""

    name = models.CharField(primary_key=True, max_length=200)
    kind = models.CharField(max_length=10, choices=QueueKind.choices, default=QueueKind.JOB)
    paused = models.BooleanField(default=False)
    concurrency_cap = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most jobs running at once across all workers."
    )
    rate_limit_per_second = models.FloatField(
        null=True, blank=True, help_text="Most jobs started per second across all workers."
    )
    # The rate limit's token bucket, refilled at rate_limit_per_second and spent
    # by claims under the queue row's lock (jobs.claims).
    rate_tokens = models.FloatField(default=0)
    rate_refilled_at = models.DateTimeField(null=True, blank=True)
    # Days finished jobs of this queue are kept, by status ({"succeeded": 0.5}; "*": any
    # other status), set by an operator (jobs.retention); NULL: the settings' retention.
    retention_days = models.JSONField(null=True, blank=True)
    # Set once a job with flow keys was enqueued here (jobs.fair_turns): workers then
    # claim its keyed jobs through jobs.keyed_claims as well.
    keyed = models.BooleanField(default=False, db_default=False)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def default_kind(name: str) -> str:
        """Queues named ``*.batch`` and ``*.write`` carry batch messages by convention."""
        return QueueKind.BATCH if name.endswith((".batch", ".write")) else QueueKind.JOB


class KeyLimit(models.Model):
    """The limits of a flow key family (``account``) or of one key (``account:42``).

    A job's key ``account:42`` obeys the row named ``account:42`` if there is
    one, else the row of its family ``account`` (jobs.key_limits).
    """

    name = models.CharField(primary_key=True, max_length=200)
    concurrency = models.PositiveIntegerField(null=True, blank=True)
    rate = models.FloatField(null=True, blank=True)  # tokens per second
    burst = models.FloatField(null=True, blank=True)  # the bucket's size; None: max(1, rate)
    weight = models.FloatField(default=1.0, db_default=1.0)  # turns per round of fair dispatch
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.name


class FlowKey(models.Model):
    """One flow key in use: the row a keyed claim locks, and its rate bucket (jobs.keyed_claims)."""

    key = models.CharField(primary_key=True, max_length=200)
    tokens = models.FloatField(default=0, db_default=0)
    refilled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.key


class FairLane(models.Model):
    """A flow key's place in a queue's fair dispatch: the last turn it gave (jobs.fair_turns)."""

    queue = models.CharField(max_length=200)
    key = models.CharField(max_length=200)
    last_turn = models.FloatField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "key"], name="fairlane_queue_key")]
        indexes = [models.Index(fields=["queue", "-last_turn"], name="fairlane_turn_idx")]

    def __str__(self) -> str:
        return f"{self.queue}/{self.key}"


class WorkerKind(TextChoices):
    LOCAL = "local", "Local (database)"
    REMOTE = "remote", "Remote (HTTP)"


class Worker(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200, blank=True, default="")
    kind = models.CharField(max_length=10, choices=WorkerKind.choices, default=WorkerKind.LOCAL)
    hostname = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    queues = models.JSONField(default=list)
    operations = models.JSONField(default=list, blank=True)
    concurrency = models.PositiveIntegerField(default=1)
    started_at = models.DateTimeField(default=timezone.now)
    last_heartbeat = models.DateTimeField(default=timezone.now, db_index=True)
    # Set once the worker holds its liveness lock (PostgreSQL): see workers.liveness.
    liveness_lock = models.BooleanField(default=False)
    # Its pre_dequeue said "not now" (workers.holding): no claim until then, and why.
    holding_until = models.DateTimeField(null=True, blank=True)
    holding_reason = models.TextField(blank=True, default="")
    user = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"{self.name or self.hostname}:{self.pid}"


class JobQuerySet(models.QuerySet):
    def active(self) -> JobQuerySet:
        return self.filter(status__in=ACTIVE)

    def finished(self) -> JobQuerySet:
        return self.filter(status__in=TERMINAL)

    def expired_leases(self, now=None) -> JobQuerySet:
        return self.filter(status=Status.RUNNING, leased_until__lt=now or timezone.now())


class Job(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    operation = models.CharField(max_length=200)
    queue = models.CharField(max_length=200, default="default")
    payload = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    priority = models.SmallIntegerField(default=0)
    # NULL while the job waits for its dependencies (jobs.dependencies): no claim,
    # whichever path, matches ``run_after <= now`` until the last one releases it.
    run_after = models.DateTimeField(default=timezone.now, null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=1)
    lease_requeues = models.PositiveIntegerField(default=0)
    # Indexed by job_parent_idx (parent, status) WHERE parent IS NOT NULL.
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="children",
        db_index=False,
    )
    progress_current = models.IntegerField(default=0)
    progress_total = models.IntegerField(null=True, blank=True)
    leased_until = models.DateTimeField(null=True, blank=True)
    lease_token = models.UUIDField(null=True, blank=True)
    # No database FK: a finished job keeps naming the worker that ran it.
    worker = models.ForeignKey(
        Worker,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,  # job_worker_idx (worker) WHERE status = 'running' covers it
        related_name="jobs",
    )
    result = models.JSONField(null=True, blank=True)
    error_code = models.CharField(max_length=200, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Per job (enqueue) or from its operation; NULL: only the reaper's global timeout.
    timeout_seconds = models.FloatField(null=True, blank=True)
    # The schedule that fired this job (job_schedule_idx).
    schedule = models.ForeignKey(
        "Schedule",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="jobs",
        db_index=False,
    )
    # The enqueuer's OpenTelemetry context ({"traceparent": …, "tracestate": …}),
    # the parent of each run's span (jobs.tracing); NULL when nothing was traced.
    trace_context = models.JSONField(null=True, blank=True)
    # The job's own retry policy override, given at enqueue (jobs.retry_policy): backoff
    # numbers and strategy; NULL: its operation's policy and the knobs.
    retry_policy = models.JSONField(null=True, blank=True)
    # How often the job asked to run later (RetryLaterError) since enqueue or an operator's
    # retry: bounded by its policy's max_retry_later.
    retry_laters = models.IntegerField(default=0, db_default=0)
    # Unique jobs (jobs.uniqueness): NULL, not "", when unkeyed; the partial
    # unique index job_unique_key_held covers only rows that hold their key.
    unique_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    unique_while = models.CharField(  # noqa: DJ001
        max_length=16, choices=UniqueWhile.choices, null=True, blank=True
    )
    # Timeline bookkeeping: the next event's seq is last_event_seq + 1, taken
    # under the job's row lock so seqs commit in order and never leave gaps.
    last_event_seq = models.IntegerField(default=0)
    last_event_at = models.DateTimeField(null=True, blank=True)
    # Flow control by key (jobs.flow_keys): the job's keys, the first of which
    # (``fair_key``) places it in its queue's fair dispatch at ``fair_turn``.
    # NULL on unkeyed jobs, which the usual claim serves.
    flow_keys = models.JSONField(null=True, blank=True)
    fair_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    fair_turn = models.FloatField(null=True, blank=True)
    # How much priority aging added to ``priority`` while the job waited (jobs.aging).
    priority_aged = models.SmallIntegerField(default=0, db_default=0)
    # Dependencies (jobs.dependencies): how many of the job's dependencies are not met
    # yet, and whether jobs wait for this one (its end must release them, in its
    # transaction). ``workflow``/``step``: the workflow it is a step of (jobs.workflows).
    waiting_for = models.IntegerField(default=0, db_default=0)
    has_dependents = models.BooleanField(default=False, db_default=False)
    workflow = models.ForeignKey(
        "Workflow",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="steps",
        db_index=False,  # job_workflow_idx
    )
    step = models.CharField(max_length=200, blank=True, default="", db_default="")

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        permissions = [("run_remote_jobs", "Can run jobs as a remote worker")]
        constraints = [
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN) & Q(priority__lte=PRIORITY_MAX),
                name="job_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in Status]), name="job_status_valid"
            ),
            models.CheckConstraint(
                # Sorted: a frozenset's order changes with the hash seed, and
                # makemigrations would then see a new constraint on every run.
                condition=~Q(status__in=sorted(s.value for s in TERMINAL))
                | Q(finished_at__isnull=False),
                name="job_terminal_has_finished_at",
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1), name="job_max_attempts_positive"
            ),
            models.CheckConstraint(
                condition=Q(timeout_seconds__isnull=True) | Q(timeout_seconds__gt=0),
                name="job_timeout_positive",
            ),
            models.CheckConstraint(
                condition=Q(unique_key__isnull=True, unique_while__isnull=True)
                | Q(unique_key__isnull=False, unique_while__in=UniqueWhile.values),
                name="job_unique_while_valid",
            ),
            models.UniqueConstraint(
                fields=["unique_key"], condition=HOLDS_KEY, name="job_unique_key_held"
            ),
        ]
        indexes = [
            # The claim: claimable rows only, in claim order.
            models.Index(
                "queue",
                models.F("priority").desc(),
                "run_after",
                name="job_claimable_idx",
                condition=Q(status="queued", fair_turn__isnull=True),
            ),
            # The keyed claim (jobs.keyed_claims): its window in turn order, each key's
            # best jobs, and the keyed jobs running now (the limits' counts).
            models.Index(
                "queue",
                "fair_turn",
                name="job_fair_turn_idx",
                condition=Q(status="queued", fair_turn__isnull=False),
            ),
            models.Index(
                "queue",
                "fair_key",
                models.F("priority").desc(),
                "fair_turn",
                name="job_fair_key_idx",
                condition=Q(status="queued", fair_turn__isnull=False),
            ),
            # The keyed claim's question "does any queued keyed job outrank the window?";
            # latest turn first, so its head is not the claimed jobs' dead entries.
            models.Index(
                "queue",
                models.F("priority").desc(),
                models.F("fair_turn").desc(),
                name="job_fair_priority_idx",
                condition=Q(status="queued", fair_turn__isnull=False),
            ),
            models.Index(
                "fair_key",
                name="job_running_keyed_idx",
                condition=Q(status="running", fair_key__isnull=False),
            ),
            # Lease expiry and the reaper's scans over running rows only.
            models.Index(
                "leased_until", name="job_running_lease_idx", condition=Q(status="running")
            ),
            models.Index(fields=["-created_at", "-id"], name="job_created_idx"),
            # Partial indexes below: most rows never match, so most inserts skip
            # them (bulk enqueue writes queued, parentless, unfinished rows).
            # Children of a job; ``parent_id = x`` implies the predicate.
            models.Index(
                fields=["parent", "status"],
                name="job_parent_idx",
                condition=Q(parent__isnull=False),
            ),
            # Throughput and retention: ``finished_at >= x`` / ``< x`` imply it.
            models.Index(
                fields=["status", "finished_at"],
                name="job_finished_idx",
                condition=Q(finished_at__isnull=False),
            ),
            # A worker's current jobs; every query by worker also says running.
            models.Index(fields=["worker"], name="job_worker_idx", condition=Q(status="running")),
            models.Index(fields=["queue", "status"], name="job_queue_status_idx"),
            # A workflow's steps (its page, its settling: any step still active?).
            models.Index(
                fields=["workflow", "status"],
                name="job_workflow_idx",
                condition=Q(workflow__isnull=False),
            ),
            # The jobs a schedule fired, newest first (``?schedule=``, its history).
            models.Index(
                fields=["schedule", "-created_at"],
                name="job_schedule_idx",
                condition=Q(schedule__isnull=False),
            ),
        ]

    # Set on the jobs enqueue returns: True when the key was held and this is the holder.
    duplicate = False

    def __str__(self) -> str:
        return f"{self.operation} {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    def wait(self, timeout: float) -> Job:
        """This job read again once it has ended, or as it is after ``timeout`` seconds."""
        from jobs.awaiting import wait_for_job

        return wait_for_job(self.pk, timeout, using=self._state.db or "default")

    @property
    def idempotency_key(self) -> str | None:
        """The older name of a key held until retention (``unique_while='until_retention'``)."""
        return self.unique_key if self.unique_while == UniqueWhile.UNTIL_RETENTION else None


class EventLevel(TextChoices):
    INFO = "info", "info"
    WARNING = "warning", "warning"
    ERROR = "error", "error"


class JobEvent(models.Model):
    # The unique (job, seq) index serves every lookup by job. On PostgreSQL the
    # table may be partitioned by RANGE of job_id (jobs.event_layout, opt-in):
    # its primary key is then (id, job_id); ``id`` still comes from one
    # sequence, so Django's view of it as the primary key holds.
    # No foreign key in the database: events are written only under their job's
    # row lock, and every path that deletes jobs deletes their events in the same
    # transaction, so the key's commit-time check on each event (2+ per job, about
    # a tenth of a drain's database CPU) bought nothing (migration 0019).
    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="events", db_index=False, db_constraint=False
    )
    seq = models.IntegerField()
    ts = models.DateTimeField(default=timezone.now)
    event = models.CharField(max_length=200)
    level = models.CharField(max_length=10, choices=EventLevel.choices, default=EventLevel.INFO)
    message = models.TextField(blank=True, default="")
    fields = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["job", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["job", "seq"], name="jobevent_job_seq_unique"),
            models.CheckConstraint(condition=Q(seq__gte=1), name="jobevent_seq_positive"),
        ]
        indexes = [
            # Only the reaper's rescues are searched by time (the queues page's
            # "reclaimed recently"); a full ts index would cost every event insert.
            models.Index(
                fields=["ts"],
                name="jobevent_reclaim_ts_idx",
                condition=Q(event__in=RECLAIM_EVENTS),
            )
        ]

    def __str__(self) -> str:
        return f"{self.job_id}#{self.seq} {self.event}"


class BatchMessage(models.Model):
    """An ephemeral message on a batch queue: no Job row, deleted on ack.

    Used like a message queue with a visibility timeout: a consumer claims a
    message by pushing ``visible_after`` into the future; if it dies, the
    message reappears when that time passes.
    """

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=200)
    parent = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="batch_messages")
    operation = models.CharField(max_length=200)
    batch_index = models.IntegerField()
    payload = models.JSONField(default=dict)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    visible_after = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["queue", "visible_after", "id"], name="batch_claim_idx")]

    def __str__(self) -> str:
        return f"{self.queue}#{self.pk} batch {self.batch_index} of {self.parent_id}"


class BatchReceipt(models.Model):
    """One row per written batch: makes a twice-delivered batch count once."""

    parent = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="batch_receipts")
    batch_index = models.IntegerField()
    output = models.JSONField(null=True, blank=True)
    written_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["parent", "batch_index"], name="batchreceipt_parent_index_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.parent_id} batch {self.batch_index}"


class RemoteOperation(models.Model):
    """An operation that only remote workers provide, declared at their registration.

    Soft-deleted (``deleted``) once no live worker has provided it for
    ``REMOTE_OPERATION_GRACE_SECONDS`` and no job of it is pending; declared
    again, it comes back. ``last_seen_at`` is the last time a worker that
    declares it was known alive (``jobs.remote_operations``).
    """

    name = models.CharField(primary_key=True, max_length=200)
    queue = models.CharField(max_length=200, default="default")
    payload_schema = models.JSONField(default=dict)
    max_attempts = models.PositiveIntegerField(default=1)
    deleted = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # The account that first declared it (django_controlplane.remote.workers): only it (or a
    # superuser) may declare it again or serve it. NULL: declared before owners
    # were kept; the next account to declare it becomes its owner.
    owner = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return self.name


class OperatorAction(models.Model):
    """The operators' audit log (``jobs.audit``): who did what to which jobs or queues, and why.

    ``username`` is copied at write time so the entry still names its author
    after the user is deleted (``user`` then becomes NULL).
    """

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)
    user = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    username = models.CharField(max_length=150, blank=True, default="")
    # cancel, retry, bulk_cancel, bulk_retry, pause, resume, requeue_orphan, set_cap
    action = models.CharField(max_length=50)
    # A job id, a queue name, or "filter" for bulk actions (see ``filter``).
    target = models.CharField(max_length=255, blank=True, default="")
    filter = models.JSONField(default=dict, blank=True)
    count = models.IntegerField(default=0)
    reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.username or '-'} {self.action} {self.target}"


class CatchUp(TextChoices):
    NONE = "none", "Skip missed fire times"
    ONE = "one", "Run once for all missed fire times"
    ALL = "all", "Run each missed fire time (bounded)"


class Overlap(TextChoices):
    ALLOW = "allow", "Fire even while the previous run is active"
    SKIP = "skip", "Skip a fire while the previous run is queued or running"


class Schedule(models.Model):
    """Periodic work: an operation and payload enqueued at each fire time, or a workflow
    (``workflow``, the JSON of ``jobs.workflow_specs``; ``operation`` is then "") started.

    Fired by the reaper (``jobs.schedules``). ``next_fire_at`` is the next slot
    to fire; each fired slot is a ``ScheduleFire`` row, unique per
    (schedule, fire_at), so any number of reapers fire a slot exactly once.
    Schedules declared in code (``source = code``) are kept in step with the
    code by ``name`` at start-up.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200, unique=True)
    operation = models.CharField(max_length=200, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    # Exactly one of operation and workflow (a workflow's spec: its steps carry their payloads).
    workflow = models.JSONField(null=True, blank=True)
    queue = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    priority = models.SmallIntegerField(default=0)
    # Exactly one of cron (5 fields, or 6 with seconds first) and every_seconds.
    cron = models.CharField(max_length=200, blank=True, default="")
    every_seconds = models.FloatField(null=True, blank=True)
    catch_up = models.CharField(max_length=8, choices=CatchUp.choices, default=CatchUp.ONE)
    overlap = models.CharField(max_length=8, choices=Overlap.choices, default=Overlap.ALLOW)
    paused = models.BooleanField(default=False)
    source = models.CharField(max_length=8, default="api")  # "api" or "code"
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_fire_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    # An IANA name; cron fields are read in it (last: it shadows django.utils.timezone).
    timezone = models.CharField(max_length=64, default="UTC")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=(~Q(cron="") & Q(every_seconds__isnull=True))
                | (Q(cron="") & Q(every_seconds__gt=0)),
                name="schedule_cron_xor_every",
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN) & Q(priority__lte=PRIORITY_MAX),
                name="schedule_priority_range",
            ),
            models.CheckConstraint(
                condition=(~Q(operation="") & Q(workflow__isnull=True))
                | (Q(operation="") & Q(workflow__isnull=False)),
                name="schedule_operation_xor_workflow",
            ),
        ]
        indexes = [
            # The reaper's due scan: live schedules by their next slot.
            models.Index(
                fields=["next_fire_at"], name="schedule_due_idx", condition=Q(paused=False)
            )
        ]

    def __str__(self) -> str:
        return self.name


class ScheduleFire(models.Model):
    """One fired slot of a schedule: the claim that makes a slot fire once."""

    id = models.BigAutoField(primary_key=True)
    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="fires")
    fire_at = models.DateTimeField()
    fired_at = models.DateTimeField(default=timezone.now)
    # enqueued, skipped_overlap, run_now …
    outcome = models.CharField(max_length=32, default="enqueued")
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    # The workflow a workflow schedule's fire started (``job`` stays NULL then).
    workflow = models.ForeignKey(
        "Workflow",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )

    class Meta:
        ordering = ["-fire_at"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "fire_at"], name="schedulefire_slot_unique")
        ]
        indexes = [
            # Retention deletes jobs by id and clears their fires' ``job`` in the same transaction.
            models.Index(
                fields=["job"], name="schedulefire_job_idx", condition=Q(job__isnull=False)
            ),
            models.Index(
                fields=["workflow"],
                name="schedulefire_workflow_idx",
                condition=Q(workflow__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} @ {self.fire_at:%Y-%m-%d %H:%M:%S} {self.outcome}"


class MetricCounts(models.Model):
    """What the metrics rollup counts for one queue and operation (``jobs.metrics.rollup``).

    Histograms are fixed buckets (``jobs.metrics.buckets``): ``*_bucket_counts``
    holds one count per bucket, not cumulative, the last one past the largest
    bound; ``*_sum`` is the sum of the observed seconds.
    """

    queue = models.CharField(max_length=200)
    operation = models.CharField(max_length=200)
    started = models.BigIntegerField(default=0)
    succeeded = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    retried = models.BigIntegerField(default=0)
    cancelled = models.BigIntegerField(default=0)
    lease_expiries = models.BigIntegerField(default=0)
    rescues = models.BigIntegerField(default=0)
    wait_bucket_counts = models.JSONField(default=list, blank=True)
    wait_sum = models.FloatField(default=0.0)
    run_bucket_counts = models.JSONField(default=list, blank=True)
    run_sum = models.FloatField(default=0.0)

    class Meta:
        abstract = True


class MetricRollup(MetricCounts):
    """One minute of one queue and operation; pruned after ``METRICS_RETENTION_DAYS``.

    The unique (minute, queue, operation) index also serves retention
    (``minute < cutoff``) and the charts' time ranges.
    """

    id = models.BigAutoField(primary_key=True)
    minute = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "queue", "operation"], name="metricrollup_minute_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.queue} {self.operation}"


class MetricTotal(MetricCounts):
    """All-time sums per queue and operation: the Prometheus counters.

    Kept beside the minutes (in the same transaction) so that pruning old
    minutes never makes a counter go down, and a scrape reads a few rows.
    """

    id = models.BigAutoField(primary_key=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "operation"], name="metrictotal_unique")
        ]

    def __str__(self) -> str:
        return f"{self.queue} {self.operation}"


class MetricSpan(MetricCounts):
    """A quarter of an hour or an hour of one queue and operation: its minutes summed
    once it is final (``jobs.metrics.spans``), pruned with the minutes.

    The dashboard's 24 hour charts read quarters and its 7 and 30 day charts
    hours instead of 15 or 60 minute rows each; spans not folded yet are read
    from the minutes. The unique (span_seconds, start, queue, operation) index
    serves the charts' ranges and the newest folded span.
    """

    id = models.BigAutoField(primary_key=True)
    span_seconds = models.PositiveIntegerField()
    start = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["span_seconds", "start", "queue", "operation"], name="metricspan_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.start:%Y-%m-%d %H:%M} +{self.span_seconds}s {self.queue} {self.operation}"


class MetricCursor(models.Model):
    """How far the rollup has read the events table (its watermark), one row per stream.

    ``last_event_id``: every event with a smaller or equal id is counted.
    Moved by a conditional UPDATE, so of several reapers exactly one rolls
    up each range.
    """

    name = models.CharField(primary_key=True, max_length=50)
    last_event_id = models.BigIntegerField(default=0)
    rolled_up_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} @ {self.last_event_id}"


class WorkflowStatus(TextChoices):
    RUNNING = "running", "Running"
    # A step failed and steps after it wait for an operator (retry the step, or cancel).
    HELD = "held", "Held"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class OnFailure(TextChoices):
    """What a dependency's failure (or cancellation) does to the job that waits for it."""

    CANCEL = "cancel", "Cancel the dependent job"
    RUN = "run", "Run the dependent job anyway"
    HOLD = "hold", "Hold the dependent job for an operator"


class Workflow(models.Model):
    """Jobs enqueued together with dependencies between them (jobs.workflows)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(
        max_length=16, choices=WorkflowStatus.choices, default=WorkflowStatus.RUNNING
    )
    on_failure = models.CharField(max_length=8, choices=OnFailure.choices, default=OnFailure.CANCEL)
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    schedule = models.ForeignKey(
        "Schedule", null=True, blank=True, on_delete=models.SET_NULL, related_name="workflows"
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["-created_at", "-id"], name="workflow_created_idx")]

    def __str__(self) -> str:
        return f"workflow {self.name or self.id} ({self.status})"

    def wait(self, timeout: float) -> Workflow:
        """This workflow read again once it has ended, or as it is after ``timeout`` seconds."""
        from jobs.awaiting import wait_for_workflow

        return wait_for_workflow(self.pk, timeout, using=self._state.db or "default")


class Dependency(models.Model):
    """``job`` waits for ``upstream``; ``met`` once the upstream's end released it."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_index=False)
    upstream = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_index=False)
    on_failure = models.CharField(max_length=8, choices=OnFailure.choices, default=OnFailure.CANCEL)
    met = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "upstream"], name="dependency_job_upstream")
        ]
        indexes = [models.Index(fields=["upstream"], name="dependency_upstream_idx")]

    def __str__(self) -> str:
        return f"{self.job_id} after {self.upstream_id}"
