"""ProcessRunner.run_many: a batch of short jobs handed to one task process in one message,
with real task processes (no ZooKeeper involved). Each job keeps what a job run alone has:
its outcome, its time limit, its cancellation, and a crash that costs only itself."""

import os
import secrets
import signal
import threading
from pathlib import Path

import pytest

from tests import tasks
from tests.waiting import wait_until
from zktasks import serialization
from zktasks.exceptions import TaskProcessDied
from zktasks.executor import Execution, ProcessRunner

DIED = "zktasks.exceptions.TaskProcessDied"
CANCELLED = "zktasks.exceptions.JobCancelled"
TIMEOUT = "zktasks.exceptions.TaskTimeout"


def execution(task, *args, timeout=None) -> Execution:
    blob = serialization.dump_call(task.func, args, {}, task_path=task.module_path)
    return Execution(job_id=secrets.token_hex(8), blob=blob, record_json=b"{}",
                     timeout=timeout)


def runs(marker_dir) -> dict[int, list[int]]:
    """number -> pids of the task processes that ran tasks.mark(marker_dir, number)."""
    found: dict[int, list[int]] = {}
    for name in os.listdir(marker_dir):
        if name[0].isdigit():
            number, pid, _ = name.split("-")
            found.setdefault(int(number), []).append(int(pid))
    return found


def value(outcome):
    assert outcome.ok, outcome.error
    return serialization.loads(outcome.value_blob)


@pytest.fixture
def runner(process_runner):
    return process_runner


def test_a_batch_runs_in_one_task_process_in_order(runner, tmp_path):
    outcomes = list(runner.run_many([execution(tasks.mark, str(tmp_path), n)
                                     for n in range(8)]))
    assert [value(o) for o in outcomes] == list(range(8))
    found = runs(tmp_path)
    assert sorted(found) == list(range(8))
    assert len({pid for pids in found.values() for pid in pids}) == 1
    assert all(len(pids) == 1 for pids in found.values())


def test_a_job_that_kills_its_process_costs_only_itself(runner, tmp_path):
    """The jobs before it keep their outcomes; the job gets TaskProcessDied; the jobs
    after it (never started) run once each, in a fresh task process."""
    batch = [execution(tasks.mark, str(tmp_path), 0), execution(tasks.mark, str(tmp_path), 1),
             execution(tasks.exit_hard, 3),
             execution(tasks.mark, str(tmp_path), 3), execution(tasks.mark, str(tmp_path), 4)]
    outcomes = list(runner.run_many(batch))
    assert [value(o) for o in outcomes[:2]] == [0, 1]
    assert not outcomes[2].ok and outcomes[2].error.exception_class_path == DIED
    assert "exit code 3" in outcomes[2].error.message
    assert [value(o) for o in outcomes[3:]] == [3, 4]
    found = runs(tmp_path)
    assert sorted(found) == [0, 1, 3, 4] and all(len(p) == 1 for p in found.values())
    assert found[0] == found[1] and found[3] == found[4] and found[1] != found[3]
    # The runner goes on with the fresh process.
    assert value(runner.run(execution(tasks.add, 2, 3))) == 5


def test_each_job_of_a_batch_keeps_its_own_time_limit(runner, tmp_path):
    batch = [execution(tasks.mark, str(tmp_path), 0), execution(tasks.hang, timeout=0.5),
             execution(tasks.mark, str(tmp_path), 2)]
    outcomes = list(runner.run_many(batch))
    assert value(outcomes[0]) == 0 and value(outcomes[2]) == 2
    assert not outcomes[1].ok and outcomes[1].error.exception_class_path == TIMEOUT
    assert sorted(runs(tmp_path)) == [0, 2]


