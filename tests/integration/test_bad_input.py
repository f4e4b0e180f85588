"""Bad input is refused at submit with a clear error, and nothing is written; a bad
outcome (an exception that cannot print itself, a value that cannot be loaded) is still
recorded and readable."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.tasks import TaskResultStatus, task_backends

from tests import tasks
from tests.conftest import zk_tasks_setting
from tests.pending import pending_nodes
from zktasks import (
    InvalidTaskError,
    JobNotFound,
    PayloadTooLarge,
    SerializationError,
    zk_task,
)


def tree_is_empty(backend, zk_client):
    layout = backend.conf and backend.store.layout

    def children(path):
        return zk_client.get_children(path) if zk_client.exists(path) else []

    jobs = [c for q in children(layout.jobs) for c in pending_nodes(zk_client, layout, q)]
    return jobs == [] and children(layout.status_dir) == []


def test_unserializable_argument_is_named(backend, zk_client):
    with pytest.raises(SerializationError) as caught:
        tasks.add.submit(1, b=(i for i in range(3)))
    message = str(caught.value)
    assert "keyword argument 'b'" in message and "generator" in message
    assert "tests.tasks.add" in message
    assert tree_is_empty(backend, zk_client)


@pytest.mark.parametrize("args, kwargs, says", [
    ((1,), {}, "missing a required argument: 'b'"),
    ((1, 2, 3), {}, "too many positional arguments"),
    ((1, 2), {"c": 2}, "unexpected keyword argument 'c'"),
])
def test_arguments_that_do_not_fit_the_task_are_refused_at_submit(backend, zk_client, args,
                                                                  kwargs, says):
    """They were written, and failed on the worker (after every attempt it allowed)."""
    with pytest.raises(TypeError, match=says) as caught:
        tasks.add.submit(*args, **kwargs)
    assert "tests.tasks.add(a, b)" in str(caught.value)
    with pytest.raises(TypeError, match="item 1"):
        tasks.add.submit_many([((1, 2), {}), (args, kwargs)])
    assert tree_is_empty(backend, zk_client)


def test_a_decorated_task_is_checked_against_what_is_called(backend, start_worker):
    """Its decorator's wrapper, not the function it wraps: the wrapper supplies an
    argument (inspect.signature follows __wrapped__, and refused this submit)."""
    start_worker()
    job = tasks.fetch_with_client.submit("https://example.com")
    assert job.wait(timeout=30).return_value == ["client", "https://example.com"]


def test_the_signature_check_keeps_no_submitted_object_alive(backend):
    """A bound method is wrapped afresh per submit: a strong cache kept its object."""
    import gc
    import weakref

    from zktasks import submit

    class Service:
        def run(self, x):
            return x

    service = Service()
    gone = weakref.ref(service)
    submit(service.run, 1)
    del service
    gc.collect()
    assert gone() is None


def test_a_task_that_takes_its_context_is_checked_without_it(backend, zk_client):
    with pytest.raises(TypeError, match="missing a required argument: 'x'"):
        tasks.with_context.submit()
    assert tree_is_empty(backend, zk_client)
    assert tasks.with_context.submit(5).id  # context, then x


def test_unserializable_positional_argument_is_named(backend, zk_client):
    import socket

    with socket.socket() as sock, pytest.raises(SerializationError, match="positional argument 1"):
        tasks.add.submit(1, sock)


def test_payload_over_the_znode_limit_says_size_and_limit(backend, zk_client):
    with pytest.raises(PayloadTooLarge) as caught:
        tasks.add.submit(b"x" * 2_000_000, b"")
    message = str(caught.value)
    assert "1,000,000" in message and "bytes" in message and "reference" in message
    assert tree_is_empty(backend, zk_client)


def test_a_payload_far_over_the_limit_is_refused_before_it_is_copied(backend, zk_client,
                                                                     monkeypatch):
    """The pickle is checked before its envelope and the record's JSON are made, each as
    large again: a 200 MB argument took 1 GB of memory before it was refused, which
    can get a web process killed for its memory."""
    from zktasks import envelope

    def seal(*args, **kwargs):
        raise AssertionError("an envelope was made of a payload already too large")

    monkeypatch.setattr(envelope, "seal", seal)
    with pytest.raises(PayloadTooLarge, match="at least 6,66"):
        tasks.add.submit(b"x" * 5_000_000, b"")
    assert tree_is_empty(backend, zk_client)


def test_a_return_value_over_the_limit_fails_its_job_and_the_worker_goes_on(
        backend, start_worker):
    """Refused by its pickle's size, before the envelope's and the JSON's copies (each
    as large again, in the worker's own process)."""
    start_worker()
    result = tasks.returns_bytes.submit(5_000_000).wait(timeout=60)
    assert result.status == TaskResultStatus.FAILED
    error = result.errors[-1]
    assert error.exception_class_path == "zktasks.exceptions.PayloadTooLarge"
    assert "6,66" in error.traceback and "or more" in error.traceback
    assert tasks.returns_bytes.submit(100_000).wait(timeout=30).return_value == b"x" * 100_000


