"""The core pipeline against a real ZooKeeper: submit → leader assigns → worker runs →
result, with every transition checked in the tree."""

import functools
import itertools
import os
from collections import Counter
from datetime import timedelta

import pytest
from django.tasks import TaskResultStatus
from django.utils import timezone

from tests import tasks
from tests.pending import pending_nodes
from tests.waiting import wait_until
from zktasks import submit


def test_submit_writes_status_and_pending_job_in_one_step(backend, zk_client):
    result = tasks.add.submit(2, 3)
    layout = backend.store.layout
    assert result.status == TaskResultStatus.READY
    assert zk_client.exists(layout.status(result.id))
    assert [n.endswith(result.id) for n in pending_nodes(zk_client, layout)] == [True]


def test_worker_runs_job_and_records_result(backend, start_worker, zk_client):
    worker = start_worker()
    result = tasks.add.submit(2, 3).wait(timeout=30)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.worker_ids == [worker.worker_id]
    assert result.attempts == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    layout = backend.store.layout
    assert zk_client.get_children(layout.worker_assignments(worker.worker_id)) == []
    assert pending_nodes(zk_client, layout) == []


def test_failure_records_class_path_and_traceback(backend, start_worker):
    start_worker()
    result = tasks.boom.submit("kaput").wait(timeout=30)
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert "kaput" in error.traceback
    assert error.exception_class is ValueError
    with pytest.raises(ValueError):
        result.return_value  # noqa: B018


def test_lambda_and_closure_travel_by_value(backend, start_worker):
    start_worker()
    factor = 7

    def times(x):
        return x * factor

    assert submit(lambda: 6 * 7).wait(timeout=30).return_value == 42
    assert submit(times, 6).wait(timeout=30).return_value == 42


def test_get_result_from_a_fresh_backend(backend, start_worker, settings):
    from zktasks.backend import ZooKeeperBackend

    start_worker()
    job = tasks.add.submit(20, 22)
    job.wait(timeout=30)
    fresh = ZooKeeperBackend("default", settings.TASKS["default"])
    fetched = fresh.get_result(job.id)
    assert fetched.return_value == 42
    assert fetched.args == [20, 22]
    assert fetched.task.func is tasks.add.func
    assert tasks.add.get_result(job.id).id == job.id


def test_takes_context_sees_attempt_and_id(backend, start_worker):
    start_worker()
    job = tasks.with_context.submit("x").wait(timeout=30)
    assert job.return_value == {"attempt": 1, "id": job.id, "x": "x"}


def test_queues_route_to_serving_workers_only(backend, start_worker, zk_client):
    worker = start_worker(queues=["default"])
    mail = tasks.email.submit("ada@example.com")
    add = tasks.add.submit(1, 1)
    assert add.wait(timeout=30).return_value == 2
    with pytest.raises(TimeoutError):
        mail.wait(timeout=1.0)  # nobody serves "emails" yet
    # Not merely slow: the leader (which assigned `add`) did not hand it to the worker.
    layout = backend.store.layout
    assert mail.id not in zk_client.get_children(layout.worker_assignments(worker.worker_id))
    assert [name[-32:] for name in pending_nodes(zk_client, layout, "emails")] == [mail.id]
    assert backend.get_result(mail.id).status == TaskResultStatus.READY
    start_worker(queues=["emails"])
    assert mail.wait(timeout=30).return_value == "sent to ada@example.com"


def test_max_attempts_reruns_a_failed_job_and_records_each_attempt(backend, start_worker):
    start_worker()
    recovered = tasks.flaky.submit(2).wait(timeout=30)
    assert recovered.status == TaskResultStatus.SUCCESSFUL
    assert recovered.return_value == 2 and recovered.attempts == 2
    assert [e.exception_class_path for e in recovered.errors] == ["builtins.RuntimeError"]
    exhausted = tasks.flaky.submit(5).wait(timeout=30)
    assert exhausted.status == TaskResultStatus.FAILED
    assert exhausted.attempts == 3 and len(exhausted.errors) == 3
    assert "failing attempt 3" in exhausted.errors[-1].traceback
    only_once = tasks.flaky.using(max_attempts=1).submit(2).wait(timeout=30)
    assert only_once.status == TaskResultStatus.FAILED and only_once.attempts == 1


def test_async_task_runs_on_the_worker(backend, start_worker):
    start_worker()
    assert tasks.async_double.submit(21).wait(timeout=30).return_value == 42