def test_jobs_cancelled_while_they_wait_in_a_batch_are_not_run(runner, tmp_path):
    """A cancel (plain or forced) of a job waiting behind the running one of its batch:
    that job is not run and reports JobCancelled; the running one is left alone. A job
    cancelled before the hand-off is not sent at all."""
    release = tmp_path / "release"
    first = execution(tasks.record_pid_and_wait, str(tmp_path), str(release))
    soft, forced = execution(tasks.mark, str(tmp_path), 1), execution(tasks.mark, str(tmp_path), 2)
    early, last = execution(tasks.mark, str(tmp_path), 3), execution(tasks.mark, str(tmp_path), 4)
    runner.cancel(early.job_id)  # not on a task process yet
    outcomes = []
    thread = threading.Thread(target=lambda: outcomes.extend(
        runner.run_many([first, soft, forced, early, last])))
    thread.start()
    try:
        wait_until((tmp_path / "pid").exists, 30, "the first job to start")
        runner.cancel(soft.job_id)
        runner.cancel(forced.job_id, force=True)
    finally:
        release.touch()
        thread.join(60)
    assert len(outcomes) == 5
    assert value(outcomes[0]) == int((tmp_path / "pid").read_text())
    for outcome in outcomes[1:4]:
        assert not outcome.ok and outcome.error.exception_class_path == CANCELLED
        assert "before its task started" in outcome.error.message \
            or "force=True" in outcome.error.message
    assert value(outcomes[4]) == 4
    assert sorted(runs(tmp_path)) == [4]  # 1, 2 and 3 never ran
    assert Path(tmp_path, "pid").exists()


def test_a_task_process_killed_by_a_forced_cancel_is_never_handed_the_next_job(runner):
    """A forced cancel sends SIGKILL and returns; the process may be alive for a moment
    after. If the outcome of the cancelled job was already on its way (the race the
    batch test above can hit), nobody reads EOF and reaps it: the next job must still go
    to a fresh task process, not into the pipe of the dying one."""
    slot = runner.slots[0]
    assert value(runner.run(execution(tasks.add, 1, 1))) == 2
    for attempt in range(5):
        dying = slot.process
        slot.cancel(slot.runs, force=True)
        assert value(runner.run(execution(tasks.add, attempt, 3))) == attempt + 3
        assert slot.process is not dying and dying.exitcode == -9


