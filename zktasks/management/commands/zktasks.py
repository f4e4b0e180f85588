"""`manage.py zktasks`: the operator's side of the dashboard, from a shell.

Each action is one call that the dashboard also makes: the overview's numbers come from
the same live cache (dashboard.LiveState), a job's details from dashboard.Reader, and the
actions (retry, cancel, purge, drain, dead letters) from the backend's own methods, so the
command and the admin pages never disagree. Text by default, `--json` for scripts; a
refused action or an unreachable ensemble exits with status 1 and says why.
"""

import argparse
import dataclasses
import json
import logging
import re
import sys
from datetime import datetime, timedelta

from django.core.management.base import BaseCommand, CommandError
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from zktasks import dashboard, deadletter, records
from zktasks.backend import purge_before_ms
from zktasks.client import tls_trouble
from zktasks.exceptions import (
    CorruptRecord,
    JobNotFound,
    ZkTasksError,
    ZooKeeperUnavailableError,
)
from zktasks.tree import is_job_id, parse_delayed_node, parse_job_node

from ._common import seconds, whole_number, zk_backend, znode_name

STATES = (records.SUCCESSFUL, records.FAILED)


class Command(BaseCommand):
    help = (
        "Look at and act on a zktasks cluster: the overview (status), jobs finished or "
        "pending, one job (show), the periodic schedules (pause, resume, run now), "
        "retry, cancel, purge finished results, drain a worker, and the dead letters. "
        "Run `manage.py zktasks ACTION --help` for each action."
    )

    def add_arguments(self, parser):
        backend_help = ("alias of the ZooKeeperBackend in TASKS (default: "
                        f"{DEFAULT_TASK_BACKEND_ALIAS})")
        parser.add_argument("--backend", default=DEFAULT_TASK_BACKEND_ALIAS, help=backend_help)
        parser.add_argument("--json", action="store_true", help="print JSON instead of text")
        # argparse hands everything after the action to the action's parser, so each one
        # takes the command's options and Django's standard ones again. Their default
        # there is SUPPRESS: an option given before the action is not overwritten.
        common = argparse.ArgumentParser(add_help=False)
        common.add_argument("--backend", default=argparse.SUPPRESS, help=backend_help)
        common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                            help="print JSON instead of text")
        common.add_argument("-v", "--verbosity", type=int, choices=[0, 1, 2, 3],
                            default=argparse.SUPPRESS,
                            help="2 or more also shows kazoo's warnings (default 1)")
        common.add_argument("--settings", default=argparse.SUPPRESS,
                            help="the settings module (default: DJANGO_SETTINGS_MODULE)")
        common.add_argument("--pythonpath", default=argparse.SUPPRESS,
                            help="a directory to add to the Python path")
        for flag, help_text in (("--traceback", "show the traceback of an error"),
                                ("--no-color", "do not colorize the output"),
                                ("--force-color", "colorize the output"),
                                ("--skip-checks", "skip the system checks")):
            common.add_argument(flag, action="store_true", default=argparse.SUPPRESS,
                                help=help_text)
        actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

        def action(name, help_text):
            return actions.add_parser(name, parents=[common], help=help_text,
                                      description=help_text)

        action("status", "The dashboard's overview: leader, workers, and per queue the "
                         "pending, delayed, assigned (running or prefetched), succeeded "
                         "and failed jobs.")
        show = action("show", "One job: state, attempts, timings, arguments, result or "
                              "errors, and where it is in the tree.")
        show.add_argument("job_id")
        jobs = action("jobs", "Finished jobs, newest first (as the dashboard's results "
                              "page lists them).")
        jobs.add_argument("--state", choices=STATES, default=None,
                          help="only jobs that ended in this state")
        jobs.add_argument("--task", default="", help="only tasks whose path contains this")
        jobs.add_argument("--queue", type=znode_name("queue name"), default=None,
                          help="only jobs of this queue")
        pending = action("pending", "Jobs waiting in a queue, in the order the leader "
                                    "assigns them.")
        pending.add_argument("queue", nargs="?", default="default",
                             type=znode_name("queue name"),
                             help="the queue (default: %(default)s)")
        delayed = action("delayed", "Jobs waiting for their run_after or a retry's backoff, "
                                    "the first due first (Celery's `inspect scheduled`).")
        delayed.add_argument("queue", nargs="?", default=None, type=znode_name("queue name"),
                             help="only jobs of this queue (default: every queue)")
        for listing, cursor in ((jobs, _results_cursor), (pending, _pending_cursor),
                                (delayed, _delayed_cursor)):
            listing.add_argument("--limit", type=whole_number(1), default=20,
                                 help="rows to list (default %(default)s)")
            listing.add_argument("--after", type=cursor, default=None, metavar="CURSOR",
                                 help="continue a listing where the previous one stopped "
                                      "(the CURSOR it printed)")
        action("schedules", "The periodic schedules (OPTIONS['SCHEDULES']): the last tick "
                            "and its job, the next tick, and why the last attempted tick "
                            "failed, if it did.")
        for name, help_text in (
                ("pause-schedule", "Pause a schedule: the leader submits none of its ticks "
                                   "until it is resumed."),
                ("resume-schedule", "Resume a paused schedule at its next tick; the ticks "
                                    "it skipped while paused are not run."),
                ("run-schedule", "Submit one job of a schedule's task and arguments now, "
                                 "outside its ticks (paused or not).")):
            action(name, help_text).add_argument("name", help="the schedule's name in "
                                                             "OPTIONS['SCHEDULES']")
        retry = action("retry", "Send a FAILED job back to its queue for one more attempt.")
        retry.add_argument("job_id")
        cancel = action("cancel", "Cancel a job. A pending one never runs; one a worker "
                                  "holds is asked to stop (the task sees "
                                  "zktasks.cancel_requested()).")
        cancel.add_argument("job_id")
        cancel.add_argument("--force", action="store_true",
                            help="terminate a running job's task process (process pool)")
        empty = action("cancel-pending", "Cancel every job waiting in a queue (Celery's "
                                         "purge, RQ's empty): each is recorded as failed "
                                         "with JobCancelled and never runs. Delayed jobs "
                                         "and jobs a worker holds are left alone.")
        empty.add_argument("queue", type=znode_name("queue name"))
        empty.add_argument("--yes", "--no-input", action="store_true", dest="yes",
                           help="do not ask for confirmation")
        purge = action("purge", "Delete finished results (their status records) now, "
                                "instead of when RESULT_TTL expires them.")
        purge.add_argument("--state", choices=STATES, action="append", dest="states",
                           help="only results in this state (repeatable; default: both)")
        purge.add_argument("--older-than", type=seconds, default=None, metavar="SECONDS",
                           help="only results finished at least this long ago (default: "
                                "all, including the last ten seconds)")
        purge.add_argument("--yes", "--no-input", action="store_true", dest="yes",
                           help="do not ask for confirmation")
        drain = action("drain", "Ask a worker to drain: it takes no new jobs, finishes its "
                                "running ones, hands back the rest and exits.")
        drain.add_argument("worker_id")
        letters = action("dead-letters", "List the dead letters (garbage znodes and "
                                         "refused payloads moved aside), newest first.")
        letters.add_argument("--limit", type=whole_number(1, deadletter.LIST_LIMIT),
                             default=50, help="entries to list (default %(default)s, at "
                                              f"most {deadletter.LIST_LIMIT})")
        letters.add_argument("--after", type=znode_name("entry name"), default=None,
                             metavar="ENTRY", help="continue a listing after this entry "
                                                   "(the last one the previous page listed)")
        requeue = action("requeue", "Send the job of a dead-letter entry back to its queue "
                                    "and delete the entry.")
        requeue.add_argument("entry", help="the entry's name, as dead-letters lists it")
        discard = action("discard", "Delete a dead-letter entry.")
        discard.add_argument("entry", help="the entry's name, as dead-letters lists it")

    def handle(self, *args, **options):
        quieted = _quiet_kazoo(options["verbosity"])
        self.as_json = options["json"]
        run = getattr(self, "do_" + options["action"].replace("-", "_"))
        self._live = None
        backend = None
        try:
            backend = zk_backend(options["backend"], "manage.py zktasks")
            run(backend, options)
        except JobNotFound as exc:
            raise CommandError(f"{str(exc).rstrip('.')} (expired, purged, or never submitted "
                               f"here: this is ROOT {backend.conf.root!r} at "
                               f"{backend.conf.hosts!r}).") from exc
        except ZkTasksError as exc:  # unreachable ensemble, corrupt record, refused entry
            raise CommandError(str(exc)) from exc
        except (KazooException, KazooTimeoutError) as exc:  # from dashboard.Reader's reads
            raise CommandError(dashboard.describe(exc)) from exc
        finally:
            if self._live is not None:
                self._live.close()
            # From a shell the process ends here; in a long-lived process (call_command)
            # kazoo's level goes back to what it was.
            if quieted and not self._called_from_command_line:
                for name, level in quieted.items():
                    logging.getLogger(name).setLevel(level)

    # -- output --------------------------------------------------------------------------

    def emit(self, data, text: str) -> None:
        self.stdout.write(json.dumps(data, indent=2, default=_plain) if self.as_json
                          else records.printable(text))

    # -- reading -----------------------------------------------------------------------

    def live(self, backend) -> tuple[dashboard.LiveState, dict]:
        """The dashboard's live cache, and its overview read in full once.

        A cache of its own, closed when the command ends (in handle), not the process's
        shared one: from `call_command` in a long-lived process the shared one could
        answer from before the last change; this one reads the tree now.
        """
        client = self.connect(backend)
        state = self._live = dashboard.LiveState(client, backend.store.layout)
        data = state.snapshot(wait=backend.conf.connect_timeout + 5.0)
        if not data["ok"]:
            if not data["connected"]:
                raise CommandError(_unreachable(backend))
            raise CommandError(data["error"] or f"ZooKeeper at {backend.conf.hosts!r} did not "
                                                "answer in time; try again.")
        return state, data

    def connect(self, backend):
        """This process's client, or a CommandError saying what to check.

        dashboard.connect speaks to a page's reader ("this page shows the tree once it
        answers"); a shell wants to know what to fix. It waits past CONNECT_TIMEOUT, for
        the client's own give-up to come first.
        """
        try:
            return dashboard.connect(backend.conf, wait=backend.conf.connect_timeout + 5.0)
        except ZooKeeperUnavailableError as exc:
            # With TLS, a refused handshake reads as a server that is down: say which.
            trouble = tls_trouble(backend.conf) if backend.conf.tls else ""
            raise CommandError(_unreachable(backend, trouble)) from exc

    def root_exists(self, client, backend) -> bool:
        """Whether ROOT is in ZooKeeper; if not, say so on stderr (stdout stays JSON).

        A mistyped ROOT otherwise reads as an empty, healthy cluster.
        """
        if client.exists(backend.conf.root) is not None:
            return True
        self.stderr.write(
            f"ROOT {backend.conf.root!r} does not exist in ZooKeeper at "
            f"{backend.conf.hosts!r}: no worker or submit has used it yet; check ROOT and "
            f"HOSTS in TASKS[{backend.alias!r}]['OPTIONS'].")
        return False

    def do_status(self, backend, options) -> None:
        state, data = self.live(backend)
        data = {**dashboard.with_rate_limits(data, backend.conf),
                "root_exists": self.root_exists(state.client, backend)}
        self.emit(data, _status_text(data, backend.conf))

    def do_show(self, backend, options) -> None:
        job_id = _job_id(options["job_id"])
        try:
            detail = self.reader(backend).job(job_id)
        except CorruptRecord as exc:
            raise CommandError(f"{exc} The dashboard's tree page shows its raw bytes.") \
                from exc
        if detail is None:
            raise JobNotFound(f"No job has the id {job_id!r}")
        self.emit(_job_data(detail), _job_text(detail))

    def do_jobs(self, backend, options) -> None:
        reader = self.reader(backend)
        self.root_exists(reader.client, backend)
        page = reader.results(
            state=options["state"], task=options["task"], queue=options["queue"] or "",
            cursor=options["after"], limit=options["limit"])
        self.emit_page(page, "finished", when="finished_at",
                       filtered=bool(options["task"] or options["queue"]))

    def do_pending(self, backend, options) -> None:
        queue = options["queue"]
        reader = self.reader(backend)
        exists = self.root_exists(reader.client, backend)
        if backend.queues and queue not in backend.queues \
                and not (exists and queue in reader.queues()):
            # Not configured and never used: a typo. (A queue dropped from QUEUES that
            # still holds jobs is listed, so that they can be found.)
            raise CommandError(
                f"Queue {queue!r} is not in TASKS[{backend.alias!r}]['QUEUES'] "
                f"({sorted(backend.queues)!r}) and holds no jobs; give one of those.")
        page = reader.pending(queue, after=options["after"], limit=options["limit"])
        self.emit_page(page, f"pending in {queue!r}", when="enqueued_at", filtered=False)

    def do_delayed(self, backend, options) -> None:
        queue = options["queue"]
        reader = self.reader(backend)
        self.root_exists(reader.client, backend)
        page = reader.delayed(queue, after=options["after"], limit=options["limit"])
        self.emit_page(page, "delayed" + (f" in {queue!r}" if queue else ""),
                       when="due_at", filtered=bool(page.scanned))

    def do_schedules(self, backend, options) -> None:
        reader = self.reader(backend)
        self.root_exists(reader.client, backend)
        rows = reader.schedules()
        lines = [f"{len(rows)} schedule(s)" + ("" if rows else
                                               f": add them to TASKS[{backend.alias!r}]"
                                               "['OPTIONS']['SCHEDULES']")]
        lines += _table(["NAME", "WHEN", "TASK", "LAST TICK", "ITS JOB", "STATE", "NEXT TICK"], [
            [r.name, r.when or "-", r.task or "-", _when(r.last_tick),
             r.last_job or "-", r.last_state or ("no record" if r.last_job else "-"),
             "paused" if r.paused else _when(r.next_tick) + (" (overdue)" if r.overdue
                                                              else "")] for r in rows]) \
            if rows else []
        for r in rows:
            if r.note:
                lines.append(f"{r.name}: {r.note}")
            if r.paused:
                lines.append(f"{r.name}: paused since {_when(r.paused_at)}; resume it with "
                             f"`manage.py zktasks resume-schedule {r.name}`")
            if r.error:
                lines.append(f"{r.name}: the tick attempted at {_when(r.error_at)} failed: "
                             f"{r.error}")
        self.emit({"schedules": [dataclasses.asdict(r) for r in rows]}, "\n".join(lines))

    def do_pause_schedule(self, backend, options) -> None:
        name = options["name"]
        changed = backend.pause_schedule(name)
        self.emit({"schedule": name, "paused": True, "changed": changed},
                  (f"Schedule {name!r} is paused: " if changed else
                   f"Schedule {name!r} was paused already: ")
                  + f"no ticks until `manage.py zktasks resume-schedule {name}`.")

    def do_resume_schedule(self, backend, options) -> None:
        name = options["name"]
        changed = backend.resume_schedule(name)
        following = backend.schedule(name).next_tick(records.now())
        self.emit({"schedule": name, "paused": False, "changed": changed,
                   "next_tick": following},
                  (f"Schedule {name!r} is resumed" if changed else
                   f"Schedule {name!r} was not paused") + f"; its next tick is at "
                  f"{_when(following)}.")

    def do_run_schedule(self, backend, options) -> None:
        name = options["name"]
        try:
            result = backend.run_schedule_now(name)
        except (ZkTasksError, KazooException, KazooTimeoutError):
            raise  # handle() says these
        except Exception as exc:  # its task does not import, or its args do not fit
            raise CommandError(f"Schedule {name!r} was not run: {type(exc).__name__}: {exc}. "
                               "`manage.py check` checks every schedule's task and "
                               "arguments.") from exc
        self.emit({"schedule": name, "job": result.id},
                  f"Submitted job {result.id} of schedule {name!r} "
                  f"({backend.schedule(name).task}). Follow it with: "
                  f"manage.py zktasks show {result.id}")

    def emit_page(self, page, what: str, *, when: str, filtered: bool) -> None:
        rows = [{"id": r.id, "state": r.state, "task": r.task, "queue": r.queue,
                 "priority": r.priority, when: getattr(r, when), "attempts": r.attempts,
                 "worker": r.worker, "error": r.error} for r in page.rows]
        head = f"{len(rows)} job(s) {what}" + (
            f" of {page.total:,}" if page.total is not None else "")
        lines = [head] + _table(
            ["JOB", "STATE", "TASK", "QUEUE",
             when.split("_")[0].upper(), "ATTEMPTS", "ERROR"],
            [[r["id"], r["state"], r["task"] or "-", r["queue"] or "-", _when(r[when]),
              r["attempts"], (r["error"] or "")[:60]] for r in rows])
        if page.next_cursor:
            lines.append(f"more: add --after {page.next_cursor}"
                         + (f" (looked at {page.scanned:,} to find these)"
                            if filtered else ""))
        self.emit({"rows": rows, "next_cursor": page.next_cursor, "total": page.total},
                  "\n".join(lines))

    def reader(self, backend) -> dashboard.Reader:
        return dashboard.Reader(backend, self.connect(backend))

    # -- acting --------------------------------------------------------------------------

    def do_retry(self, backend, options) -> None:
        job_id = _job_id(options["job_id"])
        if not backend.retry(job_id):
            state = _state(backend, job_id)
            raise CommandError(f"Job {job_id} was not retried: only a FAILED job can be, and "
                               f"it is {state}.")
        queue = backend.store.read_status(job_id).record.queue
        self.emit({"job": job_id, "retried": True, "queue": queue},
                  f"Sent job {job_id} back to queue {queue!r} for one more attempt.")

    def do_cancel(self, backend, options) -> None:
        job_id = _job_id(options["job_id"])
        if backend.cancel(job_id, force=options["force"]):
            self.emit({"job": job_id, "cancelled": True},
                      f"Job {job_id} is cancelled: it will not run.")
            return
        state = _state(backend, job_id)
        if state in STATES:
            raise CommandError(f"Job {job_id} has finished ({state}); nothing to cancel.")
        self.emit({"job": job_id, "cancelled": False, "requested": True, "state": state},
                  f"A worker holds job {job_id} ({state}): it was asked to stop"
                  + (" and its task process will be terminated" if options["force"] else
                     "; the task sees zktasks.cancel_requested() turn True")
                  + f". Follow it with: manage.py zktasks show {job_id}")

    def do_cancel_pending(self, backend, options) -> None:
        queue = options["queue"]
        if not options["yes"]:
            total = self.reader(backend).pending(queue, limit=1).total or 0
            prompt = (f"This cancels about {total:,} job(s) waiting in queue {queue!r}: "
                      "they will never run.")
            _confirm(prompt, "Nothing cancelled.")
        quiet = options["json"] or options["verbosity"] < 1

        def progress(count):
            if not quiet:
                self.stderr.write(f"  {count:,} cancelled so far")

        count = backend.cancel_pending(queue, progress=progress)
        self.emit({"queue": queue, "cancelled": count},
                  f"Cancelled {count:,} job(s) waiting in queue {queue!r}.")

    def do_purge(self, backend, options) -> None:
        states = tuple(dict.fromkeys(options["states"] or STATES))
        age = options["older_than"]
        what = " and ".join(states) + (
            f" results finished more than {age:g} s ago" if age is not None else " results")
        older_than = timedelta(seconds=age) if age is not None else None
        if not options["yes"]:
            estimate = self.live(backend)[0].bucket_counts(purge_before_ms(older_than),
                                                            states)
            prompt = f"This deletes about {estimate:,} {what}, for good."
            _confirm(prompt, "Nothing deleted.")
        count = backend.purge(states=states, older_than=older_than)
        self.emit({"purged": count, "states": states, "older_than": age},
                  f"Purged {count:,} {what}.")

    def do_drain(self, backend, options) -> None:
        worker_id = options["worker_id"]
        if not backend.drain_worker(worker_id):
            raise CommandError(f"No worker {worker_id!r} is registered (it left already?); "
                               "`manage.py zktasks status` lists the live ones.")
        self.emit({"worker": worker_id, "draining": True},
                  f"Worker {worker_id} is draining: it takes no new jobs, finishes its running "
                  "ones and exits.")

    def do_dead_letters(self, backend, options) -> None:
        self.root_exists(self.connect(backend), backend)
        # One more than shown, as the dashboard asks: whether there is more is then
        # known, not guessed from a full page (which said "more" for exactly --limit).
        letters = backend.dead_letters(options["limit"] + 1, after=options["after"])
        more = len(letters) > options["limit"]
        rows = [{"name": e.name, "at": e.at, "kind": e.kind, "job_id": e.job_id,
                 "by": e.by, "reason": e.reason or e.unreadable, "size": e.size}
                for e in letters[:options["limit"]]]
        lines = [f"{len(rows)} dead letter(s), newest first"
                 + (f" (the first {options['limit']})" if more else "")]
        lines += _table(["ENTRY", "AT", "KIND", "JOB", "REASON"], [
            [r["name"], _when(r["at"]), r["kind"], r["job_id"] or "-",
             deadletter.one_line(r["reason"], 80)] for r in rows])
        if more:
            lines.append(f"more: add --after {rows[-1]['name']}")
        if rows:
            lines.append("Act on one with: manage.py zktasks requeue ENTRY, or discard ENTRY.")
        self.emit(rows, "\n".join(lines))

    def do_requeue(self, backend, options) -> None:
        job_id = backend.requeue_dead_letter(options["entry"])
        self.emit({"entry": options["entry"], "job": job_id},
                  f"Re-queued job {job_id} from dead letter {options['entry']}.")

    def do_discard(self, backend, options) -> None:
        name = options["entry"]
        discarded = backend.discard_dead_letter(name)
        if not discarded:
            raise CommandError(f"No dead-letter entry {name!r} (re-queued or "
                               "discarded already?).")
        failed = discarded.failed_job
        self.emit({"entry": name, "discarded": True, "failed_job": failed},
                  f"Discarded dead letter {name}."
                  + (f" Job {failed}, which waited nowhere else, was failed as cancelled."
                     if failed else ""))