@pytest.mark.parametrize("pool", ["thread", "process"])
@pytest.mark.parametrize("fan_out", [tasks.fan_out, tasks.async_fan_out], ids=["sync", "async"])
def test_a_task_submits_follow_up_jobs(backend, start_worker, pool, fan_out):
    """A task function of a test module travels by value; the tasks of its module that it
    submits must still be tasks there (they used to arrive as bare functions: no
    .submit()), and their jobs must name the task, not __main__."""
    start_worker(pool=pool)
    ids = fan_out.submit(3).wait(timeout=60).return_value
    results = [backend.get_result(job_id) for job_id in ids]
    for i, result in enumerate(results):
        assert result.wait(timeout=30).return_value == 2 * i
        assert result.task.module_path == "tests.tasks.add"


def test_any_callable_can_be_submitted(backend, start_worker):
    """Bound methods keep their self (they used to be looked up by name on the worker
    and run without it); partials, callable objects and method descriptors run too."""
    start_worker(pool="process")
    greeter = tasks.Greeter("ann")
    calls = [
        (submit(greeter.hello, "bob"), "ann greets bob"),
        (submit(greeter.ahello, "bob"), "ann awaits bob"),
        (submit(greeter, "bob"), "ann called bob"),
        (submit(functools.partial(tasks.join_with, "-"), "a", "b"), "a-b"),
        (submit(str.upper, "abc"), "ABC"),
        (submit(Counter("aab").most_common, 1), [("a", 2)]),
    ]
    for job, expected in calls:
        assert job.wait(timeout=60).return_value == expected
    assert calls[0][0].task.module_path == "tests.tasks.<Greeter.hello>"


def test_a_result_s_task_keeps_the_options_it_was_submitted_with(backend):
    when = timezone.now() + timedelta(hours=1)
    job = tasks.add.using(run_after=when, unique_key="options-kept", backoff=3.0,
                          retry_on=(ValueError,), max_attempts=4).submit(1, 2)
    task = backend.get_result(job.id).task
    assert task.run_after == when and task.unique_key == "options-kept"
    assert task.backoff == 3.0 and task.retry_on == (ValueError,)
    assert task.max_attempts == 4
    job.cancel()


def test_submit_costs_one_request_once_parents_exist(backend, zookeeper):
    """The Store's memo of parents it made survives between submits (it did not: each
    submit re-checked ten parents, 11 requests instead of 1)."""
    import re

    def received():
        return int(re.search(r"Received: (\d+)", zookeeper.four_letter_word("srvr")).group(1))

    tasks.add.submit(0, 0)  # makes the parents
    before = received()
    for i in range(20):
        tasks.add.submit(i, i)
    # 20 multis, plus slack for other sessions' pings while this runs.
    assert received() - before <= 30


def test_lookahead_runners_never_exceed_concurrency(backend, start_worker, tmp_path):
    # Short jobs let the extra runners record the next job's start while one executes
    # (worker.LOOKAHEAD); at most `concurrency` may execute at once all the same.
    worker = start_worker(concurrency=1)
    jobs = [tasks.exclusive.submit(str(tmp_path), 0.005) for _ in range(40)]
    assert all(job.wait(timeout=60).return_value is True for job in jobs)
    assert not list(tmp_path.glob("overlap-*"))
    assert worker._short_jobs()  # the lookahead runners were allowed to take jobs


def test_a_runner_starts_a_batch_of_short_jobs_together_and_runs_each_once(
        backend, start_worker, tmp_path):
    # Jobs shorter than a round trip: a runner that finds more ready jobs than idle
    # runners takes several, records their starts together, then runs them in turn
    # (worker.MAX_STARTS). Each still runs exactly once, started before it ran.
    worker = start_worker(concurrency=1, prefetch=16)
    for _ in range(200):  # until the worker's moving average says jobs are short
        if worker._batch_size() > 1:
            break
        tasks.mark.submit(str(tmp_path), -1).wait(timeout=30)
    assert worker._batch_size() > 1
    jobs = tasks.mark.submit_many([((str(tmp_path), n), {}) for n in range(40)])
    done = [job.wait(timeout=60) for job in jobs]
    assert [job.return_value for job in done] == list(range(40))
    assert all(job.attempts == 1 and job.started_at <= job.finished_at for job in done)
    runs = sorted(int(p.name.split("-")[0]) for p in tmp_path.iterdir()
                  if not p.name.startswith("-"))
    assert runs == list(range(40))
    assert worker.batched_starts > 0


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_long_task_after_short_ones_is_not_started_early(backend, start_worker, tmp_path,
                                                           pool):
    """The worker-wide average says jobs are short (no-ops ran), but this task's own
    runs are unknown: its jobs are not started in a batch or by a lookahead runner, so
    none shows RUNNING while another runs (or is drained as if it had started)."""
    worker = start_worker(concurrency=1, prefetch=16, pool=pool)
    worker._run_avg = 0.0001  # as after a run of no-ops
    jobs = tasks.sleep_then_return.submit_many(
        [((str(tmp_path), 0.3, n), {}) for n in range(3)])
    done = sorted((job.wait(timeout=60) for job in jobs), key=lambda job: job.started_at)
    for before, after in itertools.pairwise(done):
        assert after.started_at >= before.finished_at
    assert worker.batched_starts == 0


