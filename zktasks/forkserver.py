"""The fork server's preload: Django set up once, and every task process forked from it.

ProcessRunner starts task processes with multiprocessing's "forkserver" method and names
this module as the server's preload. The server is a fresh interpreter (started by the
worker before its ZooKeeper client exists, and never touching one: kazoo is not
fork-safe), which imports the project and runs django.setup() once; each task process is
a fork of it. The task processes then share those pages instead of each importing
Django again (Celery's prefork children share their parent's the same way), and a task
process that replaces one (a task killed its process, --max-tasks-per-child) is ready in
milliseconds instead of the seconds a django.setup() can take.

Nothing else imports this module: a task process that finds it already imported was
forked from a server that ran it (executor._child_main reads `error` from it).
"""

import gc
import json
import os
import signal
import sys
import traceback

# The group's signals (Ctrl-C, a closed terminal, systemd's control-group stop) are
# ignored here as in a task process: the server is in the worker's process group, and its
# death kills every task process (their parent-death signal), while the worker alone
# decides what stops. SYS_PATH_ENV: the worker's sys.path (see executor).
from .executor import _GROUP_SIGNALS, SYS_PATH_ENV

error: str | None = None  # the traceback of a setup that failed, for the task processes


def _preload() -> None:
    global error
    for signum in _GROUP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    # Blocked by the thread that started us (executor: around a task process's start).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _GROUP_SIGNALS)
    paths = os.environ.get(SYS_PATH_ENV)
    if paths:
        sys.path[:] = json.loads(paths)
    # What the gc module's documentation says for a process that forks without exec():
    # no collection here (it would leave holes in pages the forks share), and the setup's
    # objects frozen, so that a fork's collections never write into them (every object a
    # collection visits is a write to its page, copied at once). A fork enables the
    # collector again (executor._child_main).
    gc.disable()
    try:
        import django

        django.setup()
        from django.db import connections

        # An app's ready() that queried would leave a socket every fork would share.
        connections.close_all()
        # What every task process imports to run a job (dill, asyncio, the tasks
        # framework): once here rather than in each fork.
        import asyncio  # noqa: F401

        from asgiref.sync import async_to_sync  # noqa: F401
        from django.tasks import TaskContext  # noqa: F401

        # And zktasks.backend: a task module's @zk_task (or @task) looks its backend up
        # as it is imported, which imports the backend module, kazoo and the Store. Each
        # task process did that at its first job, 0.07-0.1 s of CPU on a 2-CPU VM, 4 %
        # of a 6,000-job backlog's samples (bench --profile). Imported only: no client
        # exists until a task process submits (kazoo is not fork-safe), and importing
        # starts no thread.
        from . import backend, context, serialization  # noqa: F401
        gc.freeze()
    except BaseException:  # noqa: BLE001 - reported by every task process, not here
        # multiprocessing would swallow an ImportError and die of anything else; each
        # task process prints this and exits instead, and the worker stops with the
        # reason (ProcessRunner.wait_ready), as when a task process set itself up.
        error = traceback.format_exc()


_preload()