# -- helpers --------------------------------------------------------------------------------


def _quiet_kazoo(verbosity: int) -> dict:
    """Keep kazoo's warnings (and zktasks.handler's TLS reports) off stderr below -v 2,
    unless the project set kazoo's level.

    Against a down ensemble kazoo warns several times a second while the command waits
    ("Connection dropped: ..."), bare through Python's last-resort handler; the command
    then says in one line what is wrong. Returns the levels to put back (none when it
    changed nothing).
    """
    kazoo = logging.getLogger("kazoo")
    if verbosity >= 2 or kazoo.level != logging.NOTSET:
        return {}
    # A failing TLS handshake's ERROR line too: the command's own error names the cause.
    handler = logging.getLogger("zktasks.handler")
    before = {"kazoo": kazoo.level, "zktasks.handler": handler.level}
    kazoo.setLevel(logging.ERROR)
    if handler.level == logging.NOTSET:
        handler.setLevel(logging.CRITICAL)
    return before


def _unreachable(backend, trouble: str = "") -> str:
    conf = backend.conf
    said = (f"ZooKeeper at {conf.hosts!r} did not answer within {conf.connect_timeout:g} s "
            "(CONNECT_TIMEOUT)")
    if trouble:
        return f"{said}: {trouble}"
    return (f"{said}; check TASKS[{backend.alias!r}]['OPTIONS']['HOSTS'] and that the "
            "ensemble is up.")


