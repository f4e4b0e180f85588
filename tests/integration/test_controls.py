"""run_after, retries with backoff, Retry, retry_on, cancel: on a real ZooKeeper, with
crashes in the middle."""

from datetime import timedelta

import pytest
from django.tasks import TaskResultStatus
from django.utils import timezone

from tests import tasks
from tests.pending import delayed_nodes
from tests.waiting import wait_for_data, wait_until
from zktasks import InvalidTaskError, dashboard
from zktasks.exceptions import CorruptRecord, RetryRefused


def test_run_after_is_not_run_before_its_time(backend, start_worker, zk_client):
    start_worker()
    # Far enough away that the read below comes first however slow the machine: at
    # run_after the leader moves the job out of delayed/.
    when = timezone.now() + timedelta(seconds=10)
    job = tasks.add.using(run_after=when).submit(1, 2)
    layout = backend.store.layout
    assert len(delayed_nodes(zk_client, layout)) == 1  # waiting, not pending
    result = job.wait(timeout=60)
    assert result.return_value == 3
    assert result.started_at >= when


def test_a_project_without_time_zones_gets_naive_times(backend, start_worker, settings):
    """USE_TZ = False: a naive run_after is valid (Django's rule), read in TIME_ZONE, and
    results carry naive times as Django's own backends give them."""
    settings.USE_TZ = False
    start_worker()
    when = timezone.now() + timedelta(seconds=1)
    assert timezone.is_naive(when)
    job = tasks.add.using(run_after=when).submit(1, 2)  # raised TypeError before
    result = job.wait(timeout=30)
    assert result.return_value == 3
    assert timezone.is_naive(result.enqueued_at) and timezone.is_naive(result.finished_at)
    assert result.started_at >= when  # comparable, and not run before its time
    assert result.task.run_after == when
    assert result.finished_at <= timezone.now()


def test_run_after_in_the_past_runs_at_once(backend, start_worker):
    start_worker()
    job = tasks.add.using(run_after=timezone.now() - timedelta(hours=1)).submit(1, 1)
    assert job.wait(timeout=30).return_value == 2


def test_naive_run_after_is_refused(backend):
    from datetime import datetime

    with pytest.raises(InvalidTaskError, match="naive"):
        tasks.add.using(run_after=datetime(2030, 1, 1)).submit(1, 1)


def test_run_after_survives_a_leader_change(backend, start_worker, zk_client):
    first = start_worker(name="first")
    wait_until(lambda: first.leader is not None and first.leader.is_leader, 60, "a leader")
    # Far enough away that the leader surely dies before the job is due.
    when = timezone.now() + timedelta(seconds=10)
    job = tasks.add.using(run_after=when).submit(4, 4)
    first.stop(graceful=False)  # the leader dies before the job is due
    assert first.wait_stopped(60)
    second = start_worker(name="second")
    result = job.wait(timeout=60)
    assert result.return_value == 8
    assert result.worker_ids == [second.worker_id]  # run exactly once
    assert result.started_at >= when


def test_backoff_waits_in_delayed_then_retries(backend, start_worker, zk_client):
    start_worker()
    # A backoff of 5 s keeps the job waiting for at least 2.5 s (the jitter's lower bound):
    # the watch below sees that state however slow the machine (0.4 s gave 0.2 s).
    job = tasks.fails_once_with_backoff.using(backoff=5.0).submit()
    record = wait_for_data(zk_client, backend.store.layout.status(job.id),
                           lambda d: d["state"] == "READY" and d["attempts"] == 1)
    assert record["retry_at"]  # waiting for its backoff
    result = job.wait(timeout=60)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 2
    # The task is still the one submitted: the backoff is not its run_after
    # (TaskResult.task, and what a TaskContext of the next attempt shows).
    assert "run_after" not in record or record["run_after"] is None
    assert result.task.run_after is None
    assert backend.get_result(job.id).task == job.task
    # Cleared by the start that ended the backoff: a later hand-back is due at once.
    assert backend.store.read_status(job.id).record.retry_at is None
    first_failure = result.errors[0]
    assert first_failure.exception_class_path == "builtins.ConnectionError"
    # Second attempt no earlier than 0.5 × backoff after the first (jitter lower bound).
    assert result.return_value - result.started_at >= timedelta(seconds=2.5)


def test_task_can_ask_for_a_retry(backend, start_worker):
    start_worker()
    result = tasks.asks_for_retry.submit().wait(timeout=30)
    assert result.return_value == 2
    assert result.errors[0].exception_class_path == "zktasks.exceptions.Retry"


def test_retry_on_limits_which_exceptions_retry(backend, start_worker):
    start_worker()
    result = tasks.raises_value_error.submit().wait(timeout=30)
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1