def test_unknown_queue_is_refused(settings, zk_hosts, zk_root, zk_client):
    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, queues=["default", "emails"])
    with pytest.raises(InvalidTaskError, match=r"^Queue 'nope' is not valid for backend\."):
        tasks.add.using(queue_name="nope").submit(1, 2)
    with pytest.raises(InvalidTaskError, match="Queue name 'bad/name' is invalid"):
        tasks.add.using(queue_name="bad/name")


@pytest.mark.parametrize("priority", [101, -101, 1.5, "high"])
def test_invalid_priority_is_refused(backend, priority):
    with pytest.raises(InvalidTaskError, match="^priority must be a whole number"):
        tasks.add.using(priority=priority)


@pytest.mark.parametrize("options,match", [
    ({"max_attempts": 0}, "max_attempts"),
    ({"timeout": -1}, "timeout"),
    ({"result_ttl": 0}, "result_ttl"),
    ({"result_ttl": True}, "result_ttl"),
    ({"result_ttl": float("inf")}, "result_ttl"),
    ({"result_ttl": "1h"}, "result_ttl"),
])
def test_invalid_task_options_are_refused(backend, options, match):
    with pytest.raises(InvalidTaskError, match=match):
        zk_task(**options)(lambda: None)


def test_unknown_job_id_raises_django_error(backend):
    from django.tasks.exceptions import TaskResultDoesNotExist

    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result("0" * 32)
    with pytest.raises(JobNotFound):
        tasks.add.get_result("not-an-id")


def test_zookeeper_down_gives_clear_error(settings, zk_root):
    from zktasks import ZooKeeperUnavailableError
    from zktasks.testing import free_port

    settings.TASKS = zk_tasks_setting(f"127.0.0.1:{free_port()}", zk_root, CONNECT_TIMEOUT=1.0)
    with pytest.raises(ZooKeeperUnavailableError, match="Could not connect to ZooKeeper"):
        tasks.add.submit(1, 2)


def test_pending_job_can_be_cancelled_and_never_runs(backend, start_worker, zk_client):
    job = tasks.add.submit(1, 2)
    assert job.cancel() is True
    assert job.status == TaskResultStatus.FAILED
    assert job.errors[0].exception_class_path == "zktasks.exceptions.JobCancelled"
    start_worker()
    after = tasks.add.submit(3, 4).wait(timeout=30)  # the worker is live and serving
    assert after.return_value == 7
    job.refresh()
    assert job.worker_ids == [] and job.status == TaskResultStatus.FAILED


@pytest.fixture
def patient_wait_reads(monkeypatch):
    """A wait() with little or no time left still reads the job, for at least
    WAIT_READ_FLOOR (1 s): a healthy server answers in milliseconds, a loaded machine
    may take longer. What is under test is that the read happens, not its bound."""
    from zktasks import backend as backend_module

    monkeypatch.setattr(backend_module, "WAIT_READ_FLOOR", 30.0)


def test_wait_times_out_with_a_clear_error(backend, patient_wait_reads):
    job = tasks.add.submit(1, 2)
    with pytest.raises(TimeoutError, match=r"did not finish within 0.2s \(state READY\)"):
        job.wait(timeout=0.2)
    # No time left is still time to read: the state is READY, not "unknown".
    with pytest.raises(TimeoutError, match=r"within 0s \(state READY\)"):
        job.wait(timeout=0)


