"""The dashboard's admin views: overview, pending, assignments, results, job, tree, actions.

Every view is wrapped in `admin_site.admin_view` (staff only, CSRF-protected, never
cached). Reads go through dashboard.py; actions call the backend and are POST-only,
confirmed on a page of their own, logged in the admin log and reported with messages.
When ZooKeeper cannot be read, a page says so in a banner (HTTP 503), never a 500.
"""

import dataclasses
import re
from datetime import datetime, timedelta

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import urlencode
from kazoo.exceptions import NoNodeError

from . import dashboard, deadletter, records
from .admin import can_manage
from .exceptions import (
    CorruptRecord,
    DeadLetterRefused,
    JobNotFound,
    RetryRefused,
    ScheduleNotFound,
)
from .models import Job
from .schedules import NAME_RE as SCHEDULE_NAME_RE
from .tree import QUEUE_RE, ZNODE_NAME_RE, is_job_id

_JOB_NODE = re.compile(r"^\d{3}-[0-9a-f]{32}\Z")
_DELAYED_NODE = re.compile(r"^\d{13}-\d{3}-[0-9a-f]{32}-.+\Z")
_RESULTS_CURSOR = re.compile(r"^\d{13}/[0-9a-f]{32}\Z")
_WORKER_ID = _ENTRY_NAME = ZNODE_NAME_RE  # any znode name (a dead letter's: garbage too)

DEAD_LETTER_PREVIEW = 2_000  # characters of an entry's data shown
SCHEDULE_ACTIONS = {"pause": "Pause", "resume": "Resume", "run": "Run now"}

TABS = (
    ("overview", "Overview", "zktasks_overview"),
    ("pending", "Pending", "zktasks_pending"),
    ("assignments", "Assignments", "zktasks_assignments"),
    ("results", "Results", "zktasks_job_changelist"),
    ("schedules", "Schedules", "zktasks_schedules"),
    ("deadletters", "Dead letters", "zktasks_deadletters"),
    ("tree", "Tree", "zktasks_tree"),
)
AGES = (
    ("", "any age"),
    ("3600", "older than 1 hour"),
    ("86400", "older than 1 day"),
    ("604800", "older than 7 days"),
)


class ZkBackendMissing(Exception):
    pass


def zk_backend(*, connected: bool = False):
    """The task backend the dashboard shows: "default" if it is a zktasks one, else the
    first zktasks alias in TASKS. With `connected`, first make sure its client is up,
    waiting no longer than a page may (the backend's own calls would wait CONNECT_TIMEOUT).
    """
    from django.tasks import task_backends

    from .backend import ZooKeeperBackend

    aliases = list(getattr(settings, "TASKS", None) or {})
    aliases.sort(key=lambda a: a != "default")
    for alias in aliases:
        backend = task_backends[alias]
        if isinstance(backend, ZooKeeperBackend):
            if connected:
                dashboard.connect(backend.conf)
            return backend
    raise ZkBackendMissing(
        "No task backend in TASKS is a zktasks.backend.ZooKeeperBackend; add one to see "
        "its jobs here."
    )


class PurgeForm(forms.Form):
    states = forms.MultipleChoiceField(
        choices=[(records.SUCCESSFUL, "Succeeded"), (records.FAILED, "Failed")],
        initial=[records.SUCCESSFUL], widget=forms.CheckboxSelectMultiple,
        label="Delete results that")
    older_than = forms.ChoiceField(choices=AGES, required=False, initial="86400",
                                   label="Finished")

    def age(self) -> timedelta | None:
        value = self.cleaned_data.get("older_than")
        return timedelta(seconds=int(value)) if value else None

    def describe(self) -> str:
        states = ", ".join(self.cleaned_data["states"])
        label = dict(AGES)[self.cleaned_data.get("older_than") or ""]
        return f"{states} results, {label}"