_RESULTS_CURSOR_RE = re.compile(r"[0-9]{13}/[0-9a-f]{32}")


def _results_cursor(value: str) -> str:
    """An argparse type: where `jobs` stopped (a bucket's start and a job id)."""
    if not _RESULTS_CURSOR_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a cursor of `jobs` (13 digits, '/', a job id); give the one "
            "its last page printed after 'more: add --after'")
    return value


def _pending_cursor(value: str) -> str:
    """An argparse type: where `pending` stopped (a pending job's node name)."""
    if parse_job_node(value) is None:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a cursor of `pending` (3 digits, '-', a job id); give the "
            "one its last page printed after 'more: add --after'")
    return value


def _delayed_cursor(value: str) -> str:
    """An argparse type: where `delayed` stopped (a delayed job's node name)."""
    if parse_delayed_node(value) is None:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a cursor of `delayed` (13 digits of due time, a priority, a "
            "job id and a queue); give the one its last page printed after 'more: add "
            "--after'")
    return value


def _job_id(value: str) -> str:
    job_id = value.strip().lower()
    if not is_job_id(job_id):
        raise CommandError(f"{value!r} is not a job id (32 hexadecimal characters, as "
                           "submit() returns and the dashboard shows).")
    return job_id


def _state(backend, job_id: str) -> str:
    found = backend.store.read_status(job_id)
    if found is None:
        raise JobNotFound(f"No job has the id {job_id!r}")
    return found.record.state