def test_wait_with_no_time_left_returns_a_finished_job(backend, start_worker,
                                                       patient_wait_reads):
    start_worker()
    job = tasks.add.submit(1, 2)
    job.wait(timeout=60)
    assert backend.wait(job.id, timeout=0).return_value == 3
    assert tasks.add.get_result(job.id).wait(timeout=0).return_value == 3


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_an_exception_whose_str_fails_still_fails_its_job(backend, start_worker, pool):
    """Its str() raising used to leave the job RUNNING (thread pool) or turn it into a
    TaskProcessDied (process pool): recording the error itself failed."""
    start_worker(pool=pool)
    result = tasks.raises_unprintable.submit().wait(timeout=60)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "tests.tasks.UnprintableError"
    assert "raise UnprintableError" in result.errors[0].traceback


def test_a_return_value_that_cannot_be_loaded_here_leaves_the_result_readable(
        backend, start_worker):
    start_worker()
    job = tasks.returns_unloadable.submit()
    result = job.wait(timeout=30)  # used to raise the unpickling error itself
    assert result.status == TaskResultStatus.SUCCESSFUL and result.worker_ids
    with pytest.raises(SerializationError, match="cannot be loaded in this process"):
        _ = result.return_value
    fresh = backend.get_result(job.id)
    assert fresh.status == TaskResultStatus.SUCCESSFUL
    with pytest.raises(SerializationError, match="this value cannot be loaded here"):
        _ = fresh.return_value


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_return_value_that_cannot_be_pickled_fails_without_a_retry(
        backend, start_worker, tmp_path, pool):
    """Its task ran to the end: another attempt would only repeat its side effects."""
    start_worker(pool=pool)
    result = tasks.returns_a_generator.submit(str(tmp_path)).wait(timeout=60)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "zktasks.exceptions.SerializationError"
    assert "cannot be serialized by dill" in result.errors[-1].traceback
    assert result.attempts == 1 and len(list(tmp_path.glob("ran-*"))) == 1


def test_immediate_backend_keeps_zk_tasks_working(settings):
    settings.TASKS = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}
    result = tasks.add.submit(2, 3)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert task_backends["default"].__class__.__name__ == "ImmediateBackend"
    # Code written for zktasks runs unchanged in a user's unit tests.
    assert result.wait(timeout=10) is result
    assert result.cancel() is False  # it has already finished


def test_submit_on_commit_on_the_immediate_backend_gives_a_result_when_it_can(settings):
    settings.TASKS = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}
    result = tasks.add.submit_on_commit(2, 3)  # no transaction: enqueued now
    assert result.return_value == 5


@pytest.mark.django_db
def test_submit_on_commit_on_the_immediate_backend_waits_for_the_commit(
        settings, django_capture_on_commit_callbacks):
    settings.TASKS = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert tasks.add.submit_on_commit(2, 3) is None  # no result before the commit
    assert len(callbacks) == 1


def test_dummy_backend_records_submissions(settings):
    settings.TASKS = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
    result = tasks.add.submit(2, 3)
    assert result.status == TaskResultStatus.READY
    assert task_backends["default"].results[0].id == result.id
    assert tasks.add.get_result(result.id).status == TaskResultStatus.READY
    with pytest.raises(TimeoutError, match="DummyBackend runs no tasks"):
        result.wait(timeout=10)
    with pytest.raises(NotImplementedError, match="needs the ZooKeeperBackend"):
        result.cancel()


def test_queues_given_as_a_string_is_a_clear_configuration_error(settings, zk_hosts, zk_root):
    from zktasks import ConfigurationError

    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, queues="default")
    with pytest.raises(ConfigurationError, match="give a list of queue names"):
        task_backends["default"]  # noqa: B018 - building the backend is the check


def test_open_files_are_refused_at_submit(backend, zk_client, tmp_path):
    """dill sends an open file as its path for the worker to open again: an upload's
    temporary file is deleted at the end of its request, and the job failed on the
    worker with a KeyError from inside dill."""
    import tempfile

    from django.core.files.uploadedfile import TemporaryUploadedFile

    path = tmp_path / "report.csv"
    path.write_text("a,b\n")
    upload = TemporaryUploadedFile("report.csv", "text/csv", 4, "utf-8")
    with open(path) as opened, tempfile.NamedTemporaryFile() as named:
        for value, where in [(upload, "positional argument 0"),
                             (opened, "positional argument 0"),
                             (named, "positional argument 0"),
                             ([1, opened], "positional argument 0")]:
            with pytest.raises(SerializationError, match=f"{where} .*open file"):
                tasks.add.submit(value, 1)
        with pytest.raises(SerializationError, match="keyword argument 'b' .*storage"):
            tasks.add.submit(1, b=opened)
    upload.close()
    assert tree_is_empty(backend, zk_client)
    assert tasks.add.submit(path.read_bytes(), str(path)).id  # bytes and a path travel


