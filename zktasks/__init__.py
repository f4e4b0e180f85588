"""zktasks: background tasks for Django, coordinated by Apache ZooKeeper.

The public API is `__all__`; everything else is internal.
"""

from .exceptions import (
    ConfigurationError,
    CorruptRecord,
    DeadLetterRefused,
    InvalidTaskError,
    JobCancelled,
    JobNotFound,
    PayloadTooLarge,
    PayloadVerificationError,
    Retry,
    RetryRefused,
    ScheduleNotFound,
    SerializationError,
    TaskProcessDied,
    TaskTimeout,
    WorkerLost,
    ZkTasksError,
    ZooKeeperUnavailableError,
)

__all__ = [
    "zk_task",
    "submit",
    "pipelined",
    "cancel_requested",
    "ZkTask",
    "ZkTaskResult",
    "ZkTasksError",
    "ConfigurationError",
    "CorruptRecord",
    "DeadLetterRefused",
    "InvalidTaskError",
    "JobCancelled",
    "JobNotFound",
    "PayloadTooLarge",
    "PayloadVerificationError",
    "Retry",
    "RetryRefused",
    "ScheduleNotFound",
    "SerializationError",
    "TaskProcessDied",
    "TaskTimeout",
    "WorkerLost",
    "ZooKeeperUnavailableError",
]


def __getattr__(name):
    # zk_task and friends import django.tasks, which needs settings: load them on first
    # use so that `import zktasks` (and zktasks.testing) work before Django is set up.
    if name == "cancel_requested":
        from .context import cancel_requested

        return cancel_requested
    if name == "pipelined":
        from .pipeline import pipelined

        return pipelined
    if name in ("zk_task", "submit", "ZkTask", "ZkTaskResult"):
        from . import task

        return getattr(task, name)
    raise AttributeError(f"module 'zktasks' has no attribute {name!r}")