def _plain(value):
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def _when(value) -> str:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    if not isinstance(value, datetime):
        return "-"
    return value.isoformat(sep=" ", timespec="seconds")


def _table(header: list[str], rows: list[list]) -> list[str]:
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells]


def _status_text(data: dict, conf) -> str:
    totals = data["totals"]
    lines = [f"zktasks at {conf.hosts}, root {conf.root} (as of {_when(data['as_of'])})"]
    leader = data["leader"]
    lines.append(f"leader: {leader['worker']} since {_when(leader['since'])} "
                 f"({leader['contenders']} contending)" if leader else
                 "leader: none (no worker is running, or an election is under way)")
    lines.append(f"workers: {totals['workers']}")
    if data["workers"]:
        lines += _table(["WORKER", "HOST", "PID", "POOL", "SLOTS", "ASSIGNED", "QUEUES",
                         "STATE"], [
            [w["id"], w["host"] or "-", w["pid"] or "-", w["pool"] or "-",
             w["concurrency"] or "-", w["assigned"], ",".join(w["queues"]) or "*",
             "draining" if w["draining"] else (w["note"] or "running")]
            for w in data["workers"]])
    lines.append("queues:")
    lines += _table(["QUEUE", "PENDING", "DELAYED", "ASSIGNED", "SUCCEEDED", "FAILED",
                     "RATE LIMIT"], [
        [q["name"], q["pending"], q["delayed"], q["assigned"],
         "-" if q["succeeded"] is None else q["succeeded"],
         "-" if q["failed"] is None else q["failed"], _rate_limit_cell(q)]
        for q in data["queues"]])
    if any(q.get("rate_limit_differs") for q in data["queues"]):
        lines.append("rate limits marked * are the leader's, not this process's "
                     "RATE_LIMITS (in brackets): a deploy that changes them is under way, "
                     "or processes run with different settings; every process should "
                     "have the same.")
    lines.append(f"totals: {totals['pending']} pending, {totals['delayed']} delayed, "
                 f"{totals['assigned']} assigned (running, or held by a worker), "
                 f"{totals['succeeded']} succeeded, "
                 f"{totals['failed']} failed, {totals['dead_letters']} dead letter(s)")
    if data["recent_failures"]:
        lines.append("recent failures:")
        lines += _table(["JOB", "TASK", "ERROR"], [
            [f["id"], f["task"] or "-",
             f"{f['error'].rsplit('.', 1)[-1]}: {f['message']}"[:100]]
            for f in data["recent_failures"][:10]])
    return "\n".join(lines)


