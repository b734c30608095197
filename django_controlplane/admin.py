"""The Django admin over the control plane: jobs (with their events), workers, queues, audit log.

Jobs change only through ``jobs.transitions``, so the admin never edits a
job: every job page is read-only and the Cancel and Retry actions call the
domain services every face uses (``jobs.operator_actions``,
``jobs.bulk_actions``), which write the same events (``by`` = the operator)
and the same ``OperatorAction`` audit row. Queue settings go through
``set_paused`` and ``set_concurrency_cap`` for the same reason. Who may do
what follows the operator roles (``jobs.permissions``): viewers see,
operators act.

Built for a million jobs: the job list never counts the whole table (a count
capped at ``COUNT_CAP``, with the planner's estimate beyond it on PostgreSQL),
its filters take their choices from the Queue table and the registered
operations instead of ``SELECT DISTINCT`` over every job, and the page is read
under the same statement timeout as the dashboard's (``jobs.selectors.timeouts``).
Its filters and search are the dashboard's and the API's (``JobFilters``): the
same URL words select the same jobs in every face.

Django's ``AdminConfig`` imports this module at set-up in every process of a
project that lists ``django.contrib.admin``: workers, the reaper, ``migrate``.
So it imports only what defining and registering the ``ModelAdmin`` classes
takes; the actions, selectors and count helpers load in the methods that
use them, when a page is shown.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import DatabaseError, connections, transaction
from django.db.models import Model, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html

from jobs.exceptions import ControlPlaneError
from jobs.models import Job, JobEvent, OperatorAction, Queue, RemoteOperation, Worker
from jobs.operations import registry

if TYPE_CHECKING:
    from jobs.selectors.counts import CountResult

EVENTS_SHOWN = 200
BOTH_PLACES = [admin.ActionLocation.CHANGE_LIST, admin.ActionLocation.CHANGE_FORM]


# --- counting and paging -----------------------------------------------------------


class CappedPaginator(Paginator):
    """Pages over at most ``COUNT_CAP`` rows; never counts past them.

    ``count`` is ``SELECT COUNT(*) FROM (… LIMIT cap + 1)`` (bounded in time on
    PostgreSQL), so page links stop at the cap: deep ``OFFSET`` pages would
    cost as much as a full count. ``total`` keeps the whole answer for the
    note above the list: past the cap, ``pg_class.reltuples`` for an
    unfiltered list, the planner's estimate for a filtered one.
    """

    @cached_property
    def total(self) -> CountResult:
        return list_total(self.object_list)

    @cached_property
    def count(self) -> int:
        total = self.total
        return _cap() if total.value is None else total.value


def _cap() -> int:
    from jobs.selectors.counts import count_cap

    return count_cap()


def list_total(queryset: QuerySet) -> CountResult:
    """How many rows a changelist holds, as far as the cap (see ``CappedPaginator``)."""
    from jobs.selectors.counts import CountResult, estimated_count, table_estimate

    limit = _cap()
    if not queryset.query.has_filters():
        estimate = table_estimate(queryset.model._meta.db_table, using=queryset.db)
        if estimate is not None and estimate.value is not None and estimate.value > limit:
            return CountResult(value=limit, capped=True, estimate=estimate.value)
    if connections[queryset.db].vendor != "postgresql":
        return estimated_count(queryset, limit)
    try:
        # A savepoint: when the count gives up (a table lock, the timeout) the
        # planner's estimate that follows may fail too, and its swallowed error
        # would leave the page's read transaction aborted.
        with transaction.atomic(using=queryset.db):
            return estimated_count(queryset, limit)
    except DatabaseError:
        return CountResult(value=None, capped=True)  # the rows' own read reports a lasting fault


def count_note(total: CountResult, noun: str) -> str | None:
    """The sentence shown above a list whose count stopped at the cap (None when exact)."""
    if not total.capped:
        return None
    limit = _cap()
    if total.value is None:
        head = f"Too many {noun} match to count them in time"
    elif total.estimate and total.estimate > limit:
        head = f"More than {limit:,} {noun} match (about {total.estimate:,} by estimate)"
    else:
        head = f"More than {limit:,} {noun} match"
    return f"{head}; the pages reach the first {limit:,}. Filter or search to narrow them."


class BoundedListAdmin(admin.ModelAdmin):
    """A changelist for a big table: no full counts, no facets, reads under a timeout.

    The page is rendered inside ``bounded_reads`` because the rows are
    fetched while the template renders; a read past the timeout (or stuck
    behind a table lock) answers a 503 page instead of holding
    a database backend. Actions (POST) run outside it, like the dashboard's.
    """

    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    date_hierarchy = None
    list_per_page = 50

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            return super().changelist_view(request, extra_context)
        from jobs.selectors.timeouts import bounded_reads, is_timeout

        try:
            with bounded_reads():
                response = super().changelist_view(request, extra_context)
                if isinstance(response, TemplateResponse) and response.context_data:
                    changelist = response.context_data.get("cl")
                    if changelist is not None and isinstance(changelist.paginator, CappedPaginator):
                        noun = str(self.opts.verbose_name_plural)
                        response.context_data["subtitle"] = count_note(
                            changelist.paginator.total, noun
                        )
                    response.render()
        except DatabaseError as error:
            if not is_timeout(error):
                raise
            return _timeout_response(request)
        return response


class ViewerMixin:
    """Viewers (``VIEW_PERM``) and operators (``ACT_PERM``) see these pages, as on the dashboard."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _can_view(request) or super().has_view_permission(request, obj)  # type: ignore[misc]

    def has_module_permission(self, request: HttpRequest) -> bool:
        return _can_view(request) or super().has_module_permission(request)  # type: ignore[misc]


