"""Code written against Django's standard django.tasks API behaves on the ZooKeeperBackend,
with a real ZooKeeper and a real worker, as it does on Django's own backends.

What is checked follows Django's own test suite (tests/tasks/ of django/django: the
ImmediateBackend and DummyBackend tests, test_tasks.py) and the installed
django/tasks/ source. The tasks (tests/standard_tasks.py) use django.tasks' @task and
nothing of zktasks. Where zktasks differs on purpose (documented in README.md), the test
asserts zktasks' behaviour and says why.

Waiting for a job uses result.wait(timeout=...) (or await_result); signals and log lines
sent from the worker's threads are waited for with tests.waiting.wait_until.
"""

import asyncio
import dataclasses
import logging
import pickle
import re
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone

from tests import standard_tasks as std
from tests.conftest import use_zookeeper
from tests.waiting import wait_until
from zktasks.backend import ZooKeeperBackend
from zktasks.tree import new_job_id

WAIT = 30  # seconds a job may take to finish on a loaded machine

SYNC_AND_ASYNC = pytest.mark.parametrize(
    "noop", [std.noop, std.noop_async], ids=["sync-task", "async-task"])


def assert_ran_once(result: TaskResult, worker) -> None:
    """What Django's backends give a finished result: times set and in order, one attempt."""
    assert result.is_finished
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.finished_at is not None
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at
    assert result.last_attempted_at <= result.finished_at
    assert result.attempts == 1
    assert result.worker_ids == [worker.worker_id]


def assert_failed_once(result: TaskResult, worker, exception_class, last_line: str):
    """What Django's backends give a task that raised: FAILED, return_value refusing with
    "Task failed", one error of the exception's class whose traceback ends with its line.
    Returns that error."""
    assert result.status == TaskResultStatus.FAILED
    assert_ran_once(result, worker)
    with pytest.raises(ValueError, match="^Task failed$"):
        result.return_value  # noqa: B018
    [error] = result.errors
    assert error.exception_class is exception_class
    assert error.traceback.endswith(f"{last_line}\n")
    return error


def enqueue(task, how, *args, **kwargs):
    """task.enqueue(), or task.aenqueue() in a coroutine of its own."""
    if how == "aenqueue":
        return asyncio.run(task.aenqueue(*args, **kwargs))
    return task.enqueue(*args, **kwargs)


@pytest.fixture
def receivers():
    """Connect a recording receiver to each django.tasks signal; disconnect afterwards."""
    seen = {"enqueued": [], "started": [], "finished": []}
    connected = []
    for name, signal in (("enqueued", task_enqueued), ("started", task_started),
                         ("finished", task_finished)):
        def receive(sender, task_result, _name=name, **kwargs):
            seen[_name].append((sender, task_result))

        signal.connect(receive, weak=False)
        connected.append((signal, receive))
    yield seen
    for signal, receive in connected:
        signal.disconnect(receive)


@pytest.fixture
def django_tasks_log(caplog):
    """The django.tasks logger's records, DEBUG and up (the "enqueued" line is DEBUG)."""
    caplog.set_level(logging.DEBUG, logger="django.tasks")

    def lines(job_id):
        return [r for r in caplog.records if r.name == "django.tasks" and job_id in r.getMessage()]

    return lines


# -- the backend as Django's API sees it ---------------------------------------------------


def test_the_backend_supports_every_feature_django_s_api_asks_about(backend):
    assert isinstance(backend, ZooKeeperBackend)
    assert task_backends["default"] is backend
    assert backend.supports_defer is True
    assert backend.supports_async_task is True
    assert backend.supports_get_result is True
    assert backend.supports_priority is True


def test_the_task_decorator_makes_tasks_of_this_backend(backend):
    for task in (std.noop, std.noop_async, std.answer):
        assert isinstance(task, Task)
        assert task.get_backend() is backend
    assert std.noop.name == "noop"
    assert std.noop.module_path == "tests.standard_tasks.noop"