def _rate_limit_cell(queue: dict) -> str:
    limit = queue.get("rate_limit") or "-"
    if queue.get("rate_limit_differs"):
        return f"{limit}* ({queue.get('rate_limit_here') or 'none'})"
    return limit


def _confirm(prompt: str, refused: str) -> None:
    """Ask on the terminal before a bulk change. The question goes to stderr, not
    stdout: with --json, stdout is the JSON alone (input() wrote its prompt there when
    stdout was a pipe, so `| jq` got text before the JSON, and the user no prompt)."""
    if not sys.stdin.isatty():
        raise CommandError(f"{prompt} Add --yes to go ahead.")
    sys.stderr.write(f"{prompt}\nType 'yes' to go ahead: ")
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() != "yes":
        raise CommandError(refused)


def _job_data(detail) -> dict:
    record = detail.record
    return {
        "id": record.id, "task": record.task, "queue": record.queue,
        "priority": record.priority, "state": record.state, "attempts": record.attempts,
        "max_attempts": record.max_attempts, "worker_ids": list(record.worker_ids),
        "enqueued_at": record.enqueued_at, "run_after": record.run_after,
        "retry_at": record.retry_at,
        "started_at": record.started_at, "finished_at": record.finished_at,
        "arguments": detail.args, "return_value": detail.return_value,
        "arguments_note": detail.args_note, "return_value_note": detail.value_note,
        "verified": detail.verified, "note": detail.verification_error or detail.result_note,
        "errors": [{"exception": e.exception_class_path, "message": e.message,
                    "attempt": e.attempt, "worker_id": e.worker_id, "traceback": e.traceback}
                   for e in record.errors],
        "places": [{"what": label, "path": path} for label, path in detail.places],
    }