def test_open_files_reached_only_by_pickling_are_refused(backend, zk_client, start_worker,
                                                         tmp_path):
    """A file in a lambda's closure, a partial's arguments, a bound method's object or
    an argument's attribute: the scan of the arguments cannot see it, and it was
    accepted, then failed on the worker, or (its path gone) read nothing and succeeded.
    dill now refuses it as it gets to it. A return value holding one fails its job."""
    import functools

    from django.core.files.uploadedfile import TemporaryUploadedFile

    from zktasks import submit

    upload = TemporaryUploadedFile("data.csv", "text/csv", 8, "utf-8")
    upload.write(b"a,b\n1,2\n")
    path = tmp_path / "report.csv"
    path.write_text("a,b\n")
    with open(path, "rb") as opened:
        for make in (lambda: submit(lambda: tasks.read_all.func(opened)),
                     lambda: submit(functools.partial(tasks.read_all.func, upload)),
                     lambda: submit(tasks.Holder(opened).read),
                     lambda: tasks.read_all.submit(tasks.Holder(upload)),
                     lambda: submit(tasks.join_with, b"", {"files": [[opened]]})):
            with pytest.raises(SerializationError,
                               match=r"open file \(\w+ '.*(report|upload)\.csv'\) inside"):
                make()
    upload.close()
    assert tree_is_empty(backend, zk_client)

    start_worker()
    result = tasks.returns_an_open_file.submit(str(path)).wait(timeout=30)
    assert result.status == TaskResultStatus.FAILED
    assert "holds an open file" in result.errors[-1].traceback
    # The standard streams travel by name, as dill sends them: the worker writes to its
    # own (this was refused too at first).
    import sys

    job = submit(functools.partial(print, "from a job", file=sys.__stderr__))
    assert job.wait(timeout=30).status == TaskResultStatus.SUCCESSFUL


def test_in_memory_files_travel_by_value(backend, start_worker):
    """Only objects backed by an OS file are refused: these pickle by value."""
    import io

    from django.core.files.base import ContentFile

    start_worker()
    for value in (io.BytesIO(b"abc"), io.StringIO("abc"), ContentFile(b"abc"),
                  SimpleUploadedFile("r.csv", b"abc")):
        job = tasks.read_all.submit(value)
        assert job.wait(timeout=30).return_value in (b"abc", "abc"), type(value)


def test_a_long_unique_key_counts_twice_against_the_request_limit(backend, zk_client):
    """The key is in the record and again in its own znode, and the whole multi must
    stay under jute.maxbuffer. Only the records were counted: a request over the
    limit dropped the connection, again at every retry, until a ZooKeeperUnavailableError
    ("may or may not have been submitted") instead of PayloadTooLarge at once."""
    key = "k" * 600_000  # the record alone is under the 1,000,000-byte limit
    with pytest.raises(PayloadTooLarge, match="reference"):
        tasks.add.using(unique_key=key).submit(1, 2)
    assert tree_is_empty(backend, zk_client)
    assert tasks.add.using(unique_key="k" * 300_000).submit(1, 2).id  # both copies fit


def _lose_the_first_landed_answer(client, monkeypatch) -> list:
    """The first multi that lands has its answer lost with the connection (ConnectionLoss
    after the write); return the list its results go in."""
    from kazoo.exceptions import ConnectionLoss

    transaction, lost = client.transaction, []

    def answer_lost():
        txn = transaction()
        commit = txn.commit

        def commit_then_lose():
            results = commit()
            if not lost and not any(isinstance(r, Exception) for r in results):
                lost.append(results)  # landed (a missing shard's NoNode is no landing)
                raise ConnectionLoss("the answer was lost (test)")
            return results

        txn.commit = commit_then_lose
        return txn

    monkeypatch.setattr(client, "transaction", answer_lost)
    return lost


