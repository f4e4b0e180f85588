"""Module-level no-op tasks: they travel by reference, so a job costs only the pipeline."""

import time

from zktasks import zk_task


@zk_task
def noop():
    return None


@zk_task
def echo(value):
    return value


@zk_task
def sleep10():
    """The second workload of the peer comparison: 10 ms of sleep (bench/peers/work.py)."""
    time.sleep(0.010)


@zk_task
def record(path, number):
    """Append the job's number to a file: the scale bench counts executions from it."""
    import os

    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{number}\n".encode())
    finally:
        os.close(fd)