# The admin's 503 page, in the admin's own frame (kept here: the app ships no templates).
_TIMEOUT_PAGE = """{% extends "admin/base_site.html" %}{% block content %}<div id="content-main">
<p>The database needed more than {{ timeout_ms }} ms for this page, so the query was stopped
to keep the database responsive for workers.</p>
<p>Narrow the list with a filter or a search and try again.</p></div>{% endblock %}"""


def _timeout_response(request: HttpRequest) -> HttpResponse:
    """503: the page's reads ran past the statement timeout and were stopped."""
    from django.template import engines

    from jobs.conf import knob

    context = {
        **admin.site.each_context(request),
        "title": "That took too long",
        "timeout_ms": int(knob("DASHBOARD_STATEMENT_TIMEOUT_MS")),
    }
    page = engines["django"].from_string(_TIMEOUT_PAGE)
    return HttpResponse(page.render(context, request), status=503)


def _can_view(request: HttpRequest) -> bool:
    from jobs.permissions import can_view

    return can_view(request.user)


def _can_act(request: HttpRequest) -> bool:
    from jobs.permissions import can_act

    return can_act(request.user)


class ReadOnlyMixin(ViewerMixin):
    """Rows written by the engine only: nobody adds, edits or deletes them here."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --- jobs --------------------------------------------------------------------------


def known_operations() -> list[str]:
    """Operation names from the registry and live remote declarations (a small table)."""
    remote = RemoteOperation.objects.filter(deleted=False).values_list("name", flat=True)
    return sorted({*registry.names(), *remote})


def known_queues() -> list[str]:
    """Queue names from Queue rows and the operations' default queues, never from ``Job``."""
    names = set(Queue.objects.values_list("name", flat=True))
    names.update(op.queue for op in registry.all())
    names.update(RemoteOperation.objects.filter(deleted=False).values_list("queue", flat=True))
    return sorted(names)


