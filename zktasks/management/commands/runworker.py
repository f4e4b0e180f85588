"""`manage.py runworker`: argparse, logging and OS signals around zktasks.worker.Worker."""

import argparse
import logging
import signal
import threading

from django.core.management.base import BaseCommand, CommandError
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS

from zktasks.exceptions import ZkTasksError
from zktasks.loghandler import format_last_resort

from ._common import (
    configured,
    seconds,
    stderr_handler,
    whole_number,
    zk_backend,
    znode_name,
)

# -v when the project's logging leaves the zktasks logger alone: 1 (the default) says who
# leads, what was assigned to whom, what ran and how it ended; 2 adds the DEBUG lines
# (refused batches, failed clean-ups); 3 adds kazoo's INFO lines (its connections).
_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}

_queue_name = znode_name("queue name")


def _queues(value: str) -> list[str]:
    names = [q.strip() for q in value.split(",")]
    if not names or not all(names):
        raise argparse.ArgumentTypeError(
            f"{value!r} has an empty queue name; give names separated by commas, "
            "e.g. default,emails")
    return [_queue_name(name) for name in names]


class Command(BaseCommand):
    help = (
        "Run a zktasks worker: join the leader election, run the jobs assigned to this "
        "worker, and (when elected) assign pending jobs to live workers. SIGTERM or Ctrl-C "
        "drains (finishes running jobs, hands back the rest); a second one stops at once."
    )

    def add_arguments(self, parser):
        parser.add_argument("--queues", type=_queues, default=None,
                            help="comma-separated queues to serve (default: the backend's "
                                 "QUEUES, or 'default')")
        parser.add_argument("--concurrency", type=whole_number(1), default=None,
                            help="jobs run at once (default: number of CPUs)")
        parser.add_argument("--pool", choices=["process", "thread"], default="process",
                            help="run jobs in task processes (default; survives crashes and "
                                 "enforces time limits) or in threads (I/O-bound work)")
        parser.add_argument("--backend", default=DEFAULT_TASK_BACKEND_ALIAS,
                            help="alias of the ZooKeeperBackend in TASKS (default: %(default)s)")
        parser.add_argument("--name", type=znode_name("worker name"), default=None,
                            help="worker name prefix shown in the dashboard: letters, digits, "
                                 "'_', '-', '.' (default: host-pid)")
        parser.add_argument("--no-leader", action="store_true",
                            help="never lead: only run jobs")
        parser.add_argument("--prefetch", type=whole_number(0), default=None,
                            help="jobs assigned beyond --concurrency, waiting here (default: 4 per "
                                 "runner like Celery, 16 while jobs average under 5 ms; "
                                 "0 or 1 for long jobs)")
        parser.add_argument("--drain-timeout", type=seconds, default=30.0,
                            help="seconds to let running jobs finish on SIGTERM (default 30); "
                                 "past it they are handed back and runworker exits 1")
        parser.add_argument("--startup-timeout", type=seconds, default=None,
                            metavar="SECONDS",
                            help="give up (exit 1) when ZooKeeper has not answered this long "
                                 "after start (default: keep trying, saying why each "
                                 "CONNECT_TIMEOUT)")
        parser.add_argument("--max-tasks-per-child", type=whole_number(1), default=None,
                            metavar="N",
                            help="replace a task process once it has run N jobs (default: "
                                 "never; --pool process only)")
        parser.add_argument("--max-memory-per-child", type=whole_number(1), default=None,
                            metavar="KB",
                            help="replace a task process after a job that leaves it over KB "
                                 "kilobytes of resident memory; the job itself completes "
                                 "(default: no limit; --pool process only)")

    def handle(self, *args, **options):
        import os

        from zktasks.worker import Worker

        self._configure_logging(options["verbosity"])
        alias = options["backend"]
        backend = zk_backend(alias, "runworker")
        queues = options["queues"] or sorted(backend.queues) or ["default"]
        unknown = sorted(set(queues) - backend.queues) if backend.queues else []
        if unknown:
            raise CommandError(
                f"Queues {unknown!r} are not in TASKS[{alias!r}]['QUEUES'] "
                f"({sorted(backend.queues)!r}); add them there or drop them from --queues."
            )
        recycle = [f"--{name.replace('_', '-')}" for name in
                   ("max_tasks_per_child", "max_memory_per_child") if options[name]]
        if recycle and options["pool"] != "process":
            raise CommandError(
                f"{' and '.join(recycle)} replace task processes, and --pool "
                f"{options['pool']} has none: drop {'them' if len(recycle) > 1 else 'it'} "
                "or use --pool process.")
        try:
            worker = Worker(
                backend=alias, queues=queues,
                concurrency=options["concurrency"] or os.cpu_count() or 1,
                pool=options["pool"], name=options["name"], lead=not options["no_leader"],
                prefetch=options["prefetch"], drain_timeout=options["drain_timeout"],
                max_tasks_per_child=options["max_tasks_per_child"],
                max_memory_per_child=options["max_memory_per_child"],
                startup_timeout=options["startup_timeout"],
            )
        except ZkTasksError as exc:
            raise CommandError(str(exc)) from exc
        self._install_signals(worker)
        self.stdout.write(
            f"zktasks worker starting: backend={alias} hosts={backend.conf.hosts} "
            f"root={backend.conf.root} queues={','.join(queues)} "
            f"concurrency={worker.concurrency} pool={worker.pool_name}"
        )
        try:
            worker.run()
        except ZkTasksError as exc:
            raise CommandError(str(exc)) from exc
        if worker.unfinished:
            # Exit non-zero: a supervisor or deploy script sees the drain was cut short.
            raise CommandError(
                f"zktasks worker stopped with {worker.unfinished} job(s) unfinished: the "
                f"drain timed out after {worker.drain_timeout:g} s. They are handed back "
                "and run again on another worker; give --drain-timeout the time your "
                "longest task needs.")
        self.stdout.write("zktasks worker stopped")

    def _install_signals(self, worker) -> None:
        count = {"n": 0}

        def say(text: str) -> None:
            try:
                self.stderr.write(text)
            except Exception:
                # The terminal is gone (SIGHUP, OSError), or the signal came in the middle
                # of a write to the same stream (RuntimeError: reentrant call): the stop
                # matters, not the line.
                pass

        def on_signal(signum, frame):
            count["n"] += 1
            name = signal.Signals(signum).name
            # The stop first, then the line: nothing said can keep it from being asked.
            if count["n"] == 1:
                worker.stop(graceful=True)
                say(f"{name}: draining (send again to stop at once)")
            else:
                worker.stop(graceful=False)
                say(f"{name}: stopping now")

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
            # A closed terminal drains too (by default SIGHUP ended the worker at once,
            # and its task processes with their jobs), unless nohup, or whoever started
            # us, chose to ignore it.
            if signal.getsignal(signal.SIGHUP) == signal.SIG_DFL:
                signal.signal(signal.SIGHUP, on_signal)

    def _configure_logging(self, verbosity: int) -> None:
        """Log to stderr, at the level -v says, what the project's logging leaves alone.

        A logger the project configured (LOGGING gives it a level or handlers, or the
        root logger has handlers) is used as it is, -v included: the project's level
        wins. kazoo's warnings (a dropped connection, about once a second during an
        outage) get the same timestamped lines instead of Python's bare last resort.
        """
        handler = None
        zk_logger = logging.getLogger("zktasks")
        if not configured(zk_logger):
            handler = stderr_handler()
            zk_logger.addHandler(handler)
            zk_logger.setLevel(_LEVELS.get(verbosity, logging.DEBUG))
        kazoo = logging.getLogger("kazoo")
        if not configured(kazoo):
            kazoo.addHandler(handler or stderr_handler())
            kazoo.setLevel(logging.INFO if verbosity >= 3 else logging.WARNING)
        # The tasks' own loggers (thread pool; task processes do the same): their
        # warnings read like ours instead of Python's bare last resort.
        format_last_resort(after=handler)
