"""Put back what a job changed in its task process's state, before the next job runs.

A task process runs many jobs one after the other. A job that calls `os.chdir()` or
`os.umask()` changed them for every later job of that process too: a relative path, or
a created file's mode, then depended on which jobs the process happened to run before
(Celery's prefork pool has the same leak). The task process notes both when it is ready
and puts them back after each job. Only with `--pool process`: in the thread pool the
jobs share the worker's process, and putting back one job's change would pull it from
under a job still running.

`os.environ` is left alone, on purpose: task modules are imported by the first job that
needs them, and what a module sets up in the environment when imported
(`os.environ.setdefault("TOKENIZERS_PARALLELISM", ...)`) must stay for the jobs after
it, which no longer import it. Telling that from a job's own change is not possible
from here.

Cheap enough for every job (about 1 µs, against the 0.2 ms a no-op job costs a task
process): one umask(), and one stat() of "." compared with the directory kept open.
The directory is kept as an open descriptor and compared by device and inode: by its
path, a deploy that moves `app` aside and puts a new `app` in its place would move a
process no job touched into the new one.
"""

import logging
import os

logger = logging.getLogger(__name__)


class ProcessState:
    """The working directory and umask a task process started its jobs with."""

    def __init__(self):
        self.umask = os.umask(0)
        os.umask(self.umask)
        # O_PATH (Linux) needs no read permission, as chdir() does not: a directory the
        # worker may only search (0711) is kept too.
        flags = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY
        try:
            self._cwd: int | None = os.open(".", flags)
            stat = os.fstat(self._cwd)
            self._cwd_id = (stat.st_dev, stat.st_ino)
        except OSError as exc:  # started in a directory removed since, say
            logger.warning("task process cannot keep its working directory (%s); a job "
                           "that changes it changes it for the jobs after it", exc)
            self._cwd, self._cwd_id = None, None

    def restore(self, job_id: str) -> list[str]:
        """Put back what job `job_id` changed; return what that was (for the debug log
        and tests). Never raises: the task process must go on to its next job."""
        changed: list[str] = []
        try:
            self._restore(changed)
        except Exception:
            logger.warning("task process could not put back its state after job=%s "
                           "(put back: %s)", job_id, ", ".join(changed) or "nothing",
                           exc_info=True)
        if changed:
            logger.debug("job=%s changed its task process's %s; put back for the next job",
                         job_id, ", ".join(changed))
        return changed

    def _restore(self, changed: list[str]) -> None:
        if os.umask(self.umask) != self.umask:
            changed.append("umask")
        if self._cwd is not None:
            try:
                here = os.stat(".")
                moved = (here.st_dev, here.st_ino) != self._cwd_id
            except OSError:  # the job's directory was removed under it
                moved = True
            if moved and self._go_back():
                changed.append("working directory")

    def _go_back(self) -> bool:
        """fchdir() to the kept directory, once sure the descriptor is still it: a job
        may have closed it, or a directory it opened since may have its number."""
        try:
            kept = os.fstat(self._cwd)
            same = (kept.st_dev, kept.st_ino) == self._cwd_id
        except OSError:
            same = False
        if not same:
            logger.warning("task process lost the descriptor of its working directory (a "
                           "job closed or reused it); a job that changes the directory now "
                           "changes it for the jobs after it")
            self._cwd = None
            return False
        os.fchdir(self._cwd)
        return True