def _behind_once(client, monkeypatch, verb: str, lost: list, answer, path=None) -> list:
    """After that loss, the first `verb` read (of `path`, if given) answers `answer`, as a
    member of the ensemble that has not applied the multi yet; return the paths so read."""
    read, lagging = getattr(client, verb), []

    def behind(wanted, *args, **kwargs):
        if lost and not lagging and path in (None, wanted):
            lagging.append(wanted)
            return answer
        return read(wanted, *args, **kwargs)

    monkeypatch.setattr(client, verb, behind)
    return lagging


def test_submit_many_whose_answer_was_lost_reports_the_jobs_it_wrote(
        backend, zk_client, monkeypatch):
    """The chunk's multi lands, its answer is lost with the connection, and the server
    the client reconnects to has not applied it yet (another member of an ensemble):
    the check for an earlier landing finds nothing, the resend meets NodeExists. That
    raised, telling the caller nothing was written; submitting again ran every job
    twice."""
    client = backend.store.raw_client
    prepared = [backend.prepare(tasks.add, args, {}) for args in ((1, 2), (3, 4))]
    results = [result for _, result in prepared]
    lost = _lose_the_first_landed_answer(client, monkeypatch)
    lagging = _behind_once(client, monkeypatch, "exists", lost, None)
    # submit_many() bounds each multi, through a view of the client; these are the same
    # steps, on the client itself.
    backend.store.submit_many(record for record, _ in prepared)
    assert lost and lagging
    assert [backend.get_result(r.id).status for r in results] == [TaskResultStatus.READY] * 2
    assert len(pending_nodes(zk_client, backend.store.layout)) == 2


def test_a_retry_whose_answer_was_lost_says_it_sent_the_job_back(
        backend, start_worker, zk_client, monkeypatch):
    """The retry's multi lands, its answer is lost, and the server asked whether it
    landed has not applied it yet: the resend meets our own version (BadVersion), and
    retry() said False ("not FAILED") for a job it had sent back."""
    worker = start_worker()
    job = tasks.boom.submit("once")
    assert job.wait(timeout=30).status == TaskResultStatus.FAILED
    worker.stop()
    assert worker.wait_stopped(30)
    store = backend.store
    client, path = store.raw_client, store.layout.status(job.id)
    stale = zk_client.get(path)
    lost = _lose_the_first_landed_answer(client, monkeypatch)
    lagging = _behind_once(client, monkeypatch, "get", lost, stale, path)
    # The backend's own calls go through a bounded view of the client; these are the
    # same steps, on the client itself.
    assert backend._retry(store, job.id) is True
    assert lost and lagging
    assert backend.get_result(job.id).status == TaskResultStatus.READY
    assert len(pending_nodes(zk_client, store.layout)) == 1


@pytest.mark.parametrize("bad", ["../x", "", None, "a" * 32 + "/"])
def test_what_cannot_be_a_job_id_is_no_such_job_everywhere(backend, bad):
    """wait(), cancel() and retry() put the id into a path: kazoo raised ValueError
    ("relative paths not allowed"), where get_result() said there is no such job."""
    import asyncio

    for call in (backend.get_result, lambda i: backend.wait(i, timeout=1), backend.cancel,
                 backend.retry, lambda i: asyncio.run(backend.await_result(i, timeout=1))):
        with pytest.raises(JobNotFound, match="No job has the id"):
            call(bad)


def test_a_unique_key_utf8_cannot_encode_is_refused_where_the_task_is_built(backend,
                                                                             zk_client):
    """A lone surrogate (from os.fsdecode, say) raised a bare UnicodeEncodeError from
    deep in submit."""
    with pytest.raises(InvalidTaskError, match="unique_key"):
        tasks.add.using(unique_key="report-\udce9")
    assert tree_is_empty(backend, zk_client)


def test_plain_data_nested_deeper_than_dill_follows_travels(backend, start_worker):
    """dill's pickler, in Python, ran out of stack about 150 levels down, where the C
    pickler and Django's own JSON-based backends go on; plain data takes the C pickler
    then, both ways. What no pickler can follow is still a clear SerializationError."""
    def nested(depth):
        value = "leaf"
        for level in range(depth):
            value = {"k": [value, level]}
        return value

    import dataclasses

    # By reference, as a task of an installed app travels (those of tests/ go by value).
    echo = dataclasses.replace(tasks.echo, by_value=False)
    start_worker()
    deep = nested(300)
    result = echo.submit(deep).wait(timeout=30)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == deep
    with pytest.raises(SerializationError, match="cannot be serialized"):
        echo.submit(nested(100_000))
