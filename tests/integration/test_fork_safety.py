"""A client that crosses a fork (gunicorn --preload, a multiprocessing "fork" child)
must not write into its parent's connection."""

import os
import signal

import pytest

from zktasks.client import new_client, start


@pytest.mark.filterwarnings("ignore:This process.*fork:DeprecationWarning")
def test_a_forked_child_does_not_write_into_the_parent_s_connection(backend):
    """Requests are written from the calling thread (connection.py). In a forked child
    the socket is the parent's: the child's request went down the parent's connection,
    and the parent's reader took a reply it never asked for (xid mismatch: its
    connection loop died, and with it every call of the parent)."""
    options = backend.store.options
    client = start(new_client(options), options)
    try:
        client.ensure_path(options.root)
        pid = os.fork()
        if pid == 0:  # the child: one call, which must not reach the parent's socket
            # A lock some parent thread held at the fork would hang the child for good:
            # the alarm ends it, and the parent's own checks below still decide.
            signal.alarm(10)
            code = 0
            try:
                client.exists_async(options.root).get(timeout=2)
                code = 3  # answered: it used the parent's connection
            except BaseException:  # noqa: BLE001 - anything but an answer is right
                code = 0
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) in (0, -signal.SIGALRM), \
            "the child's request was answered"
        for _ in range(50):
            assert client.exists(options.root) is not None
        assert client.connected
    finally:
        client.stop()
        client.close()