def test_a_forced_kill_that_lands_after_its_job_reported_reruns_the_next_one(runner, tmp_path):
    """The race a forced cancel of a running job can lose: the job reports its outcome,
    the task process starts the next job of the batch, and only then does the SIGKILL
    land. The next job did not fail: it runs again from its start in a fresh process,
    as the docstring of run_many promises, instead of reporting TaskProcessDied."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir(), b_dir.mkdir()
    a = execution(tasks.record_pid_and_wait, str(a_dir), str(tmp_path / "release-a"))
    b = execution(tasks.record_pid_and_wait, str(b_dir), str(tmp_path / "release-b"))
    outcomes = runner.run_many([a, b])
    first = []
    reader = threading.Thread(target=lambda: first.append(next(outcomes)))
    reader.start()
    wait_until((a_dir / "pid").exists, 30, "job a to start")
    (tmp_path / "release-a").touch()
    wait_until((b_dir / "pid").exists, 30, "job b to start on the same process")
    reader.join(30)
    slot = runner.slots[0]
    killed = slot.process
    # The kill of a that was decided while a still ran (ProcessRunner.cancel saw no
    # outcome in the pipe yet), landing now that the process runs b.
    slot.cancel(slot.runs - 1, force=True)
    (b_dir / "pid").unlink()
    (tmp_path / "release-b").touch()
    rest = list(outcomes)
    assert value(first[0]) == killed.pid
    assert len(rest) == 1 and value(rest[0]) == int((b_dir / "pid").read_text())
    assert value(rest[0]) != killed.pid


def test_a_runs_time_limit_starts_once_its_task_process_is_set_up(monkeypatch):
    """A new task process first sets up Django (3 s seen on a loaded VM). The run's hard
    limit (3 s + 1 s of grace here) is counted from the hand-off, so the worker waits
    for the process to say it is ready: the job is not killed for the setup's time (10 s
    here, well past the limit). The worker waits for its first processes before
    registering (wait_ready); this is the one that replaces a process that died.
    Spawned task processes (where there is no fork server): a fork of one is set up
    already (test_fork_server.py)."""
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.slow_settings")
    monkeypatch.setenv("SLOW_SETUP_SECONDS", "0")  # the first process: no need to wait
    runner = ProcessRunner(1, start_method="spawn")
    runner.start()
    try:
        assert runner.wait_ready()
        # Read when the next process starts: only the replacement is slow to set up.
        monkeypatch.setenv("SLOW_SETUP_SECONDS", "10")
        runner.slots[0].kill()  # the next run starts a fresh (slow) process
        # The job itself has its 3 s: room to spare for a 0.1 s sleep on a loaded machine.
        assert value(runner.run(execution(tasks.short_sleep, 0.1, timeout=3))) == 0.1
    finally:
        runner.stop()


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_task_process_that_cannot_set_up_stops_the_worker_with_its_reason(
        monkeypatch, start_method):
    """Spawned, each task process fails its own setup; forked, the fork server's failed,
    and each fork prints its traceback and exits the same way."""
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.broken_task_process_settings")
    runner = ProcessRunner(2, start_method=start_method)
    runner.start()
    with pytest.raises(TaskProcessDied, match=r"exited with exit code 1 while it set up "
                                              r"Django.*--pool thread"):
        runner.wait_ready()
    assert all(slot.process is None for slot in runner.slots)  # none left running


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_waiting_for_task_processes_ends_when_the_worker_is_stopped(monkeypatch,
                                                                   start_method):
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.slow_settings")
    monkeypatch.setenv("SLOW_SETUP_SECONDS", "60")
    runner = ProcessRunner(1, start_method=start_method)
    runner.start()
    abort = threading.Event()
    try:
        threading.Timer(0.5, abort.set).start()
        assert runner.wait_ready(abort) is False
    finally:
        runner.stop(force=True)


def test_a_cancel_while_the_slot_starts_a_new_task_process_is_kept(runner, monkeypatch):
    """Between task processes (the last one crashed, the next not started yet) a cancel
    of the job on its way to the slot was dropped, and the job ran."""
    slot = runner.slots[0]
    assert not runner.run(execution(tasks.exit_hard, 3)).ok  # its process is gone
    job = execution(tasks.add, 1, 1)
    ensure = slot.ensure

    def cancelled_meanwhile():
        runner.cancel(job.job_id)  # on the slot already; no process to ask
        ensure()

    monkeypatch.setattr(slot, "ensure", cancelled_meanwhile)
    outcome = runner.run(job)
    assert not outcome.ok and outcome.error.exception_class_path == CANCELLED
    assert "before its task started" in outcome.error.message


def test_task_code_can_start_processes_of_its_own(runner):
    """A task that uses a process pool (multiprocessing.Pool, a ProcessPoolExecutor):
    multiprocessing refused children to a task process, which is a daemonic Process."""
    outcome = runner.run(execution(tasks.factorials_in_a_process_pool, [1, 2, 3, 4]))
    assert value(outcome) == [1, 2, 6, 24]


def test_a_task_process_whose_worker_is_gone_stops_without_a_traceback():
    """A worker killed as its task process finished a job: the send of the outcome met
    a closed pipe, and multiprocessing printed a BrokenPipeError traceback into the
    worker's log for each such task process (about one kill in ten in a chaos run),
    read as a fault of the task. The task process now stops quietly: its job is
    handed back with the worker's other jobs."""
    import multiprocessing

    from zktasks.executor import _report

    mine, workers = multiprocessing.Pipe()
    assert _report(mine, "an outcome") is True
    assert workers.recv() == "an outcome"
    workers.close()
    assert _report(mine, "an outcome") is False


class _Elsewhere:
    """What the worker does with jobs taken back from a batch (on_taken_back): run them
    on the runner's other task process, from a thread of their own."""

    def __init__(self, runner, cancel=()):
        self.runner, self.cancel = runner, set(cancel)
        self.outcomes: dict[str, object] = {}
        self.handed: list[Execution] = []
        self.threads: list[threading.Thread] = []

    def __call__(self, executions):
        self.handed.extend(executions)
        for job in executions:
            if job.job_id in self.cancel:
                self.runner.cancel(job.job_id)  # between the take-back and its rerun
        thread = threading.Thread(target=self._run, args=(executions,))
        thread.start()
        self.threads.append(thread)

    def _run(self, executions):
        for job in executions:
            self.outcomes[job.job_id] = self.runner.run(job)

    def join(self):
        for thread in self.threads:
            thread.join(60)


