"""What the zktasks management commands share: the backend by alias, option types, logging.

Django ignores modules of commands/ whose name starts with an underscore, so this is no
command of its own.
"""

import argparse
import logging
import math
import sys

from django.core.management.base import CommandError
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTaskBackend

from zktasks.loghandler import LOG_FORMAT
from zktasks.tree import QUEUE_RE

# A bound on durations typed at a shell: a century is longer than any sensible age or
# timeout, and datetime arithmetic overflows a few thousand years out.
MAX_SECONDS = 100 * 365.25 * 86400


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


def whole_number(minimum: int, maximum: int | None = None):
    """An argparse type: a whole number of at least `minimum` (and at most `maximum`)."""
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(
                f"{value!r} must not be negative" if minimum == 0
                else f"{value!r} must be at least {minimum}")
        if maximum is not None and number > maximum:
            raise argparse.ArgumentTypeError(f"{value!r} must be at most {maximum}")
        return number
    return parse


def seconds(value: str) -> float:
    """An argparse type: a number of seconds, not negative, at most a century."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number of seconds")
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must not be negative")
    if number > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{value!r} is more than 100 years; give at most {MAX_SECONDS:.0f} seconds")
    return number


def znode_name(what: str):
    """An argparse type: a name that becomes part of a znode's name (a queue's, a
    worker's): letters, digits, '_', '-' and '.', not first, at most 100 characters."""
    def parse(value: str) -> str:
        if not QUEUE_RE.match(value):
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a valid {what} (letters, digits, '_', '-', '.', "
                "not starting with '.', at most 100 characters)")
        return value
    return parse


def configured(logger: logging.Logger) -> bool:
    """Whether the project's logging decides where `logger`'s records go: a level or a
    handler of its own, or a handler on the root logger. Otherwise they would reach
    Python's last-resort handler: bare messages, no time, no level."""
    return bool(logger.level != logging.NOTSET or logger.handlers
                or logging.getLogger().handlers)


def stderr_handler() -> logging.Handler:
    """The handler commands install where the project configured none (zktasks.loghandler
    says why it groups lines)."""
    from zktasks.loghandler import Formatter, GroupingStreamHandler

    handler = GroupingStreamHandler(sys.stderr)
    handler.setFormatter(Formatter(LOG_FORMAT))
    return handler
