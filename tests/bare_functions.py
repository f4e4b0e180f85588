"""Plain functions for task processes to run, in a module that imports no part of zktasks
(tests/unit/test_fork_server.py): what a task process has imported before its first job
is what its fork server preloaded."""

import sys


def imported(name):
    """Whether module `name` is imported where it runs (without importing it)."""
    return name in sys.modules