# -- enqueue, aenqueue, return values -------------------------------------------------------


@SYNC_AND_ASYNC
def test_enqueue_runs_the_task_on_a_worker(backend, start_worker, noop):
    worker = start_worker()
    result = noop.enqueue(1, two=3)
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at is not None
    result.wait(timeout=WAIT)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert_ran_once(result, worker)
    assert result.return_value is None
    assert result.task == noop
    assert result.args == [1]
    assert result.kwargs == {"two": 3}
    assert result.errors == []


@SYNC_AND_ASYNC
def test_aenqueue_runs_the_task_on_a_worker(backend, start_worker, noop):
    worker = start_worker()

    async def main():
        result = await noop.aenqueue()
        assert result.status == TaskResultStatus.READY
        return await result.await_result(timeout=WAIT)

    result = asyncio.run(main())
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert_ran_once(result, worker)
    assert result.return_value is None
    assert result.task == noop
    assert result.args == []
    assert result.kwargs == {}


@pytest.mark.parametrize("answer", [std.answer, std.answer_async], ids=["sync-task", "async-task"])
@pytest.mark.parametrize("how", ["enqueue", "aenqueue"])
def test_the_return_value_comes_back(backend, start_worker, answer, how):
    start_worker()
    result = enqueue(answer, how)
    result.wait(timeout=WAIT)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42


def test_return_value_before_the_end_says_the_task_has_not_finished(backend):
    result = std.answer.enqueue()  # no worker: it stays READY
    with pytest.raises(ValueError, match="^Task has not finished yet$"):
        result.return_value  # noqa: B018


def test_arguments_and_return_values_need_not_be_json(backend, start_worker):
    """A deliberate difference, documented in README.md ("Arguments and return values
    travel with dill"): Django's backends normalize args and the return value through
    JSON, so a datetime argument raises TypeError ("Unsupported type") at enqueue() and a
    datetime return value fails the task. Here both travel as they are."""
    start_worker()
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    sent = std.noop.enqueue(when, at={"t": when}, parts=(1, 2))
    assert sent.args == [when] and sent.kwargs == {"at": {"t": when}, "parts": (1, 2)}
    assert sent.wait(timeout=WAIT).status == TaskResultStatus.SUCCESSFUL
    fetched = std.noop.get_result(sent.id)
    assert fetched.args == [when] and fetched.kwargs["parts"] == (1, 2)
    returned = std.returns_a_datetime.enqueue().wait(timeout=WAIT)
    assert returned.status == TaskResultStatus.SUCCESSFUL
    assert returned.return_value == when


def test_a_function_not_at_module_level_is_a_valid_task(backend, start_worker):
    """A deliberate difference, documented in README.md (module-level functions travel
    by reference; "Lambdas, closures ... travel by value (dill)"): Django's backends
    refuse them with "Task function must be defined at a module level."; here @task
    accepts one and a worker runs it."""
    from django.tasks import task

    start_worker()
    offset = 40

    def add_offset(x):
        return x + offset

    closure = task(add_offset)
    assert isinstance(closure, Task)
    result = closure.enqueue(2).wait(timeout=WAIT)
    assert result.return_value == 42
    # Its own result, though the function came back from the payload as a copy
    # (Task.get_result compares functions by identity: TaskResultMismatch).
    assert closure.get_result(result.id).return_value == 42
    assert async_to_sync(closure.aget_result)(result.id).return_value == 42
    with pytest.raises(TaskResultMismatch):
        std.answer.get_result(result.id)  # another task's result is still refused

    def another(x):
        return x + offset

    with pytest.raises(TaskResultMismatch):  # the same body, another definition
        task(another).get_result(result.id)


# -- failures ---------------------------------------------------------------------------


def test_a_task_that_raises_is_failed_with_its_error(backend, start_worker):
    worker = start_worker()
    result = std.fails_with_value_error.enqueue().wait(timeout=WAIT)
    error = assert_failed_once(result, worker, ValueError,
                               "ValueError: conformance: a plain failure")
    assert error.exception_class_path == "builtins.ValueError"
    assert error.traceback.startswith("Traceback (most recent call last):\n")
    assert result.task == std.fails_with_value_error
    assert result.args == [] and result.kwargs == {}


