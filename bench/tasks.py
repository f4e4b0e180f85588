"""Module-level no-op tasks: they travel by reference, so a job costs only the pipeline."""

from zktasks import zk_task


@zk_task
def noop():
    return None


@zk_task
def echo(value):
    return value
