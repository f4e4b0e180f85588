"""A leader SIGKILLed while it assigns a large batched backlog: each job stays in exactly
one place, and the next leader finishes the drain with every job run."""

import os
import signal

import pytest

from tests import tasks
from tests.pending import pending_nodes
from tests.waiting import wait_for_children, wait_until
from zktasks.records import StatusRecord

pytestmark = pytest.mark.e2e

JOBS = 3000


def runs(marker_dir) -> set[int]:
    return {int(name.split("-", 1)[0]) for name in os.listdir(marker_dir)}


def places(zk_client, layout, ids):
    """job id -> the places it is in right now: "pending", "assigned", "finished"."""
    where = {job_id: [] for job_id in ids}
    for node in pending_nodes(zk_client, layout):
        where[node.split("-", 1)[1]].append("pending")
    for owner in zk_client.get_children(layout.assignments):
        for job_id in zk_client.get_children(layout.worker_assignments(owner)):
            where[job_id].append("assigned")
    for job_id in ids:
        raw, _ = zk_client.get(layout.status(job_id))
        if StatusRecord.from_bytes(raw).is_finished:
            where[job_id].append("finished")
    return where


def test_a_leader_killed_mid_assignment_leaves_each_job_in_one_place(backend, runworker,
                                                                     zk_client, tmp_path):
    layout = backend.store.layout
    markers = tmp_path / "runs"  # tmp_path holds the workers' logs too
    markers.mkdir()
    results = tasks.mark.submit_many([((str(markers), n), {}) for n in range(JOBS)])
    ids = [r.id for r in results]
    # One process leads and works, with room for hundreds of jobs: the leader hands the
    # backlog out in multis of 100 assignments, continuously, as slots free up.
    leader = runworker("--pool", "thread", "--concurrency", "8", "--prefetch", "300",
                       name="doomed")
    wait_until(lambda: len(runs(markers)) >= JOBS // 10, 120, "the drain to be under way")
    leader.send_signal(signal.SIGKILL)
    leader.wait(10)

    # Nothing writes now (the only process is dead): the tree is still.
    where = places(zk_client, layout, ids)
    wrong = {j: p for j, p in where.items() if len(p) != 1}
    assert wrong == {}, f"{len(wrong)} jobs in zero or two places: {list(wrong.items())[:5]}"
    counts = {p: sum(1 for v in where.values() if v == [p])
              for p in ("pending", "assigned", "finished")}
    print("places at the kill:", counts)
    assert all(counts.values()), counts  # killed mid-drain: some jobs in each place

    # The next leader hands the dead worker's jobs back (once its session expires) and
    # finishes the drain.
    runworker("--pool", "thread", "--concurrency", "8", "--prefetch", "50", name="heir")
    wait_until(lambda: runs(markers) == set(range(JOBS)), 240, "every job to run")
    wait_for_children(zk_client, layout.workers, lambda c: len(c) == 1, 30)
    wait_until(lambda: all(p == ["finished"]
                           for p in places(zk_client, layout, ids).values()),
               120, "every job recorded as finished")
    assert pending_nodes(zk_client, layout) == []