def assert_the_worker_goes_on(worker) -> None:
    after = std.answer.enqueue().wait(timeout=WAIT)
    assert after.status == TaskResultStatus.SUCCESSFUL and after.return_value == 42
    assert after.worker_ids == [worker.worker_id]


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_system_exit_fails_the_task_and_the_worker_goes_on(backend, start_worker, pool):
    """Django's ImmediateBackend records a SystemExit as the task's failure; on a worker it
    must not end the worker (nor, with --pool process, cost more than the one job)."""
    worker = start_worker(pool=pool)
    result = std.exits.enqueue().wait(timeout=WAIT)
    assert_failed_once(result, worker, SystemExit,
                       "SystemExit: conformance: the task called exit")
    assert_the_worker_goes_on(worker)


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_keyboard_interrupt_from_a_task_fails_that_task_only(backend, start_worker, pool):
    """Django's ImmediateBackend lets a KeyboardInterrupt through (the task runs in the
    caller's process, whose user pressed Ctrl-C). On a worker the exception comes from the
    task's own code, not from an operator: zktasks records it as the task's failure and
    the worker goes on (Ctrl-C reaches a worker as a signal, which drains it; task
    processes ignore SIGINT, see README "The worker")."""
    worker = start_worker(pool=pool)
    result = std.interrupts.enqueue().wait(timeout=WAIT)
    assert_failed_once(result, worker, KeyboardInterrupt,
                       "KeyboardInterrupt: conformance: the task raised KeyboardInterrupt")
    assert_the_worker_goes_on(worker)


def test_an_exception_wrapping_an_exception(backend, start_worker):
    worker = start_worker()
    result = std.fails_with_nested_error.enqueue().wait(timeout=WAIT)
    error = assert_failed_once(result, worker, ValueError,
                               "ValueError: conformance: the inner error")
    assert result._return_value is None
    # The raising line of the task's source, as Django's test checks.
    assert 'raise ValueError(ValueError("conformance: the inner error"))' in error.traceback


# -- context ----------------------------------------------------------------------------


def test_a_task_that_takes_context_gets_its_result_and_attempt(backend, start_worker):
    start_worker()
    result = std.reports_context.enqueue().wait(timeout=WAIT)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {
        "is_task_context": True, "id": result.id, "attempt": 1, "status": "RUNNING",
    }
    assert TaskContext(task_result=result).attempt == 1


# -- get_result, aget_result, refresh, arefresh ---------------------------------------------


@pytest.mark.parametrize("missing", ["123", None], ids=["malformed", "well-formed"])
def test_get_result_of_an_unknown_id_raises_does_not_exist(backend, missing):
    missing = missing or new_job_id()  # an id zktasks could have made, never submitted
    with pytest.raises(TaskResultDoesNotExist):
        std.noop.get_result(missing)
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(missing)
    with pytest.raises(TaskResultDoesNotExist):
        asyncio.run(std.noop.aget_result(missing))
    with pytest.raises(TaskResultDoesNotExist):
        asyncio.run(backend.aget_result(missing))


@pytest.mark.parametrize("how", ["sync", "async"])
def test_get_result_gives_what_enqueue_gave(backend, start_worker, how):
    start_worker()
    result = std.answer.enqueue().wait(timeout=WAIT)
    if how == "sync":
        fetched = std.answer.get_result(result.id)
    else:
        fetched = asyncio.run(std.answer.aget_result(result.id))
    assert fetched == result
    assert fetched.task == std.answer and fetched.return_value == 42


@pytest.mark.parametrize("how", ["sync", "async"])
def test_get_result_with_another_task_s_id_raises_mismatch(backend, how):
    result = std.noop_async.enqueue()
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        if how == "sync":
            std.noop.get_result(result.id)
        else:
            asyncio.run(std.noop.aget_result(result.id))


