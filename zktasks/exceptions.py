"""Define the exceptions zktasks raises; every one derives from ZkTasksError."""

from django.core.exceptions import ImproperlyConfigured
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist


class ZkTasksError(Exception):
    """Root of every error zktasks raises on purpose."""


class ConfigurationError(ZkTasksError, ImproperlyConfigured):
    """The backend's settings are wrong; the message says which one and how to fix it."""


class InvalidTaskError(ZkTasksError, InvalidTask):
    """A task, or one submission of it, cannot be accepted (queue, priority, options)."""


class SerializationError(ZkTasksError, ValueError):
    """An argument or return value cannot be serialized with dill."""


class PayloadTooLarge(SerializationError):
    """A job or its result would not fit in one znode."""


class PayloadVerificationError(ZkTasksError):
    """A payload or result failed its HMAC check: unsigned, tampered, copied or foreign."""


class ZooKeeperUnavailableError(ZkTasksError, ConnectionError):
    """ZooKeeper could not be reached within the configured bound."""


class JobNotFound(ZkTasksError, TaskResultDoesNotExist):
    """No status record exists for that id (never submitted, or expired)."""


class TaskTimeout(ZkTasksError, TimeoutError):
    """A task ran past its time limit and was stopped."""


class TaskProcessDied(ZkTasksError):
    """The process running a task exited before reporting an outcome."""


class WorkerLost(ZkTasksError):
    """The worker running a job vanished (its session ended); the job was handed back."""


class JobCancelled(ZkTasksError):
    """The job was cancelled before it could finish."""


class CorruptRecord(ZkTasksError):
    """A znode under ROOT holds data that is not a record zktasks wrote."""


class Retry(ZkTasksError):
    """Raise inside a task to ask for another attempt (within max_attempts).

    `delay` is seconds to wait first; None uses the task's backoff.
    """

    def __init__(self, message: str = "retry requested", *, delay: float | None = None):
        super().__init__(message)
        self.delay = delay


class RetryRefused(ZkTasksError):
    """A failed job cannot be sent back to its queue now; the message says why."""


class DeadLetterRefused(ZkTasksError):
    """A dead-letter entry cannot be re-queued (or is gone); the message says why."""


class ScheduleNotFound(ZkTasksError, LookupError):
    """No schedule of that name is in OPTIONS['SCHEDULES']."""