@pytest.mark.parametrize("max_tasks", [None, 3])
def test_jobs_held_up_behind_a_long_one_run_on_another_task_process(tmp_path, max_tasks):
    """A job of a batch that blocks (here until released) no longer holds up the jobs
    behind it in its task process: past BATCH_PATIENCE_S they are taken back and run on
    the other task process while it still blocks, each once; a cancel that comes for one
    of them meanwhile is kept. With --max-tasks-per-child 3 the batch goes to its task
    process in parts, and those not handed to it yet are taken back too."""
    from zktasks.executor import TAKEN_BACK

    runner = ProcessRunner(2, max_tasks=max_tasks)
    runner.start()
    try:
        release = tmp_path / "release"
        blocker = execution(tasks.record_pid_and_wait, str(tmp_path), str(release))
        behind = [execution(tasks.mark, str(tmp_path), n) for n in range(1, 6)]
        elsewhere = _Elsewhere(runner, cancel={behind[2].job_id})
        outcomes = []
        thread = threading.Thread(target=lambda: outcomes.extend(
            runner.run_many([blocker, *behind], on_taken_back=elsewhere)))
        thread.start()
        try:
            # While the first job still blocks, the others run and end.
            wait_until(lambda: len(elsewhere.outcomes) == 5, 60,
                       "the jobs behind the blocked one to run elsewhere")
        finally:
            release.touch()
            thread.join(60)
            elsewhere.join()
        blocked_pid = int((tmp_path / "pid").read_text())
        assert value(outcomes[0]) == blocked_pid
        assert outcomes[1:] == [TAKEN_BACK] * 5
        assert [e.job_id for e in elsewhere.handed] == [e.job_id for e in behind]
        cancelled = elsewhere.outcomes.pop(behind[2].job_id)
        assert not cancelled.ok and cancelled.error.exception_class_path == CANCELLED
        assert sorted(value(o) for o in elsewhere.outcomes.values()) == [1, 2, 4, 5]
        found = runs(tmp_path)
        assert sorted(found) == [1, 2, 4, 5] and all(len(p) == 1 for p in found.values())
        assert blocked_pid not in {pid for pids in found.values() for pid in pids}
        # The blocked task process goes on with the next batch: nothing of the taken-back
        # jobs is left in its pipe to be read as that batch's outcomes.
        more = list(runner.run_many([execution(tasks.add, n, 1) for n in range(4)]))
        assert [value(o) for o in more] == [1, 2, 3, 4]
    finally:
        runner.stop()


def test_a_job_runs_in_its_batch_or_is_taken_back_never_both(tmp_path, monkeypatch):
    """With a patience about as long as the first job of each batch (a 2 ms sleep), the
    worker takes back the jobs behind it just as the task process ends it and begins
    the next. Each job is one or the other, once (the claim under a lock shared with the
    task process)."""
    import random

    from zktasks import executor
    from zktasks.executor import TAKEN_BACK

    runner = ProcessRunner(2)
    runner.start()
    try:
        elsewhere = _Elsewhere(runner)
        numbers = iter(range(10_000))
        in_batch = 0
        for round_ in range(200):
            # Batches of marks alone (each about 0.1 ms: the worker often takes back
            # as the process moves from one to the next), and batches led by a 2 ms
            # sleep (the worker surely takes back from about half of them).
            monkeypatch.setattr(executor, "BATCH_PATIENCE_S", random.uniform(0, 0.004))
            batch = [execution(tasks.mark, str(tmp_path), next(numbers)) for _ in range(7)]
            if round_ % 2:
                batch.insert(0, execution(tasks.short_sleep, 0.002))
            for outcome in runner.run_many(batch, on_taken_back=elsewhere):
                if outcome is not TAKEN_BACK:
                    value(outcome)
                    in_batch += 1
            elsewhere.join()
        assert in_batch - 100 + len(elsewhere.handed) == 1400  # 100 sleeps ran in batch
        assert all(o.ok for o in elsewhere.outcomes.values())
        found = runs(tmp_path)
        assert sorted(found) == list(range(1400))
        assert all(len(pids) == 1 for pids in found.values())  # none ran twice
        assert len(elsewhere.handed) > 7  # taken back from several batches
    finally:
        runner.stop()


