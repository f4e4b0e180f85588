"""`manage.py runworker`: argparse, logging and OS signals around zktasks.worker.Worker."""

import argparse
import logging
import signal
import sys
import threading

from django.core.management.base import BaseCommand, CommandError
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS

from zktasks.exceptions import ZkTasksError
from zktasks.tree import QUEUE_RE

from ._common import seconds, whole_number, zk_backend

_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.INFO, 3: logging.DEBUG}


def _queues(value: str) -> list[str]:
    names = [q.strip() for q in value.split(",")]
    if not names or not all(names):
        raise argparse.ArgumentTypeError(
            f"{value!r} has an empty queue name; give names separated by commas, "
            "e.g. default,emails")
    for name in names:
        if not QUEUE_RE.match(name):
            raise argparse.ArgumentTypeError(
                f"{name!r} is not a valid queue name (letters, digits, '_', '-', '.')"
            )
    return names


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
        parser.add_argument("--name", default=None,
                            help="worker name prefix shown in the dashboard (default: host-pid)")
        parser.add_argument("--no-leader", action="store_true",
                            help="never lead: only run jobs")
        parser.add_argument("--prefetch", type=whole_number(0), default=None,
                            help="jobs assigned beyond --concurrency, waiting here (default: 4 per "
                                 "runner like Celery, 16 while jobs average under 5 ms; "
                                 "0 or 1 for long jobs)")
        parser.add_argument("--drain-timeout", type=seconds, default=30.0,
                            help="seconds to let running jobs finish on SIGTERM (default 30)")

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
        try:
            worker = Worker(
                backend=alias, queues=queues,
                concurrency=options["concurrency"] or os.cpu_count() or 1,
                pool=options["pool"], name=options["name"], lead=not options["no_leader"],
                prefetch=options["prefetch"], drain_timeout=options["drain_timeout"],
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
        self.stdout.write("zktasks worker stopped")

    def _install_signals(self, worker) -> None:
        count = {"n": 0}

        def on_signal(signum, frame):
            count["n"] += 1
            name = signal.Signals(signum).name
            if count["n"] == 1:
                self.stderr.write(f"{name}: draining (send again to stop at once)")
                worker.stop(graceful=True)
            else:
                self.stderr.write(f"{name}: stopping now")
                worker.stop(graceful=False)

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)

    def _configure_logging(self, verbosity: int) -> None:
        level = _LEVELS.get(verbosity, logging.DEBUG)
        logger = logging.getLogger("zktasks")
        if not logger.handlers and not logging.getLogger().handlers:
            from zktasks.loghandler import GroupingStreamHandler

            handler = GroupingStreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s"))
            logger.addHandler(handler)
        logger.setLevel(level)
        if verbosity >= 3:
            logging.getLogger("kazoo").setLevel(logging.INFO)