class ChoiceFilter(admin.SimpleListFilter):
    """A sidebar of choices from a cheap source (plus the value in use).

    It only draws the choices: ``JobChangeList`` reads the value, with every
    other filter word of the URL, into one ``JobFilters`` and applies them.
    """

    def choices_source(self) -> list[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = self.choices_source()
        if self.value() and self.value() not in names:
            names.append(self.value())  # a queue no row names yet still shows as selected
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset


class StatusFilter(ChoiceFilter):
    title = "status"
    parameter_name = "status"

    def choices_source(self) -> list[str]:
        from jobs.selectors.filters import STATES

        return list(STATES)


class QueueFilter(ChoiceFilter):
    title = "queue"
    parameter_name = "queue"

    def choices_source(self) -> list[str]:
        return known_queues()


class OperationFilter(ChoiceFilter):
    title = "operation"
    parameter_name = "operation"

    def choices_source(self) -> list[str]:
        return known_operations()


class ParentFilter(ChoiceFilter):
    """Children of one job (the job page links here), or top-level jobs; shown only in use."""

    title = "parent"
    parameter_name = "parent"

    def choices_source(self) -> list[str]:
        return []

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value() or ""
        if value == "none":
            return [("none", "top-level jobs")]
        return [(value, f"children of {value}")] if _is_uuid(value) else []


class SharedFilterWords(admin.ListFilter):
    """Claims the filter words the sidebar has no choices for (``range``, ``from``,
    ``to``, ``when``, ``payload``, ``schedule``…), so the changelist does not take
    them for field lookups; ``JobChangeList`` applies them with the rest."""

    title = "filters"
    # The sidebar's own words, and the search box's.
    DRAWN = ("status", "queue", "operation", "parent", "q")

    def __init__(self, request: HttpRequest, params: dict, model: Any, model_admin: Any) -> None:
        super().__init__(request, params, model, model_admin)
        for name in self.expected_parameters():
            params.pop(name, None)

    def has_output(self) -> bool:
        return False

    def expected_parameters(self) -> list[str]:
        from jobs.selectors.filter_query import FILTER_KEYS

        return [name for name in FILTER_KEYS if name not in self.DRAWN]

    def choices(self, changelist: Any) -> list[Any]:
        return []

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


class RecentEventsFormSet(BaseInlineFormSet):
    """The job's last ``EVENTS_SHOWN`` events, oldest first, never the whole timeline.

    Seqs run 1…``last_event_seq`` without gaps, so the last N are one index
    range on ``(job, seq)``; the slice keeps it bounded even if they did not.
    """

    def get_queryset(self) -> QuerySet:
        if not hasattr(self, "_queryset"):
            first = max(self.instance.last_event_seq - EVENTS_SHOWN, 0)
            qs = self.queryset.filter(seq__gt=first).order_by("seq")
            self._queryset = qs[:EVENTS_SHOWN]
        return self._queryset


class JobEventInline(ReadOnlyMixin, admin.TabularInline):
    model = JobEvent
    formset = RecentEventsFormSet
    fields = ("seq", "ts", "level", "event", "message", "fields")
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Not the model's ("job", "seq") ordering, which would join the job table.
        return super().get_queryset(request).order_by("seq")

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        total = obj.last_event_seq if obj is not None else 0
        if total > EVENTS_SHOWN:  # this instance serves one request: the title can say so
            self.verbose_name_plural = (
                f"events: the last {EVENTS_SHOWN} of {total:,} (the dashboard shows them all)"
            )
        return super().get_formset(request, obj, **kwargs)


class JobChangeList(ChangeList):
    """The job list, filtered as the dashboard and the API filter (``JobFilters``).

    The sidebar filters only draw choices; the URL's filter words are read
    here into one ``JobFilters`` (``jobs.selectors.filter_query``), so a link
    from the dashboard or the API opens the same jobs, and a value that cannot
    be read is the admin's usual "invalid lookup" notice. The list reads the
    columns it shows, not payloads and results of up to a megabyte each.
    """

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet:
        from django.contrib.admin.options import IncorrectLookupParameters

        from jobs.selectors.filter_query import read_job_filters

        query = request.GET.copy()
        query.pop("q", None)  # the search box: JobAdmin.get_search_results
        filters = read_job_filters(query)
        if filters.errors:
            raise IncorrectLookupParameters("; ".join(filters.errors.values()))
        queryset = super().get_queryset(request, exclude_parameters)
        return filters.apply(queryset).defer("payload", "result", "error_message")


@admin.register(Job)
class JobAdmin(ReadOnlyMixin, BoundedListAdmin):
    list_display = ("id", "operation", "queue", "status", "priority", "tries", "created_at")
    list_filter = (StatusFilter, QueueFilter, OperationFilter, ParentFilter, SharedFilterWords)
    list_select_related = False  # no relation is shown in the list
    sortable_by = ("created_at",)  # the only column an index orders (job_created_idx)
    # get_search_results does the searching; a non-empty tuple shows the search box.
    search_fields = ("operation",)
    search_help_text = (
        "A job id or its first characters, a queue, an operation or part of its name, "
        "part of an error."
    )
    actions = ["cancel_jobs", "retry_jobs"]
    inlines = [JobEventInline]
    fieldsets = (
        (None, {"fields": ("id", "operation", "queue", "status", "priority", "timeline")}),
        ("Payload and outcome", {"fields": ("payload", "result", "error_code", "error_message")}),
        (
            "Attempts and timing",
            {
                "fields": (
                    ("attempts", "max_attempts", "lease_requeues"),
                    ("created_at", "run_after", "expires_at"),
                    ("started_at", "finished_at"),
                )
            },
        ),
        (
            "Lease and progress",
            {"fields": ("worker_link", "leased_until", "lease_token_hint", "progress")},
        ),
        ("Family", {"fields": ("parent", "children", ("unique_key", "unique_while"))}),
    )
    readonly_fields = flatten_fieldsets(fieldsets)  # every field: jobs change by transitions

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type:
        return JobChangeList

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Cancel and Retry: the dashboard's operators (``ACT_PERM``), whatever the admin allows."""
        return _can_act(request)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        """The dashboard's search (``JobFilters.q``): an id or its start, a queue, an
        operation or part of its name, part of an error."""
        from django.contrib.admin.options import IncorrectLookupParameters

        from jobs.selectors.filter_query import read_job_filters

        filters = read_job_filters({"q": search_term})
        if filters.errors:
            raise IncorrectLookupParameters(filters.errors["q"])
        return filters.apply(queryset), False

    # --- read-only fields --------------------------------------------------------

    @admin.display(description="lease token")
    def lease_token_hint(self, job: Job) -> str:
        """Its last 4 characters only: with the whole token anyone reading this page
        could report on the running job in its worker's place."""
        token = str(job.lease_token) if job.lease_token else ""
        return f"…{token[-4:]}" if token else "-"

    @admin.display(description="attempts")
    def tries(self, job: Job) -> str:
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description="progress")
    def progress(self, job: Job) -> str:
        if job.progress_total:
            return f"{job.progress_current:,} of {job.progress_total:,}"
        return f"{job.progress_current:,}" if job.progress_current else "—"

    @admin.display(description="timeline")
    def timeline(self, job: Job) -> str:
        url = reverse("dashboard:job", args=[job.pk])
        return format_html(
            '{} events; the live timeline is on <a href="{}">the dashboard\'s job page</a>.',
            f"{job.last_event_seq:,}",
            url,
        )

    @admin.display(description="worker")
    def worker_link(self, job: Job) -> str:
        """The worker that ran the job. Its row may be gone (no FK): never ``job.worker``."""
        if job.worker_id is None:
            return "—"
        if not Worker.objects.filter(pk=job.worker_id).exists():
            return f"{job.worker_id} (gone)"
        url = reverse(admin_url_name(Worker, "change"), args=[job.worker_id])
        return format_html('<a href="{}">{}</a>', url, job.worker_id)

    @admin.display(description="children")
    def children(self, job: Job) -> str:
        # One probe on job_parent_idx; the list behind the link pages with capped counts.
        if not Job.objects.filter(parent_id=job.pk).exists():
            return "—"
        url = reverse(admin_url_name(Job, "changelist"))
        return format_html('<a href="{}?parent={}">its child jobs</a>', url, job.pk)

    # --- actions -----------------------------------------------------------------

    @admin.action(
        permissions=["operate"],
        description="Cancel the selected jobs (and their descendants)",
        location=BOTH_PLACES,
    )
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._run(request, queryset, "cancel")

    @admin.action(
        permissions=["operate"],
        description="Retry the selected failed or cancelled jobs",
        location=BOTH_PLACES,
    )
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._run(request, queryset, "retry")

    def _run(self, request: HttpRequest, queryset: QuerySet, kind: str) -> None:
        """One job goes the one-job service, several the bulk one (as on the dashboard)."""
        from jobs import bulk_actions, operator_actions

        done = {"cancel": "Cancelled", "retry": "Retried"}[kind]
        sample = list(queryset.order_by().values_list("pk", flat=True)[:2])
        if len(sample) == 1:
            run_one = (
                operator_actions.cancel_job if kind == "cancel" else operator_actions.retry_job
            )
            try:
                changed = int(run_one(sample[0], user=request.user))
            except ControlPlaneError as error:
                self.message_user(request, str(error), messages.ERROR)
                return
            self._report(request, kind, done, changed, truncated=False)
            return
        limit = _cap()
        eligible = queryset.filter(status__in=bulk_actions.ACTIONS[kind])
        ids = list(
            eligible.order_by("-created_at", "-id").values_list("pk", flat=True)[: limit + 1]
        )
        plan = bulk_actions.plan_bulk(kind, scope="selected", ids=ids[:limit])
        changed = bulk_actions.run_bulk(plan, user=request.user)
        self._report(request, kind, done, changed, truncated=len(ids) > limit)

    def _report(
        self, request: HttpRequest, kind: str, done: str, changed: int, *, truncated: bool
    ) -> None:
        if not changed:
            only = "queued or running" if kind == "cancel" else "failed or cancelled"
            self.message_user(
                request,
                f"No job could be {done.lower()} (only {only} jobs can); nothing changed.",
                messages.WARNING,
            )
            return
        text = f"{done} {changed:,} job{'s' if changed != 1 else ''}."
        if truncated:
            text += f" At most {_cap():,} change per run: run it again for the rest."
        self.message_user(request, text, messages.SUCCESS)