@pytest.mark.parametrize("how", ["refresh", "arefresh"])
def test_refresh_updates_a_stale_result(backend, start_worker, how):
    worker = start_worker()
    stale = std.answer.enqueue()
    std.answer.get_result(stale.id).wait(timeout=WAIT)  # another copy sees it finish
    assert stale.status == TaskResultStatus.READY and stale.finished_at is None
    if how == "refresh":
        stale.refresh()
    else:
        asyncio.run(stale.arefresh())
    assert stale.status == TaskResultStatus.SUCCESSFUL
    assert stale.return_value == 42
    assert_ran_once(stale, worker)
    # Refreshing what is already current changes nothing.
    before = dataclasses.asdict(stale)
    stale.refresh()
    asyncio.run(stale.arefresh())
    assert dataclasses.asdict(stale) == before


def test_a_task_and_its_result_pickle(backend, start_worker):
    start_worker()
    assert pickle.loads(pickle.dumps(std.answer)) == std.answer
    result = std.answer.enqueue().wait(timeout=WAIT)
    assert pickle.loads(pickle.dumps(result)) == result


# -- validate_task --------------------------------------------------------------------------


def test_an_unknown_queue_is_invalid_when_queues_are_listed(
        backend, settings, monkeypatch, zk_hosts, zk_root):
    elsewhere = std.noop.using(queue_name="unknown_queue")  # QUEUES is []: any name goes
    assert elsewhere.queue_name == "unknown_queue"
    use_zookeeper(settings, monkeypatch, zk_hosts, zk_root, queues=["default", "queue-1"])
    message = re.escape("Queue 'unknown_queue' is not valid for backend.")
    with pytest.raises(InvalidTask, match=message):
        std.noop.using(queue_name="unknown_queue")
    with pytest.raises(InvalidTask, match=message):
        elsewhere.enqueue()
    with pytest.raises(InvalidTask, match=message):
        asyncio.run(elsewhere.aenqueue())
    assert std.noop.using(queue_name="queue-1").queue_name == "queue-1"


@pytest.mark.parametrize("priority", [TASK_MIN_PRIORITY - 1, TASK_MAX_PRIORITY + 1, 3.1])
def test_a_priority_out_of_range_is_invalid(backend, priority):
    message = re.escape(f"priority must be a whole number between {TASK_MIN_PRIORITY} and "
                        f"{TASK_MAX_PRIORITY}.")
    with pytest.raises(InvalidTask, match=message):
        std.noop.using(priority=priority)


@pytest.mark.parametrize("priority", [TASK_MIN_PRIORITY, 0, TASK_MAX_PRIORITY])
def test_a_priority_in_range_is_valid(backend, priority):
    assert std.noop.using(priority=priority).priority == priority


def test_a_whole_number_float_priority_is_valid_and_runs(backend, start_worker, zk_client):
    """Django's check accepts 3.0 (int(p) == p); pending jobs' names need the int."""
    start_worker()
    result = std.noop.using(priority=3.0).enqueue()
    assert result.wait(timeout=WAIT).status == TaskResultStatus.SUCCESSFUL
    assert backend.get_result(result.id).task.priority == 3


def test_a_naive_run_after_is_invalid(backend):
    with pytest.raises(InvalidTask, match=re.escape("run_after must be an aware datetime.")):
        std.noop.using(run_after=datetime.now())  # noqa: DTZ005 - naive on purpose
    later = timezone.now() + timedelta(minutes=5)
    assert std.noop.using(run_after=later).run_after == later


def test_takes_context_without_a_context_argument_is_invalid(backend):
    from django.tasks import task

    message = re.escape("Task takes context but does not have a first argument of 'context'.")
    with pytest.raises(InvalidTask, match=message):
        task(takes_context=True)(std.answer.func)