def test_a_job_its_task_process_has_begun_is_not_taken_back(tmp_path, monkeypatch):
    """The race the test above runs into by chance, set up: the task process has ended
    one job and begun the next when the worker, still behind, decides to take back the
    rest. It takes back nothing (the process is moving again), and the job runs once."""
    from zktasks import executor

    monkeypatch.setattr(executor, "BATCH_PATIENCE_S", 60.0)  # no take-back of its own
    runner = ProcessRunner(2)
    runner.start()
    try:
        a_dir, b_dir = tmp_path / "a", tmp_path / "b"
        a_dir.mkdir(), b_dir.mkdir()
        a = execution(tasks.record_pid_and_wait, str(a_dir), str(tmp_path / "release-a"))
        b = execution(tasks.record_pid_and_wait, str(b_dir), str(tmp_path / "release-b"))
        last = execution(tasks.mark, str(tmp_path), 1)
        outcomes = []
        thread = threading.Thread(target=lambda: outcomes.extend(
            runner.run_many([a, b, last], on_taken_back=pytest.fail)))
        thread.start()
        try:
            wait_until((a_dir / "pid").exists, 30, "job a to start")
            (tmp_path / "release-a").touch()
            wait_until((b_dir / "pid").exists, 30, "job b to start")
            slot = next(slot for slot in runner.slots if b.job_id in slot.queued)
            assert runner._take_back(slot, slot.claims, [b, last], []) == []
        finally:
            (tmp_path / "release-a").touch()
            (tmp_path / "release-b").touch()
            thread.join(60)
        assert [value(o) for o in outcomes] == [int((a_dir / "pid").read_text())] * 2 + [1]
        assert sorted(runs(tmp_path)) == [1]
    finally:
        runner.stop()


def test_a_task_process_ignores_the_group_s_signals_and_what_its_task_starts_not(runner):
    """A task process leaves stopping to its worker (a drain's signal reaches the whole
    process group). What its task starts did too, SIG_IGN being inherited through fork
    and exec: Popen.terminate() did nothing, nor did a multiprocessing pool's
    terminate(), and `with multiprocessing.Pool() as pool:` could hang at its end for
    good (seen in this suite: test_task_code_can_start_processes_of_its_own)."""
    assert value(runner.run(execution(tasks.terminates_what_it_started))) == [-15, -15]
    pid = value(runner.run(execution(tasks.pid)))
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        os.kill(pid, signum)
    assert value(runner.run(execution(tasks.pid))) == pid  # the same process, alive


def test_a_task_process_worn_out_by_a_held_up_batch_is_still_replaced(tmp_path):
    """--max-tasks-per-child 1: the batch's task process, which ran the blocked job, is
    replaced before its next job, also when the jobs behind it were taken back (the
    take-back returned before the check)."""
    from zktasks.executor import TAKEN_BACK

    runner = ProcessRunner(2, max_tasks=1)
    runner.start()
    try:
        release = tmp_path / "release"
        blocker = execution(tasks.record_pid_and_wait, str(tmp_path), str(release))
        elsewhere = _Elsewhere(runner)
        outcomes = []
        thread = threading.Thread(target=lambda: outcomes.extend(runner.run_many(
            [blocker, execution(tasks.add, 1, 1), execution(tasks.add, 2, 2)],
            on_taken_back=elsewhere)))
        thread.start()
        try:
            wait_until(lambda: len(elsewhere.outcomes) == 2, 60, "the jobs taken back to run")
        finally:
            release.touch()
            thread.join(60)
            elsewhere.join()
        blocked = int((tmp_path / "pid").read_text())
        assert value(outcomes[0]) == blocked and outcomes[1:] == [TAKEN_BACK] * 2
        assert sorted(value(o) for o in elsewhere.outcomes.values()) == [2, 4]
        assert blocked not in {value(runner.run(execution(tasks.pid))) for _ in range(4)}
    finally:
        runner.stop()