def test_backoff_callable_can_stop_retrying(backend, start_worker):
    start_worker()
    result = tasks.always_fails.submit().wait(timeout=30)
    assert result.status == TaskResultStatus.FAILED and result.attempts == 2


def test_killing_the_worker_during_backoff_loses_nothing(backend, start_worker, zk_client):
    first = start_worker(name="first")
    # At least 5 s of backoff (half of it, the jitter's lower bound): the worker is surely
    # stopped while the job still waits, and the watch surely sees it waiting.
    job = tasks.fails_once_with_backoff.using(backoff=10.0).submit()
    wait_for_data(zk_client, backend.store.layout.status(job.id),
                  lambda d: d["state"] == "READY" and d["attempts"] == 1)
    first.stop(graceful=False)
    assert first.wait_stopped(60)
    second = start_worker(name="second")
    result = job.wait(timeout=60)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 2 and result.worker_ids[1] == second.worker_id


def test_delayed_job_can_be_cancelled(backend, start_worker, zk_client):
    start_worker()
    job = tasks.add.using(run_after=timezone.now() + timedelta(seconds=30)).submit(1, 1)
    assert job.cancel() is True
    assert job.status == TaskResultStatus.FAILED
    assert delayed_nodes(zk_client, backend.store.layout) == []  # gone in cancel's multi


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_an_async_task_sees_cancel_requested(backend, start_worker, tmp_path, pool):
    """A coroutine runs in asgiref's event-loop thread: the job it runs for, and so
    cancel_requested(), must reach it there (a threading.local did not)."""
    start_worker(pool=pool, concurrency=1)
    marker = tmp_path / "started"
    job = tasks.async_until_cancelled.submit(str(marker))
    wait_until(marker.exists, 30, "the task to start")
    assert job.cancel() is False  # a worker holds it: asked to stop
    job.wait(timeout=30)
    assert job.status == TaskResultStatus.FAILED
    assert job.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"
    assert "stopped on request" in job.errors[-1].traceback


def test_a_retried_cancelled_job_runs_again(backend, start_worker, zk_client, tmp_path):
    """retry() answers the cancel request of the run it retries: the request must not
    cancel the new attempt (workers fail a job handed to them with a standing request)."""
    start_worker(concurrency=1)
    marker = tmp_path / "started"
    job = tasks.until_cancelled.submit(str(marker))
    wait_until(marker.exists, 30, "the task to start")
    assert job.cancel() is False
    assert job.wait(timeout=30).status == TaskResultStatus.FAILED
    marker.unlink()
    assert backend.retry(job.id) is True
    assert not zk_client.exists(backend.store.layout.cancel_request(job.id))
    wait_until(marker.exists, 30, "the retried attempt to start")
    # Its first run was short: this one may begin without its RUNNING write, which then
    # comes committer.LATE_START later.
    wait_for_data(zk_client, backend.store.layout.status(job.id),
                  lambda d: d["state"] == "RUNNING")
    job.refresh()
    assert job.status == TaskResultStatus.RUNNING and job.attempts == 2
    assert job.cancel() is False  # and it can be cancelled again
    assert job.wait(timeout=30).errors[-1].exception_class_path == (
        "zktasks.exceptions.JobCancelled")
    record = backend.store.read_status(job.id).record
    steps = [what for _, what in dashboard.history(record)]
    first = f"attempt 1 on {record.worker_ids[0]} ended with zktasks.exceptions.JobCancelled"
    assert steps[steps.index(first) + 1] == "retried"  # told in order, with the retry


def test_retry_removes_an_index_entry_named_as_before_queues(backend, start_worker,
                                                            zk_client):
    """A job failed under a release that named index entries {id}.F (no queue), the
    name the sweeps still read: retry() missed it, and the purge after deleted the
    status record of the job it had sent back (no record: JobNotFound)."""
    worker = start_worker()
    job = tasks.boom.submit("x")
    assert job.wait(timeout=30).status == TaskResultStatus.FAILED
    worker.stop(graceful=False)
    assert worker.wait_stopped(30)
    store = backend.store
    entry = store.find_index_entry(store.read_status(job.id).record)
    older = entry.rsplit(".", 1)[0]  # {id}.F
    zk_client.create(older, b"")
    zk_client.delete(entry)
    assert backend.retry(job.id) is True
    assert not zk_client.exists(older)
    backend.purge()
    assert backend.get_result(job.id).status == TaskResultStatus.READY  # still there