def test_a_batch_of_short_jobs_goes_to_one_task_process_and_each_runs_once(
        backend, start_worker, tmp_path):
    """With task processes a runner's batch goes to one of them in one hand-off
    (ProcessRunner.run_many): every job runs exactly once, there, after its start."""
    worker = start_worker(concurrency=1, prefetch=16, pool="process")
    worker._run_avg = 0.0001  # jobs known to be short, as after a run of no-ops
    worker._task_avg["tests.tasks.mark"] = 0.0001
    jobs = tasks.mark.submit_many([((str(tmp_path), n), {}) for n in range(40)])
    done = [job.wait(timeout=60) for job in jobs]
    assert [job.return_value for job in done] == list(range(40))
    assert all(job.attempts == 1 and job.started_at <= job.finished_at for job in done)
    names = [p.name.split("-") for p in tmp_path.iterdir()]
    assert sorted(int(number) for number, _, _ in names) == list(range(40))
    assert len({pid for _, pid, _ in names}) == 1  # the one task process
    assert int(names[0][1]) != os.getpid()
    assert worker.batched_starts > 0


def test_an_idle_worker_wakes_a_runner_for_a_job_that_is_not_short(backend, start_worker):
    """A lookahead runner (it takes only jobs that ran short lately) woken for a longer
    job turned it down and went back to waiting with the wake-up: the job then waited for
    a regular runner's 1 s poll (starts of 0.6 s on an idle worker, in an audit)."""
    worker = start_worker(concurrency=1)
    for _ in range(6):
        tasks.short_sleep.submit(0.08).wait(timeout=30)  # over LOOKAHEAD_MAX_S
    assert worker.missed_wakeups == 0


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_jobs_batched_behind_one_that_blocks_run_elsewhere(
        backend, start_worker, tmp_path, monkeypatch, pool):
    """A job of a task that ran short so far blocks (a lock wait, a read with no
    timeout). The jobs started in its batch behind it no longer wait with it: they are
    taken back from its task process (or runner thread) and run on the other one, each
    once, while it still blocks; it ends when released."""
    from zktasks.worker import Worker

    # As after a run of short jobs: runners take batches of them.
    monkeypatch.setattr(Worker, "_batch_size", lambda self: 16)
    monkeypatch.setattr(Worker, "_short_task", lambda self, item: True)
    gate, release, ready = tmp_path / "gate", tmp_path / "release", tmp_path / "ready"
    ready.touch()
    worker = start_worker(concurrency=2, prefetch=16, pool=pool)
    # Both task processes (or threads) busy, so that the next jobs wait on the worker
    # together and a runner takes the first of them (by priority) with others in a batch.
    gates = [tasks.wait_for_file.submit(str(gate), "gate") for _ in range(2)]
    wait_until(lambda: all(backend.get_result(job.id).status == TaskResultStatus.RUNNING
                           for job in gates), 30, "both task processes to be busy")
    blocked = tasks.wait_for_file.using(priority=10).submit(str(release), "released")
    jobs = tasks.wait_for_file.submit_many([((str(ready), n), {}) for n in range(15)])
    wait_until(lambda: len(worker._ready) == 16, 30, "the jobs to wait on the worker")
    gate.touch()
    try:
        done = [job.wait(timeout=60) for job in jobs]
        assert [job.return_value for job in done] == list(range(15))
        assert all(job.attempts == 1 for job in done)
        assert backend.get_result(blocked.id).status == TaskResultStatus.RUNNING
        assert worker.moved_runs > 0
    finally:
        release.touch()
    assert blocked.wait(timeout=60).return_value == "released"
    assert all(job.wait(timeout=60).return_value == "gate" for job in gates)