def admin_url_name(model: type[Model], view: str) -> str:
    """``admin:<app_label>_<model>_<view>``, from the model's own label (it may be renamed)."""
    return f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}"


# --- workers, queues, audit log ----------------------------------------------------


@admin.register(Worker)
class WorkerAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "__str__",
        "kind",
        "hostname",
        "pid",
        "queues",
        "concurrency",
        "last_heartbeat",
        "alive",
        "user",
    )
    list_filter = ("kind",)
    list_select_related = ("user",)
    search_fields = ("name", "hostname")
    ordering = ("hostname", "pid")
    show_facets = admin.ShowFacets.NEVER

    @admin.display(boolean=True, description="alive")
    def alive(self, worker: Worker) -> bool:
        from jobs.selectors.workers import stale_before

        return worker.last_heartbeat >= stale_before()


@admin.register(Queue)
class QueueAdmin(ViewerMixin, admin.ModelAdmin):
    """Queue settings; pause, resume and caps go through the audited services
    (``jobs.operator_actions``), and a queue added here is audited too."""

    list_display = ("name", "kind", "paused", "concurrency_cap", "updated_at")
    list_filter = ("kind", "paused")
    search_fields = ("name",)
    fields = ("name", "kind", "paused", "concurrency_cap", "updated_at")
    actions = ["pause_queues", "resume_queues"]
    show_facets = admin.ShowFacets.NEVER

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # The name is the primary key: renaming would leave the old row behind. The kind
        # follows the name (Queue.default_kind), as the API has it: flipping it would
        # hand a queue's jobs to the other kind of worker.
        return ("name", "kind", "updated_at") if obj is not None else ("kind", "updated_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return _can_act(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _can_act(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # deleting a row would unpause and uncap its queue without an audit entry

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        from jobs import audit, operator_actions

        changed = set(form.changed_data)
        others = sorted(changed - {"paused", "concurrency_cap"})
        with transaction.atomic():
            if not change:
                obj.kind = Queue.default_kind(obj.name)
                obj.save()
            elif others:
                obj.save(update_fields=[*others, "updated_at"])
            if not change or others:
                audit.record_action(
                    request.user,
                    audit.ADMIN_CHANGE,
                    target=obj.name,
                    filters={
                        "model": "queue",
                        "created": not change,
                        **{f: getattr(obj, f) for f in ("kind", "paused", "concurrency_cap")},
                    },
                )
        if "paused" in changed:
            operator_actions.set_paused(obj.name, obj.paused, user=request.user)
        if "concurrency_cap" in changed:
            operator_actions.set_concurrency_cap(obj.name, obj.concurrency_cap, user=request.user)

    @admin.action(permissions=["change"], description="Pause the selected queues")
    def pause_queues(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._set_paused(request, queryset, paused=True)

    @admin.action(permissions=["change"], description="Resume the selected queues")
    def resume_queues(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._set_paused(request, queryset, paused=False)

    def _set_paused(self, request: HttpRequest, queryset: QuerySet, *, paused: bool) -> None:
        from jobs import operator_actions

        names = list(queryset.values_list("name", flat=True))
        for name in names:
            operator_actions.set_paused(name, paused, user=request.user)
        verb = "Paused" if paused else "Resumed"
        self.message_user(request, f"{verb} {len(names)} queue{'s' if len(names) != 1 else ''}.")


class ActionFilter(admin.SimpleListFilter):
    """The audit log's action names are a fixed list: no ``SELECT DISTINCT`` over the log."""

    title = "action"
    parameter_name = "action"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        from jobs.audit import LABELS

        return list(LABELS.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(action=self.value()) if self.value() else queryset


@admin.register(OperatorAction)
class OperatorActionAdmin(ReadOnlyMixin, BoundedListAdmin):
    list_display = ("at", "username", "action", "target", "count", "reason")
    list_filter = (ActionFilter,)
    search_fields = ("=username", "=target")
    search_help_text = "A user name or a target (a job id, a queue name), exactly."
    sortable_by = ("at",)