def test_waiting_inside_a_task_is_warned_about(backend, start_worker, caplog):
    from zktasks import backend as backend_module

    backend_module._warned_in_task.clear()  # logged once per process
    start_worker(concurrency=2)  # a second runner for the job it waits for
    assert tasks.waits_for_add.submit(2, 3).wait(timeout=60).return_value == 5
    assert "waits inside its task for job" in caplog.text


def test_invalid_retry_options_are_refused(backend):
    from zktasks import zk_task

    with pytest.raises(InvalidTaskError, match="backoff"):
        zk_task(backoff=-1)(tasks.add.func)
    with pytest.raises(InvalidTaskError, match="retry_on"):
        zk_task(retry_on=("nope",))(tasks.add.func)


def test_unique_key_returns_the_unfinished_job(backend, start_worker, zk_client):
    first = tasks.add.using(unique_key="order-42").submit(1, 1)
    again = tasks.add.using(unique_key="order-42").submit(9, 9)
    assert again.id == first.id and again.args == [1, 1]
    other = tasks.add.using(unique_key="order-43").submit(2, 2)
    assert other.id != first.id
    start_worker()
    first.wait(timeout=30)
    other.wait(timeout=30)
    assert zk_client.get_children(backend.store.layout.unique) == []  # freed on finish
    later = tasks.add.using(unique_key="order-42").submit(3, 3)
    assert later.id != first.id
    assert later.wait(timeout=30).return_value == 6


