"""An unmanaged model, so the admin index lists the dashboard; jobs live in ZooKeeper.

No table is ever created for it (DESIGN.md: "the database holds nothing of the jobs").
It names the dashboard's permission, and its unsaved instances stand for jobs in the
admin log (LogEntry wants an object with a content type and a primary key).
"""

from django.db import models


class Job(models.Model):
    """A job of a zktasks backend, as the admin log and the admin index see it."""

    id = models.CharField(primary_key=True, max_length=64)

    class Meta:
        managed = False
        verbose_name = "job"
        verbose_name_plural = "jobs"
        default_permissions = ()
        permissions = [
            ("manage_jobs", "Can retry, cancel and purge jobs, drain workers, re-queue or "
                            "discard dead letters, and pause, resume or run schedules"),
        ]

    def __str__(self):
        # Log entries of actions on other things (a purge, a worker) carry a label.
        return getattr(self, "label", "") or f"job {self.id}"
