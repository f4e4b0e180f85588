"""Waiting on a finished job, as often as a caller likes, keeps one watch function in
kazoo for its status znode (statuswatch.py)."""

import asyncio

from django.tasks import TaskResultStatus

from tests import tasks
from zktasks import statuswatch

FAILED, SUCCESSFUL = TaskResultStatus.FAILED, TaskResultStatus.SUCCESSFUL


def watch_functions(backend, path: str) -> int:
    # kazoo's private registry is the thing that grew; nothing public counts it.
    return len(backend.store.raw_client._data_watchers.get(path, ()))


def waited(job, times: int) -> set:
    """The statuses `times` wait() calls and `times` await_result() calls saw."""
    async def awaited():
        return [(await job.await_result(timeout=30)).status for _ in range(times)]

    seen = {job.wait(timeout=30).status for _ in range(times)}
    seen |= {job.wait(timeout=0).status for _ in range(times)}
    return seen | set(asyncio.run(awaited()))


def test_waits_on_a_finished_job_keep_one_watch_function(backend, start_worker):
    """wait() reads the status znode with a watch, and kazoo keeps the function of a read
    that succeeded until the znode changes: for a finished job, at RESULT_TTL (a day)
    or a retry. Each wait() and await_result() on it left one more function there."""
    start_worker()
    job = tasks.flaky.using(max_attempts=1).submit(2)
    path = backend.store.layout.status(job.id)
    entry = (id(backend.store.raw_client), path)

    assert waited(job, 50) == {FAILED}
    assert watch_functions(backend, path) == 1
    assert entry not in statuswatch.watches._entries  # nobody waits

    # The record changes (a retry): the function kazoo held fires, and the waits after
    # the new finish share one function again.
    assert backend.retry(job.id) is True
    assert job.wait(timeout=30).return_value == 2
    assert waited(job, 20) == {SUCCESSFUL}
    assert watch_functions(backend, path) == 1
    assert entry not in statuswatch.watches._entries