def test_unique_key_race_between_processes_gives_one_job(backend, settings, zk_client):
    """Several submitters, each with a ZooKeeper session of its own, race on one key."""
    import threading

    from zktasks.backend import ZooKeeperBackend
    from zktasks.client import new_client, start
    from zktasks.store import Store

    class OwnSessionBackend(ZooKeeperBackend):
        """Stands for another web process: its own session, not the shared client."""

        def __init__(self, *args):
            super().__init__(*args)
            self.client = start(new_client(self.conf), self.conf)

        @property
        def store(self):
            return Store(self.client, self.conf)

    ids, barrier = [], threading.Barrier(4)

    def submit_as_another_process():
        own = OwnSessionBackend("default", settings.TASKS["default"])
        try:
            barrier.wait(10)
            ids.append(own.enqueue(tasks.add.using(unique_key="race"), (1, 2), {}).id)
        finally:
            own.client.stop()
            own.client.close()

    threads = [threading.Thread(target=submit_as_another_process) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(ids) == 4 and len(set(ids)) == 1
    assert len(zk_client.get_children(backend.store.layout.status_dir)) == 1


def _failed_then_idle(start_worker, job):
    """Let a worker fail `job`, then stop it, so that what follows stays pending."""
    worker = start_worker()
    assert job.wait(timeout=30).status == TaskResultStatus.FAILED
    worker.stop(graceful=False)
    assert worker.wait_stopped(30)


def test_a_retried_job_takes_its_unique_key_back(backend, start_worker):
    """Its finish freed the key: a retry without it let a second job take the key while
    the first ran again (two unfinished jobs with one key)."""
    failed = tasks.boom.using(unique_key="only-one").submit("no")
    _failed_then_idle(start_worker, failed)
    assert backend.retry(failed.id) is True
    again = tasks.boom.using(unique_key="only-one").submit("again")
    assert again.id == failed.id


def test_a_retry_is_refused_while_another_job_holds_the_key(backend, start_worker):
    failed = tasks.boom.using(unique_key="taken").submit("no")
    _failed_then_idle(start_worker, failed)
    newer = tasks.add.using(unique_key="taken").submit(1, 1)
    assert newer.id != failed.id
    with pytest.raises(RetryRefused, match=f"held by job {newer.id}"):
        backend.retry(failed.id)
    assert backend.get_result(failed.id).status == TaskResultStatus.FAILED


def test_a_key_whose_job_record_was_lost_is_freed(backend, start_worker, zk_client, caplog):
    """A corrupt record is replaced by a FAILED placeholder that does not know the key:
    the key outlived it, and every later submit with it answered with that job (or,
    once purged, raised JobNotFound). The placeholder cannot be retried either."""
    lost = tasks.add.using(unique_key="lost").submit(1, 1)
    zk_client.set(backend.store.layout.status(lost.id), b"\x80 not json")
    start_worker()

    def replaced():
        try:
            return backend.get_result(lost.id).status == TaskResultStatus.FAILED
        except CorruptRecord:
            return False  # not yet met by the worker
    wait_until(replaced, 30, "the corrupt record replaced by a failed placeholder")
    with pytest.raises(RetryRefused, match="holds no payload"):
        backend.retry(lost.id)
    fresh = tasks.add.using(unique_key="lost").submit(2, 2)
    assert fresh.id != lost.id and fresh.wait(timeout=30).return_value == 4
    assert any("unique key freed" in r.getMessage() for r in caplog.records)
    backend.purge()  # the placeholder gone too: the key still works
    assert tasks.add.using(unique_key="lost").submit(3, 3).wait(timeout=30).return_value == 6


def test_cancel_frees_the_unique_key(backend):
    first = tasks.add.using(unique_key="k").submit(1, 1)
    assert first.cancel() is True
    assert tasks.add.using(unique_key="k").submit(1, 1).id != first.id


@pytest.mark.django_db(transaction=True)
def test_submit_on_commit_waits_for_the_commit(backend, start_worker):
    from django.db import transaction
    from django.tasks.exceptions import TaskResultDoesNotExist

    from zktasks import SerializationError

    start_worker()
    with transaction.atomic():
        job = tasks.add.submit_on_commit(2, 5)
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(job.id)  # nothing in ZooKeeper before the commit
        with pytest.raises(SerializationError):
            tasks.add.submit_on_commit((i for i in range(2)), 1)  # bad input: at once
    assert job.wait(timeout=30).return_value == 7


@pytest.mark.django_db(transaction=True)
def test_submit_on_commit_after_rollback_never_exists(backend):
    from django.db import transaction
    from django.tasks.exceptions import TaskResultDoesNotExist

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        job = tasks.add.submit_on_commit(1, 1)
        raise Abort
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(job.id)


def test_backlog_with_cancels_and_a_priority_arrival(backend, start_worker):
    """The leader hands out a backlog from its local view between re-lists: jobs
    cancelled meanwhile are refused cleanly, and a high-priority arrival still overtakes
    most of the backlog."""
    backlog = [tasks.short_sleep.submit(0.01) for _ in range(300)]
    start_worker(concurrency=1, prefetch=0)
    backlog[0].wait(timeout=30)  # draining has begun
    cancelled = [job for job in backlog[100:200:2] if job.cancel()]
    urgent = tasks.short_sleep.using(priority=100).submit(0)
    urgent.wait(timeout=60)
    for job in backlog:
        job.wait(timeout=120)
    cancelled_ids = {job.id for job in cancelled}
    assert cancelled, "the backlog drained before any cancel"
    assert all(job.worker_ids == [] for job in cancelled)
    done = [job for job in backlog if job.id not in cancelled_ids]
    assert all(job.status == TaskResultStatus.SUCCESSFUL for job in done)
    later = [job for job in done if job.finished_at > urgent.finished_at]
    assert len(later) >= 100  # it did not wait for the backlog


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_cancels_at_any_moment_leave_no_bookkeeping_behind(backend, start_worker, pool):
    """A cancel read while a job was settling (its run over, its outcome on its way) was
    handed to the runner for a run that never came, and kept for good: one entry per
    such job ever cancelled, dozens per 300 (a resource-growth audit). Cancels here land
    at every moment of the jobs' lives; none may stay once the worker is done."""
    import random
    import threading

    from zktasks import context

    worker = start_worker(concurrency=2, pool=pool)
    jobs = tasks.short_sleep.submit_many([((0.005,), {}) for _ in range(150)])
    ids = [job.id for job in jobs]

    def cancel_some(part, seed):
        pace = random.Random(seed)
        for job_id in part:
            threading.Event().wait(pace.random() * 0.01)  # spread over the jobs' lives
            backend.cancel(job_id)

    cancellers = [threading.Thread(target=cancel_some, args=(ids[i::3], i)) for i in range(3)]
    for canceller in cancellers:
        canceller.start()
    for canceller in cancellers:
        canceller.join(120)
    for job in jobs:
        job.wait(timeout=60)
    wait_until(lambda: not worker._running and not worker._known, 60,
               "the worker to let go of every job")
    assert not set(ids) & context._cancelled_jobs
    assert not set(ids) & set(getattr(worker.runner, "_early_cancels", {}))


def test_a_polite_cancel_can_be_escalated_to_force(backend, start_worker, tmp_path, caplog):
    """cancel(), then cancel(force=True) on a task that ignores the first: the escalation
    was set() on the request znode, whose data no worker watches, and the task ran on."""
    caplog.set_level("WARNING", logger="zktasks.worker")
    start_worker(pool="process", concurrency=1)
    marker = tmp_path / "started"
    job = tasks.ignores_cancel.submit(str(marker))
    wait_until(marker.exists, 60, "the task to start")
    assert job.cancel() is False
    wait_until(lambda: f"cancel requested job={job.id} force=False" in caplog.text, 30,
               "the worker to read the polite request")
    assert job.cancel(force=True) is False
    job.wait(timeout=30)
    assert job.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"
    assert "terminated" in job.errors[-1].traceback