# -- signals and log lines ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["enqueue", "aenqueue"])
def test_task_enqueued_is_sent_in_the_submitting_process(backend, receivers, how):
    result = enqueue(std.noop, how, 7)
    [(sender, sent)] = receivers["enqueued"]
    assert sender is ZooKeeperBackend
    assert sent.id == result.id
    assert sent.status == TaskResultStatus.READY
    assert sent.enqueued_at is not None
    assert sent.task == std.noop and sent.args == [7]


def test_task_started_and_task_finished_are_sent_by_the_worker(
        backend, start_worker, receivers):
    """The worker (here in this process, as start_worker runs it) sends them once the
    state they report is recorded: started with RUNNING, finished with the outcome."""
    start_worker()
    good = std.answer.enqueue().wait(timeout=WAIT)
    bad = std.fails_with_value_error.enqueue().wait(timeout=WAIT)
    wait_until(lambda: len(receivers["finished"]) == 2, message="two task_finished")
    started = {sent.id: (sender, sent) for sender, sent in receivers["started"]}
    finished = {sent.id: (sender, sent) for sender, sent in receivers["finished"]}
    assert set(started) == set(finished) == {good.id, bad.id}
    assert {sender for sender, _ in (*started.values(), *finished.values())} == {
        ZooKeeperBackend}
    assert started[good.id][1].status == TaskResultStatus.RUNNING
    assert started[good.id][1].started_at is not None
    assert started[good.id][1].task == std.answer
    done = finished[good.id][1]
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 42
    assert done.finished_at is not None
    failed = finished[bad.id][1]
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is ValueError


@pytest.fixture(params=[False, True], ids=["no-other-receiver", "another-receiver"])
def listening(request):
    """Whether a receiver other than Django's own log lines listens to task_started and
    task_finished. Without one the worker sends no signal and writes Django's lines
    itself; with one, Django's own receivers write them."""
    if not request.param:
        yield False
        return

    def receive(sender, task_result, **kwargs):
        pass

    task_started.connect(receive)
    task_finished.connect(receive)
    yield True
    task_started.disconnect(receive)
    task_finished.disconnect(receive)


def test_the_django_tasks_log_lines_of_a_success(backend, start_worker, django_tasks_log,
                                                 listening):
    start_worker()
    result = std.noop.enqueue().wait(timeout=WAIT)
    wait_until(lambda: len(django_tasks_log(result.id)) == 3, message="three log lines")
    enqueued, running, finished = django_tasks_log(result.id)
    assert enqueued.levelno == logging.DEBUG and "enqueued" in enqueued.getMessage()
    assert running.levelno == logging.INFO and "state=RUNNING" in running.getMessage()
    assert finished.levelno == logging.INFO and "state=SUCCESSFUL" in finished.getMessage()
    for record in (enqueued, running, finished):
        assert "path=tests.standard_tasks.noop" in record.getMessage()
        assert "NoneType" not in record.getMessage()


def test_the_django_tasks_log_lines_of_a_failure(backend, start_worker, django_tasks_log,
                                                 caplog, listening):
    start_worker()
    result = std.fails_with_value_error.enqueue().wait(timeout=WAIT)
    wait_until(lambda: len(django_tasks_log(result.id)) == 3, message="three log lines")
    _, running, failed = django_tasks_log(result.id)
    assert "state=RUNNING" in running.getMessage()
    assert failed.levelno == logging.ERROR and "state=FAILED" in failed.getMessage()
    errors = [r for r in caplog.records if r.name == "django.tasks" and r.levelno >= logging.ERROR]
    assert errors == [failed]
    # Django's immediate backend attaches the traceback to this line (exc_info). In a
    # worker the exception lived in the task's process; its traceback is on the worker's
    # own failure line, once, rather than twice in every worker's log.
    job_failed = [r for r in caplog.records if r.name == "zktasks.worker"
                  and r.levelno == logging.ERROR and result.id in r.getMessage()]
    assert len(job_failed) == 1
    assert "ValueError: conformance: a plain failure" in job_failed[0].getMessage()
