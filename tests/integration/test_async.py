"""zktasks from async code (ASGI views, asyncio): pipelined() blocks belong to their own
coroutine, a sync submit that could not announce its job writes nothing, and waiting
does not block the event loop. A real ZooKeeper and, where jobs run, a real worker."""

import asyncio

import pytest
from django.core.exceptions import SynchronousOnlyOperation
from django.tasks.signals import task_enqueued

import zktasks
from tests import tasks


def statuses(backend, zk_client) -> list[str]:
    return zk_client.get_children(backend.store.layout.status_dir)


def test_a_pipelined_block_does_not_take_another_coroutines_submit(backend):
    """Every coroutine of a loop runs on one thread: with the open pipeline kept per
    thread, the other request's plain submit() went into this block's pipeline and
    returned before its job was written."""
    async def main():
        inside, done = asyncio.Event(), asyncio.Event()

        async def request_with_a_block():
            with zktasks.pipelined() as pipe:
                tasks.add.submit(1, 1)
                inside.set()
                await done.wait()  # an await in the block (an ORM query, a fetch)
                return pipe.sent

        async def other_request():
            await inside.wait()
            result = tasks.add.submit(2, 2)  # plain: returns once written
            found = backend.store.read_status(result.id)
            done.set()
            return found

        return await asyncio.gather(request_with_a_block(), other_request())

    sent, found = asyncio.run(main())
    assert sent == 1  # its own job only
    assert found is not None, "submit() returned before its job was written"


def test_a_block_in_another_coroutine_is_its_own_and_writes_at_its_end(backend):
    async def main():
        inside, done = asyncio.Event(), asyncio.Event()

        async def long_block():
            with zktasks.pipelined():
                tasks.add.submit(1, 1)
                inside.set()
                await done.wait()

        async def short_block():
            await inside.wait()
            with zktasks.pipelined():
                ids = [tasks.add.submit(n, 1).id for n in range(5)]
            # The long block is still open: this one was not taken for its nested block.
            missing = [i for i in ids if backend.store.read_status(i) is None]
            done.set()
            return missing

        return (await asyncio.gather(long_block(), short_block()))[1]

    assert asyncio.run(main()) == []


def test_a_task_that_outlives_the_block_submits_directly(backend):
    async def main():
        release = asyncio.Event()

        async def child():
            await release.wait()
            return tasks.add.submit(3, 3)

        with zktasks.pipelined():
            started = asyncio.create_task(child())  # inherits the block's context
        release.set()
        result = await started
        return backend.store.read_status(result.id)

    assert asyncio.run(main()) is not None


@pytest.fixture
def async_receiver():
    seen = []

    async def receive(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_enqueued.connect(receive)
    yield seen
    task_enqueued.disconnect(receive)


def test_a_sync_submit_that_could_not_announce_its_job_writes_nothing(
        backend, zk_client, async_receiver):
    """Django's Signal.send() cannot run async receivers in a thread running a loop; it
    raised after the job was written, and a caller retrying made a second job."""
    async def main():
        with pytest.raises(SynchronousOnlyOperation, match="nothing was written"):
            tasks.add.submit(2, 2)
        with pytest.raises(SynchronousOnlyOperation, match="aenqueue"), zktasks.pipelined():
            pass
        return await tasks.add.aenqueue(2, 2)

    result = asyncio.run(main())
    assert async_receiver == [result.id]
    assert statuses(backend, zk_client) == [result.id]


def test_await_result_leaves_the_loop_free(backend, start_worker, tmp_path):
    """The job finishes only once another coroutine releases it: a wait that blocked
    the loop could never see that, and would time out."""
    start_worker()
    release = tmp_path / "release"

    async def main():
        job = await tasks.wait_for_file.aenqueue(str(release), "done")

        async def release_it():
            await asyncio.sleep(0)
            release.touch()

        finished, _ = await asyncio.gather(job.await_result(timeout=30), release_it())
        stale = await tasks.wait_for_file.aget_result(job.id)
        return job, finished, stale

    job, finished, stale = asyncio.run(main())
    assert finished is job and job.return_value == "done"
    assert stale.extra == job.extra


def test_arefresh_copies_what_get_result_gives(backend, start_worker):
    start_worker()

    async def main():
        job = await tasks.add.aenqueue(2, 3)
        await job.await_result(timeout=30)
        copy = await tasks.add.aget_result(job.id)
        object.__setattr__(copy, "extra", {})
        await copy.arefresh()
        return job, copy

    job, copy = asyncio.run(main())
    assert copy.extra == job.extra and copy.extra["attempts"] == 1
    assert copy.return_value == 5


def test_await_result_connects_off_the_loop(backend, start_worker, monkeypatch):
    """A result from elsewhere (unpickled in a fresh ASGI worker) may be the process's
    first use of ZooKeeper: connecting, up to CONNECT_TIMEOUT, ran on the loop's thread
    and stalled every coroutine of it meanwhile."""
    import pickle
    import threading

    from zktasks import client as client_module

    start_worker()
    job = tasks.add.submit(2, 3)
    copy = pickle.loads(pickle.dumps(job))
    client_module.close_clients()  # as in a process that has not connected yet
    started_on = []
    start = client_module.start

    def noting(*args, **kwargs):
        started_on.append(threading.current_thread())
        return start(*args, **kwargs)

    monkeypatch.setattr(client_module, "start", noting)

    async def main():
        loop_thread = threading.current_thread()
        finished = await copy.await_result(timeout=30)
        return loop_thread, finished

    loop_thread, finished = asyncio.run(main())
    assert finished.return_value == 5
    assert started_on and loop_thread not in started_on