def _job_text(detail) -> str:
    record = detail.record
    lines = [
        f"job:       {record.id}",
        f"task:      {record.task}",
        f"queue:     {record.queue} (priority {record.priority})",
        f"state:     {record.state}",
        f"attempts:  {dashboard.attempts_text(record)}"
        + (f" (workers: {', '.join(record.worker_ids)})" if record.worker_ids else ""),
    ]
    if detail.args or detail.args_note:
        lines.append(f"arguments: {detail.args or detail.args_note}")
        if detail.args and detail.args_note:
            lines.append(f"           {detail.args_note}")
    if record.state == records.SUCCESSFUL:
        lines.append(f"result:    {detail.return_value or detail.result_note}")
        if detail.value_note:
            lines.append(f"           {detail.value_note}")
    if detail.verification_error:
        lines.append(f"payload:   not verified: {detail.verification_error}")
    timings = [w for w in (detail.waited and f"waited {detail.waited}",
                           detail.ran and f"ran {detail.ran}") if w]
    if timings:
        lines.append(f"timings:   {', '.join(timings)}")
    lines.append("history:")
    lines += [f"  {_when(when) if when else ' ' * 25}  {what}"
              for when, what in dashboard.history(record)]
    if record.errors:
        last = record.errors[-1]
        lines.append(f"last error (attempt {last.attempt or '?'}): "
                     f"{last.exception_class_path}: {last.message}")
        lines += ["  " + line for line in (last.traceback or "").rstrip().splitlines()[-15:]]
    lines.append("in the tree:")
    lines += [f"  {label}: {path}" for label, path in detail.places] or ["  (nowhere)"]
    return "\n".join(lines)