class DashboardViews:
    """The dashboard's views for one ModelAdmin (and so one admin site)."""

    def __init__(self, model_admin):
        self.model_admin = model_admin
        self.admin_site = model_admin.admin_site
        self.opts = model_admin.model._meta

    def get_urls(self):
        wrap = self.admin_site.admin_view
        label = self.opts.app_label
        return [
            path(f"{label}/", wrap(self.overview), name="zktasks_overview"),
            path(f"{label}/live.json", wrap(self.live_json), name="zktasks_live"),
            path(f"{label}/pending/", wrap(self.pending), name="zktasks_pending"),
            path(f"{label}/assignments/", wrap(self.assignments),
                 name="zktasks_assignments"),
            path(f"{label}/tree/", wrap(self.tree), name="zktasks_tree"),
            path(f"{label}/schedules/", wrap(self.schedules), name="zktasks_schedules"),
            path(f"{label}/schedules/<str:name>/<str:verb>/", wrap(self.schedule_action),
                 name="zktasks_schedule_action"),
            path(f"{label}/deadletters/", wrap(self.dead_letters), name="zktasks_deadletters"),
            path(f"{label}/deadletters/<str:name>/requeue/", wrap(self.dead_letter_requeue),
                 name="zktasks_deadletter_requeue"),
            path(f"{label}/deadletters/<str:name>/discard/", wrap(self.dead_letter_discard),
                 name="zktasks_deadletter_discard"),
            path(f"{label}/purge/", wrap(self.purge), name="zktasks_purge"),
            path(f"{label}/workers/<str:worker_id>/drain/", wrap(self.drain),
                 name="zktasks_drain"),
            path(f"{label}/job/", wrap(self.results), name="zktasks_job_changelist"),
            path(f"{label}/job/<str:job_id>/", wrap(self.job), name="zktasks_job_change"),
            path(f"{label}/job/<str:job_id>/retry/", wrap(self.retry),
                 name="zktasks_job_retry"),
            path(f"{label}/job/<str:job_id>/cancel/", wrap(self.cancel),
                 name="zktasks_job_cancel"),
        ]

    # -- helpers -------------------------------------------------------------------------

    def context(self, request, title: str, tab: str = "", **extra) -> dict:
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "tabs": [(key, label, self.url(name)) for key, label, name in TABS],
            "tab": tab,
            "can_manage": can_manage(request),
            "live_url": reverse("admin:zktasks_live", current_app=self.admin_site.name),
            "live_topics": "",
            "live_sig": "",
            "zk_error": "",
        }
        context.update(extra)
        return context

    def render(self, request, template: str, context: dict, status: int = 200):
        request.current_app = self.admin_site.name
        return TemplateResponse(request, f"zktasks/admin/{template}", context,
                                status=status)

    def unavailable(self, request, exc: BaseException, title: str, tab: str = ""):
        """The page with a banner saying why ZooKeeper could not be read (HTTP 503)."""
        return self.render(request, "unavailable.html",
                           self.context(request, title, tab, zk_error=_message(exc)),
                           status=503)

    def reader(self):
        return dashboard.Reader(zk_backend())

    @staticmethod
    def live(backend, topics: str, job_id: str | None = None) -> tuple[dict, dict]:
        """Snapshot the live state before a page reads its content, and return the
        context that lets live.js tell whether anything changed since (data-zk-sig)."""
        live = dashboard.live_state(backend).snapshot(job_id=job_id)
        names = topics.split()
        sig = "|".join(f"{t}={live['topics'].get(t, '')}" for t in names)
        return live, {"live_topics": topics, "live_sig": sig}

    @staticmethod
    def deny(request):
        raise PermissionDenied

    def url(self, name: str, *args, query: dict | None = None) -> str:
        url = reverse(f"admin:{name}", args=args, current_app=self.admin_site.name)
        query = {k: v for k, v in (query or {}).items() if v not in (None, "")}
        return f"{url}?{urlencode(query)}" if query else url

    def log(self, request, subject: Job, message: str, *, deletion: bool = False) -> None:
        if deletion:
            self.model_admin.log_deletions(request, [subject])
        else:
            self.model_admin.log_change(request, subject, message)

    # -- overview and live ---------------------------------------------------------------

    def overview(self, request):
        title = "ZooKeeper tasks"
        try:
            backend = zk_backend()
            live, live_context = self.live(
                backend, "workers assignments queues leader finished failures")
        except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
            return self.unavailable(request, exc, title, "overview")
        context = self.context(
            request, title, "overview",
            live=_for_template(dashboard.with_rate_limits(live, backend.conf)),
            conf=backend.conf,
            zk_error="" if live["ok"] else live["error"],
            throughput=_bars(live["throughput"]), **live_context,
        )
        return self.render(request, "overview.html", context)

    def live_json(self, request):
        job_id = request.GET.get("job", "")
        job_id = job_id if is_job_id(job_id) else None
        try:
            live = dashboard.live_state(zk_backend()).snapshot(job_id=job_id)
        except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
            return JsonResponse({"ok": False, "connected": False, "error": _message(exc)},
                                status=503)
        return JsonResponse(live)

    # -- lists ---------------------------------------------------------------------------

    def pending(self, request):
        title = "Pending jobs"
        queue = request.GET.get("queue", "")
        kind = "delayed" if request.GET.get("kind") == "delayed" else "pending"
        after = request.GET.get("after") or None
        if queue and not QUEUE_RE.match(queue):
            queue = ""
        pattern = _DELAYED_NODE if kind == "delayed" else _JOB_NODE
        if after and not pattern.match(after):
            after = None
        try:
            backend = zk_backend()
            live, live_context = self.live(backend, "" if after else "queues")
            reader = dashboard.Reader(backend)
            queues = [q["name"] for q in live["queues"]]
            if kind == "pending" and not queue and queues:
                queue = next((q["name"] for q in live["queues"] if q["pending"]), queues[0])
            if kind == "delayed":
                page = reader.delayed(queue or None, after=after, limit=dashboard.PAGE_SIZE)
                if page.total is None:  # a queue's total: the live cache counts it
                    page = dataclasses.replace(page, total=next(
                        (q["delayed"] for q in live["queues"] if q["name"] == queue), None))
            elif queue:
                page = reader.pending(queue, after=after, limit=dashboard.PAGE_SIZE)
            else:
                page = dashboard.Page(rows=[], total=0)
        except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
            return self.unavailable(request, exc, title, "pending")
        next_url = self.url("zktasks_pending", query={
            "queue": queue, "kind": kind, "after": page.next_cursor}) \
            if page.next_cursor else ""
        context = self.context(
            request, title, "pending", live=_for_template(live), queue=queue, kind=kind,
            page=page, next_url=next_url, paged=bool(after), **live_context,
        )
        return self.render(request, "pending.html", context)

    def assignments(self, request):
        title = "Assignments"
        try:
            backend = zk_backend()
            _, live_context = self.live(backend, "workers assignments")
            owners = dashboard.Reader(backend).assignments()
        except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
            return self.unavailable(request, exc, title, "assignments")
        context = self.context(request, title, "assignments", owners=owners,
                               **live_context)
        return self.render(request, "assignments.html", context)

    def results(self, request):
        title = "Results"
        state = request.GET.get("state", "")
        state = state if state in (records.SUCCESSFUL, records.FAILED) else ""
        task = request.GET.get("task", "").strip()[:200]
        queue = request.GET.get("queue", "").strip()
        queue = queue if QUEUE_RE.match(queue) else ""
        cursor = request.GET.get("cursor", "")
        cursor = cursor if _RESULTS_CURSOR.match(cursor) else None
        search = request.GET.get("q", "").strip()
        try:
            backend = zk_backend()
            reader = dashboard.Reader(backend)
            if search:
                if is_job_id(search.lower()) and reader.get_caught_up(
                        reader.layout.status(search.lower())) is not None:
                    return HttpResponseRedirect(self.url("zktasks_job_change",
                                                         search.lower()))
                messages.warning(request, f"No job has the id “{search}”.")
            live, live_context = self.live(backend, "" if cursor else "finished")
            page = reader.results(state=state or None, task=task, queue=queue, cursor=cursor,
                                  limit=dashboard.PAGE_SIZE, budget=dashboard.SCAN_BUDGET)
        except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
            return self.unavailable(request, exc, title, "results")
        filters = {"state": state, "task": task, "queue": queue}
        next_url = self.url("zktasks_job_changelist", query={**filters,
                                                               "cursor": page.next_cursor}) \
            if page.next_cursor else ""
        totals = live["totals"]
        total = {"": totals["succeeded"] + totals["failed"],
                 records.SUCCESSFUL: totals["succeeded"],
                 records.FAILED: totals["failed"]}[state] if not task and not queue else None
        context = self.context(
            request, title, "results", page=page, filters=filters, next_url=next_url,
            first_url=self.url("zktasks_job_changelist", query=filters) if cursor else "",
            total=total, search=search, queues=[q["name"] for q in live["queues"]],
            states=((records.SUCCESSFUL, "Succeeded"), (records.FAILED, "Failed")),
            **live_context,
        )
        return self.render(request, "results.html", context)

    # -- one job -------------------------------------------------------------------------

    def job(self, request, job_id):
        title = f"Job {job_id}"
        if not is_job_id(job_id):
            raise Http404("Not a job id.")
        try:
            backend = zk_backend()
            _, live_context = self.live(backend, f"job:{job_id}", job_id=job_id)
            reader = dashboard.Reader(backend)
            detail_root = reader.conf.root
            detail = reader.job(job_id)
        except CorruptRecord as exc:
            return self.render(request, "job.html", self.context(
                request, title, "results", detail=None, job_id=job_id,
                corrupt=str(exc)))
        except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
            return self.unavailable(request, exc, title, "results")
        if detail is None:
            return self.render(request, "job.html", self.context(
                request, title, "results", detail=None, job_id=job_id), status=404)
        context = self.context(
            request, title, "results", detail=detail, job_id=job_id,
            record=detail.record, attempts=dashboard.attempts_text(detail.record),
            **live_context,
            live_url=self.url("zktasks_live", query={"job": job_id}),
            tree_url=self.url("zktasks_tree"),
            places=[(label, p[len(detail_root):] or "/") for label, p in detail.places],
        )
        return self.render(request, "job.html", context)

    def _job_action(self, request, job_id, *, verb: str, run, refused: str):
        """Confirm (GET), then act (POST): shared by retry and cancel. `run(backend,
        job_id, post)` answers with what was done, for the message and the admin log,
        or None when the job was left as it was."""
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        if not is_job_id(job_id):
            raise Http404("Not a job id.")
        if not can_manage(request):
            self.deny(request)
        title = f"{verb.capitalize()} job {job_id}"
        back = self.url("zktasks_job_change", job_id)
        if request.method == "POST":
            try:
                done = run(zk_backend(connected=True), job_id, request.POST)
            except JobNotFound:
                messages.error(request, f"No job has the id “{job_id}” (expired or purged).")
                return HttpResponseRedirect(self.url("zktasks_job_changelist"))
            except RetryRefused as exc:  # says why (a unique key held, no payload)
                messages.error(request, str(exc))
                return HttpResponseRedirect(back)
            except CorruptRecord as exc:  # turned corrupt since the confirm page: no 500
                messages.error(request, f"Not done: {exc}")
                return HttpResponseRedirect(back)
            except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
                return self.unavailable(request, exc, title, "results")
            if done:
                self.log(request, Job(id=job_id), done)
                messages.success(request, f"{done} (job {job_id}).")
            else:
                messages.warning(request, refused)
            return HttpResponseRedirect(back)
        try:
            detail = self.reader().job(job_id)
        except CorruptRecord:
            detail = None
        except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
            return self.unavailable(request, exc, title, "results")
        if detail is None:
            raise Http404("No such job.")
        context = self.context(request, title, "results", verb=verb, job_id=job_id,
                               record=detail.record, back_url=back)
        return self.render(request, "confirm_job.html", context)

    def retry(self, request, job_id):
        def run(backend, job_id, post):
            if backend.retry(job_id):
                return "Sent the failed job back to its queue for one more attempt"
            return None

        return self._job_action(
            request, job_id, verb="retry", run=run,
            refused="The job was not retried: only a failed job can be (it may have been "
                    "retried already).")

    def cancel(self, request, job_id):
        def run(backend, job_id, post):
            force = post.get("force") == "yes"
            if backend.cancel(job_id, force=force):
                return "Cancelled the job before it ran"
            # The state alone: get_result() would unpickle the arguments here, and one
            # that crashes or hangs as it loads is a likely reason to stop a job.
            if backend.status_record(job_id).is_finished:
                return None
            # Held by a worker: backend.cancel asked that worker to stop it.
            if force:
                return ("Asked the worker holding the job to stop it, terminating its task "
                        "process if it runs in one")
            return ("Asked the worker holding the job to stop it (the task sees "
                    "zktasks.cancel_requested(); one that never checks runs to its end)")

        return self._job_action(
            request, job_id, verb="cancel", run=run,
            refused="The job was not cancelled: it has finished.")

    # -- purge and drain -----------------------------------------------------------------

    def purge(self, request):
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        if not can_manage(request):
            self.deny(request)
        title = "Purge finished results"
        form = PurgeForm(request.POST or None)
        confirmed = request.method == "POST" and request.POST.get("confirm") == "yes"
        if request.method == "POST" and form.is_valid():
            states = tuple(form.cleaned_data["states"])
            age = form.age()
            try:
                backend = zk_backend(connected=True)
                if confirmed:
                    # Bounded: a web request answers (the banner) while ZooKeeper is
                    # away; the CLI's purge waits instead.
                    with backend.store.bounded():
                        count = backend.purge(states=states, older_than=age)
                else:
                    from .backend import purge_before_ms

                    live = dashboard.live_state(backend)
                    # A process that has served no page yet has read nothing: its
                    # estimate was 0. snapshot() waits for a first read then (bounded
                    # as the web's other calls are).
                    live.snapshot(wait=backend.conf.connect_timeout)
                    estimate = live.bucket_counts(purge_before_ms(age), states)
            except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
                return self.unavailable(request, exc, title, "results")
            if confirmed:
                subject = Job(id="")
                subject.label = f"{count:,} finished results ({form.describe()})"
                self.log(request, subject, subject.label, deletion=True)
                messages.success(request, f"Purged {count:,} finished results "
                                          f"({form.describe()}).")
                return HttpResponseRedirect(self.url("zktasks_job_changelist"))
            context = self.context(request, title, "results", form=form, confirm=True,
                                   estimate=estimate, description=form.describe())
            return self.render(request, "purge.html", context)
        try:
            totals = dashboard.live_state(zk_backend()).snapshot()["totals"]
        except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
            return self.unavailable(request, exc, title, "results")
        context = self.context(request, title, "results", form=form, confirm=False,
                               totals=totals)
        return self.render(request, "purge.html", context)

    def drain(self, request, worker_id):
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        if not _WORKER_ID.match(worker_id):
            raise Http404("Not a worker id.")
        if not can_manage(request):
            self.deny(request)
        title = f"Drain worker {worker_id}"
        if request.method == "POST":
            try:
                ok = zk_backend(connected=True).drain_worker(worker_id)
            except CorruptRecord as exc:
                # Not a worker's znode zktasks wrote (the overview offers Drain for it
                # all the same): say so, not a 500.
                messages.error(request, f"Worker {worker_id} cannot be asked to drain: "
                                        f"{exc}")
                return HttpResponseRedirect(self.url("zktasks_overview"))
            except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
                return self.unavailable(request, exc, title, "overview")
            if ok:
                subject = Job(id="")
                subject.label = f"worker {worker_id}"
                self.log(request, subject, "Asked the worker to drain and exit.")
                messages.success(request, f"Worker {worker_id} is draining: it takes no new "
                                          "jobs, finishes its running ones and exits.")
            else:
                messages.warning(request, f"Worker {worker_id} is gone; nothing to drain.")
            return HttpResponseRedirect(self.url("zktasks_overview"))
        try:
            reader = self.reader()
            workers = reader.workers()
            if worker_id not in workers:  # listed by another process, just registered?
                reader.catch_up()
                workers = reader.workers()
        except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
            return self.unavailable(request, exc, title, "overview")
        if worker_id not in workers:
            raise Http404("No such worker.")
        context = self.context(request, title, "overview", worker=workers[worker_id],
                               back_url=self.url("zktasks_overview"))
        return self.render(request, "confirm_drain.html", context)

    # -- schedules -----------------------------------------------------------------------

    def schedules(self, request):
        title = "Schedules"
        try:
            backend = zk_backend()
            # "finished": a tick's job ending changes its row, not the schedule's znode.
            live, live_context = self.live(backend, "schedules finished leader")
            rows = dashboard.Reader(backend).schedules()
        except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
            return self.unavailable(request, exc, title, "schedules")
        context = self.context(request, title, "schedules", rows=rows,
                               leader=live["leader"], **live_context)
        return self.render(request, "schedules.html", context)

    def schedule_action(self, request, name, verb):
        """Pause, resume or run a schedule now: confirm (GET), then act (POST)."""
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        if verb not in SCHEDULE_ACTIONS or not SCHEDULE_NAME_RE.match(name):
            raise Http404("Not a schedule action.")
        if not can_manage(request):
            self.deny(request)
        title = f"{SCHEDULE_ACTIONS[verb]} schedule {name}"
        back = self.url("zktasks_schedules")
        try:
            backend = zk_backend(connected=request.method == "POST")
            schedule = backend.schedule(name)
        except ScheduleNotFound as exc:
            raise Http404(str(exc)) from exc
        except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
            return self.unavailable(request, exc, title, "schedules")
        if request.method == "GET":
            context = self.context(request, title, "schedules", schedule=schedule, verb=verb,
                                   back_url=back)
            return self.render(request, "confirm_schedule.html", context)
        try:
            if verb == "run":
                result = backend.run_schedule_now(name)
                done = f"Submitted job {result.id} of schedule {name!r} now."
            elif verb == "pause":
                done = (f"Paused schedule {name!r}: no ticks until it is resumed."
                        if backend.pause_schedule(name) else "")
            else:
                done = (f"Resumed schedule {name!r} at its next tick."
                        if backend.resume_schedule(name) else "")
        except dashboard.UNAVAILABLE as exc:
            return self.unavailable(request, exc, title, "schedules")
        except Exception as exc:  # run: its task does not import, or its args do not fit
            messages.error(request, f"{SCHEDULE_ACTIONS[verb]} of schedule {name!r} failed: "
                                    f"{type(exc).__name__}: {exc}" + (
                                        ". `manage.py check` checks every schedule's task "
                                        "and arguments." if verb == "run" else ""))
            return HttpResponseRedirect(back)
        if done:
            subject = Job(id=result.id if verb == "run" else "")
            subject.label = f"schedule {name}"
            self.log(request, subject, done)
            messages.success(request, done)
        else:
            messages.warning(request, f"Schedule {name!r} was "
                                      + ("paused already." if verb == "pause" else "not paused."))
        return HttpResponseRedirect(back)

    # -- dead letters --------------------------------------------------------------------

    def dead_letters(self, request):
        title = "Dead letters"
        after = request.GET.get("after") or None
        after = after if after and _ENTRY_NAME.match(after) else None
        try:
            backend = zk_backend()
            _, live_context = self.live(backend, "" if after else "deadletter")
            reader = dashboard.Reader(backend)
            with reader.store.bounded(dashboard.READ_DEADLINE * 2):
                letters = deadletter.listing(reader.store, dashboard.PAGE_SIZE + 1,
                                             after=after, timeout=dashboard.READ_DEADLINE)
                total = len(deadletter.names(reader.store))
        except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
            return self.unavailable(request, exc, title, "deadletters")
        more = len(letters) > dashboard.PAGE_SIZE
        letters = letters[:dashboard.PAGE_SIZE]
        root = reader.conf.root
        rows = [{"letter": e, "preview": dashboard.preview(e.data, limit=DEAD_LETTER_PREVIEW),
                 "relative": e.path[len(root):] if e.path.startswith(root + "/") else e.path,
                 "job_link": bool(e.job_id and is_job_id(e.job_id))} for e in letters]
        next_url = self.url("zktasks_deadletters", query={"after": letters[-1].name}) \
            if more else ""
        context = self.context(request, title, "deadletters", rows=rows, total=total,
                               next_url=next_url, paged=bool(after), **live_context)
        return self.render(request, "deadletters.html", context)

    def _dead_letter_action(self, request, name, *, verb: str):
        """Confirm (GET), then act (POST): shared by re-queue and discard."""
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        if not _ENTRY_NAME.match(name):
            raise Http404("Not a dead-letter entry name.")
        if not can_manage(request):
            self.deny(request)
        title = f"{verb.capitalize()} dead-letter entry {name}"
        back = self.url("zktasks_deadletters")
        if request.method == "POST":
            try:
                backend = zk_backend(connected=True)
                if verb == "re-queue":
                    job_id = backend.requeue_dead_letter(name)
                else:
                    found = backend.discard_dead_letter(name)
            except DeadLetterRefused as exc:
                done = "re-queued" if verb == "re-queue" else "discarded"
                messages.warning(request, f"Not {done}: {exc}")
                return HttpResponseRedirect(back)
            except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
                return self.unavailable(request, exc, title, "deadletters")
            if verb == "re-queue":
                done = f"Re-queued from the dead letters (entry {name})"
                self.log(request, Job(id=job_id), done)
                messages.success(request, f"{done}: job {job_id} is waiting in its queue.")
            elif found:
                subject = Job(id="")
                subject.label = f"dead-letter entry {name}"
                self.log(request, subject, subject.label, deletion=True)
                messages.success(request, f"Discarded dead-letter entry {name}." + (
                    f" Job {found.failed_job}, which waited nowhere else, was failed as "
                    "cancelled." if found.failed_job else ""))
            else:
                messages.warning(request, f"Dead-letter entry {name} was gone already.")
            return HttpResponseRedirect(back)
        try:
            store = self.reader().store
            with store.bounded(dashboard.READ_DEADLINE):
                letter = deadletter.read(store, name)
                if letter is None:  # moved aside by another process, just now?
                    store.catch_up()
                    letter = deadletter.read(store, name)
        except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
            return self.unavailable(request, exc, title, "deadletters")
        if letter is None:
            raise Http404("No such dead-letter entry.")
        stranded = None
        if verb == "discard":
            try:
                stranded = zk_backend(connected=True).stranded_job(letter)
            except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
                return self.unavailable(request, exc, title, "deadletters")
        context = self.context(request, title, "deadletters", verb=verb, letter=letter,
                               stranded=stranded.record if stranded else None,
                               preview=dashboard.preview(letter.data,
                                                         limit=DEAD_LETTER_PREVIEW),
                               job_link=bool(letter.job_id and is_job_id(letter.job_id)),
                               back_url=back)
        return self.render(request, "confirm_deadletter.html", context)

    def dead_letter_requeue(self, request, name):
        return self._dead_letter_action(request, name, verb="re-queue")

    def dead_letter_discard(self, request, name):
        return self._dead_letter_action(request, name, verb="discard")

    # -- the raw tree --------------------------------------------------------------------

    def tree(self, request):
        relative = request.GET.get("path", "/") or "/"
        title = "Tree"
        after = request.GET.get("after") or None
        try:
            reader = self.reader()
            try:
                node = reader.node(relative, after=after)
                missing = ""
            except ValueError as exc:
                node, missing = None, str(exc)
            except NoNodeError:
                node, missing = None, f"No znode at {reader.absolute(relative)!r}."
        except (ZkBackendMissing, *dashboard.UNAVAILABLE) as exc:
            return self.unavailable(request, exc, title, "tree")
        next_url = self.url("zktasks_tree", query={"path": relative,
                                                   "after": node.next_cursor}) \
            if node and node.next_cursor else ""
        context = self.context(request, title, "tree", node=node, missing=missing,
                               root=reader.conf.root, next_url=next_url)
        return self.render(request, "tree.html", context, status=404 if missing else 200)


