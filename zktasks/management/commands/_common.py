"""What the zktasks management commands share: the backend by alias, option types.

Django ignores modules of commands/ whose name starts with an underscore, so this is no
command of its own.
"""

import argparse

from django.core.management.base import CommandError
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTaskBackend


def zk_backend(alias: str, command: str):
    """The ZooKeeperBackend of TASKS[alias], or a CommandError that says what to fix."""
    from zktasks.backend import ZooKeeperBackend

    try:
        backend = task_backends[alias]
    except InvalidTaskBackend as exc:
        raise CommandError(
            f"No task backend {alias!r}: {str(exc).rstrip('.')}; check TASKS in your "
            "settings or --backend."
        ) from exc
    if not isinstance(backend, ZooKeeperBackend):
        raise CommandError(
            f"TASKS[{alias!r}] uses {type(backend).__name__}; {command} needs "
            "'zktasks.backend.ZooKeeperBackend'."
        )
    return backend


def whole_number(minimum: int):
    """An argparse type: a whole number of at least `minimum`."""
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(
                f"{value!r} must not be negative" if minimum == 0
                else f"{value!r} must be at least {minimum}")
        return number
    return parse


def seconds(value: str) -> float:
    """An argparse type: a number of seconds, not negative."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must not be negative")
    return number
