"""Tasks the dashboard tests submit; importable by in-process and runworker workers."""

import os

from zktasks import zk_task


@zk_task
def fails_until_file(path):
    """Fail while `path` does not exist; succeed once a test has created it."""
    if not os.path.exists(path):
        raise RuntimeError(f"{path} does not exist yet")
    return "recovered"


@zk_task
def echo(value):
    return value


@zk_task
def raise_text(text):
    raise ValueError(text)


@zk_task(queue_name="emails", priority=7)
def send(address):
    return f"sent to {address}"