def _message(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, ZkBackendMissing) else dashboard.describe(exc)


def _for_template(live: dict) -> dict:
    """Turn the ISO strings of a snapshot into datetimes for the templates' filters."""
    def dt(value):
        try:
            return datetime.fromisoformat(value) if value else None
        except (TypeError, ValueError):
            return None

    live = dict(live)
    if live.get("leader"):
        live["leader"] = {**live["leader"], "since": dt(live["leader"].get("since"))}
    live["workers"] = [{**w, "started_at": dt(w.get("started_at"))}
                       for w in live.get("workers", [])]
    live["recent_failures"] = [{**f, "finished_at": dt(f.get("finished_at"))}
                               for f in live.get("recent_failures", [])]
    live["as_of"] = dt(live.get("as_of"))
    return live


def _bars(throughput: list[dict]) -> dict:
    """SVG geometry of the throughput chart (attributes, not styles: CSP-safe)."""
    peak = max((t["count"] for t in throughput), default=0)
    width, height, gap = 24, 60, 4
    bars = []
    for i, item in enumerate(throughput):
        h = round(height * item["count"] / peak) if peak else 0
        bars.append({"x": i * (width + gap), "y": height - h, "width": width,
                     "height": max(h, 1 if item["count"] else 0), "count": item["count"],
                     "minute": datetime.fromisoformat(item["minute"])})
    return {"bars": bars, "peak": peak, "width": len(throughput) * (width + gap),
            "height": height, "total": sum(t["count"] for t in throughput)}
