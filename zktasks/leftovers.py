"""Put back what a job changed in its task process's state, before the next job runs.

A task process runs many jobs one after the other. A job that calls `os.chdir()`, sets
`os.umask()` or edits `os.environ` changed them for every later job of that process too:
a relative path, a created file's mode or a setting read from the environment then
depended on which jobs the process happened to run before (Celery's prefork pool has the
same leak). The task process takes a snapshot when it is ready and puts these three back
after each job. Only with `--pool process`: in the thread pool the jobs share the worker's
process, and putting back one job's change would pull it from under a job still running.

Cheap enough for every job (about 1 µs, against the 0.2 ms a no-op job costs a task
process): one getcwd(), one umask(), and a comparison of os.environ's encoded dict.
"""

import logging
import os

logger = logging.getLogger(__name__)


class ProcessState:
    """The working directory, umask and environment a task process started its jobs with."""

    def __init__(self):
        self.cwd = _getcwd()
        self.umask = os.umask(0)
        os.umask(self.umask)
        self.environ = dict(os.environ)
        # os.environ's own bytes dict (CPython's os._Environ since 3.2): comparing it is a
        # quarter of a microsecond; comparing the decoded mapping costs about 17 µs.
        self._encoded = dict(_encoded())

    def restore(self, job_id: str) -> list[str]:
        """Put back what job `job_id` changed; return what that was (for the debug log
        and tests). Never raises: the task process must go on to its next job."""
        changed: list[str] = []
        try:
            self._restore(job_id, changed)
        except Exception:
            logger.warning("task process could not put back its state after job=%s "
                           "(put back: %s)", job_id, ", ".join(changed) or "nothing",
                           exc_info=True)
        return changed

    def _restore(self, job_id: str, changed: list[str]) -> None:
        if os.umask(self.umask) != self.umask:
            changed.append("umask")
        if self.cwd is not None and _getcwd() != self.cwd:
            try:
                os.chdir(self.cwd)
                changed.append("working directory")
            except OSError as exc:  # removed since (by a job?): nothing to go back to
                logger.warning("task process could not go back to its working directory "
                               "%s after job=%s: %s", self.cwd, job_id, exc)
                self.cwd = None
        if _encoded() != self._encoded:
            for key in [key for key in os.environ if key not in self.environ]:
                del os.environ[key]
            for key, value in self.environ.items():
                if os.environ.get(key) != value:
                    os.environ[key] = value
            changed.append("environment")
        if changed:
            logger.debug("job=%s changed its task process's %s; put back for the next job",
                         job_id, ", ".join(changed))


def _getcwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # started in a directory removed since
        return None


def _encoded() -> dict:
    data = getattr(os.environ, "_data", None)
    return data if isinstance(data, dict) else dict(os.environ)
