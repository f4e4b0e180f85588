"""Rate limits per queue (OPTIONS['RATE_LIMITS']) on a real ZooKeeper: the leader starts a
limited queue's jobs no faster than its rate, across all workers, and holds nothing else
back. The checks are lower bounds on time, so a slow machine cannot fail them."""

import io
import json

import pytest
from django.core.management import call_command
from django.tasks import TaskResultStatus

from tests import tasks
from tests.conftest import use_zookeeper
from tests.waiting import wait_for_data, wait_until

RATE_LIMITS = {"paced": "5/s", "trickle": "1/h"}


@pytest.fixture
def zk_settings(settings, zk_hosts, zk_root, monkeypatch):
    """Overrides the suite's fixture: two limited queues."""
    return use_zookeeper(settings, monkeypatch, zk_hosts, zk_root, RATE_LIMITS=RATE_LIMITS)


def test_a_limited_queue_s_jobs_start_no_faster_than_its_rate_across_workers(
        backend, start_worker):
    # Two workers with 8 runners between them: a limit kept per worker (as Celery's
    # rate_limit is) would start these twice as fast, and free runners all at once.
    # One leads; the other never does, so no failover on a loaded machine can hand the
    # queue a second leader's full bucket mid-test.
    start_worker(queues=["paced"], concurrency=4)
    start_worker(queues=["paced"], concurrency=4, lead=False)
    submitted = [tasks.add.using(queue_name="paced").submit(n, n) for n in range(6)]
    done = [result.wait(timeout=60) for result in submitted]
    assert [r.status for r in done] == [TaskResultStatus.SUCCESSFUL] * 6
    first = min(r.enqueued_at for r in done)
    # 5/s with a burst of one: the k-th start comes at least k fifths of a second after
    # the first job could start (its submit). Times are kept to the microsecond, and
    # written by processes of one machine; the margin is for rounding only.
    since = sorted((r.started_at - first).total_seconds() for r in done)
    assert all(s >= k * 0.2 - 0.002 for k, s in enumerate(since)), since


def test_a_limited_queue_holds_only_its_own_jobs(backend, start_worker, zk_client):
    start_worker(queues=["default", "trickle"], concurrency=2)
    first = tasks.add.using(queue_name="trickle").submit(1, 1)
    second = tasks.add.using(queue_name="trickle").submit(2, 2)
    assert first.wait(timeout=30).status == TaskResultStatus.SUCCESSFUL
    others = [tasks.add.submit(n, 1) for n in range(5)]
    assert [r.wait(timeout=30).status for r in others] == [TaskResultStatus.SUCCESSFUL] * 5
    # 1/h: the second trickle job waits for the next token, the whole time, unassigned.
    second.refresh()
    assert second.status == TaskResultStatus.READY and second.worker_ids == []
    assert zk_client.get_children(backend.store.layout.assignments) != []  # the worker's
    assert not any(zk_client.get_children(f"{backend.store.layout.assignments}/{w}")
                   for w in zk_client.get_children(backend.store.layout.assignments))

    out = io.StringIO()
    call_command("zktasks", "status", "--json", stdout=out)
    queues = {q["name"]: q for q in json.loads(out.getvalue())["queues"]}
    assert queues["trickle"]["rate_limit"] == "1/h" and queues["trickle"]["pending"] == 1
    assert queues["default"]["rate_limit"] is None
    assert queues["paced"]["rate_limit"] == "5/s"  # no job used it: shown all the same
    assert queues["paced"]["pending"] == 0
    out = io.StringIO()
    call_command("zktasks", "status", stdout=out)
    row = next(line for line in out.getvalue().splitlines() if line.split()[:1] == ["trickle"])
    assert row.split()[-1] == "1/h"


def test_a_new_leader_keeps_the_limit_with_at_most_one_burst_more(backend, start_worker):
    # A new leader takes up the bucket the first left in ZooKeeper (at most a clock
    # difference's refill, a burst, early: one job at 5/s) and keeps the rate; it does
    # not start the rest at once.
    first = start_worker(name="first", queues=["paced"], concurrency=4)
    wait_until(lambda: first.leader is not None and first.leader.is_leader, 60, "a leader")
    second = start_worker(name="second", queues=["paced"], concurrency=4)
    submitted = [tasks.add.using(queue_name="paced").submit(n, n) for n in range(8)]
    submitted[2].wait(timeout=60)
    first.stop(graceful=False)
    assert first.wait_stopped(60)
    done = [result.wait(timeout=60) for result in submitted]
    assert [r.status for r in done] == [TaskResultStatus.SUCCESSFUL] * 8
    assert second.leader.is_leader
    assert any(r.worker_ids == [second.worker_id] for r in done)  # led by the second
    first_submit = min(r.enqueued_at for r in done)
    # Each job's last start (a job the first worker held runs again on the second; its
    # earlier start is not kept, which only loosens the bound).
    since = sorted((r.last_attempted_at - first_submit).total_seconds() for r in done)
    assert all(s >= (k - 1) * 0.2 - 0.002 for k, s in enumerate(since)), since


def test_a_new_leader_takes_up_the_bucket_its_predecessor_left(backend, start_worker):
    """The bucket is kept in ZooKeeper with each hand-out (ratelimit.py). Before, it
    lived in the leader's memory only and every new leader started full: a rolling
    deploy (the audit restarted the leader three times) started 4 jobs of a 1/h queue
    within 9 s."""
    first = start_worker(name="first", queues=["default", "trickle"], concurrency=2)
    wait_until(lambda: first.leader is not None and first.leader.is_leader, 60, "a leader")
    ran = tasks.add.using(queue_name="trickle").submit(1, 1)
    assert ran.wait(timeout=60).status == TaskResultStatus.SUCCESSFUL
    waiting = tasks.add.using(queue_name="trickle").submit(2, 2)  # the next token: 1 h
    first.stop(graceful=False)
    assert first.wait_stopped(60)
    second = start_worker(name="second", queues=["default", "trickle"], concurrency=2)
    wait_until(lambda: second.leader is not None and second.leader.is_leader, 60,
               "the second worker to lead")
    # A job submitted after the waiting one is handed out by a plan that saw both: with
    # a full bucket (the old behaviour) the older trickle job goes first, or with it.
    later = tasks.add.submit(3, 3)
    assert later.wait(timeout=60).status == TaskResultStatus.SUCCESSFUL
    waiting.refresh()
    assert waiting.status == TaskResultStatus.READY and waiting.worker_ids == []
    state = json.loads(backend.store.client.get(backend.store.layout.rate_state("trickle"))[0])
    assert state["rate"] == "1/h" and state["tokens"] < 1


def test_a_refused_hand_out_gives_its_tokens_back(backend, start_worker, zk_client):
    """An assignment multi refused as a whole (here by a hand-made znode under the other
    job's pending node; in production a job cancelled or a worker gone between the
    leader's read and its multi) assigned nothing: the limited job's token used to be
    spent all the same, and at 1/h it waited an hour."""
    from zktasks.tree import job_node_name

    other = tasks.add.submit(1, 1)
    limited = tasks.add.using(queue_name="trickle").submit(2, 2)
    pending = backend.store.layout.job("default", job_node_name(0, other.id))
    zk_client.create(f"{pending}/handmade", b"x")
    start_worker(queues=["default", "trickle"], concurrency=2)
    assert other.wait(timeout=60).status == TaskResultStatus.SUCCESSFUL
    assert limited.wait(timeout=60).status == TaskResultStatus.SUCCESSFUL


def test_a_bucket_znode_deleted_by_hand_is_made_again(backend, start_worker, zk_client):
    """The hand-out multi writes the bucket to its znode: gone, it refuses the multi;
    the leader makes it again, and the jobs go on."""
    start_worker(queues=["paced"], concurrency=2)
    first = tasks.add.using(queue_name="paced").submit(1, 1)
    assert first.wait(timeout=60).status == TaskResultStatus.SUCCESSFUL
    path = backend.store.layout.rate_state("paced")
    assert json.loads(zk_client.get(path)[0])["rate"] == "5/s"
    zk_client.delete(path)
    second = tasks.add.using(queue_name="paced").submit(2, 2)
    assert second.wait(timeout=60).status == TaskResultStatus.SUCCESSFUL
    assert json.loads(zk_client.get(path)[0])["rate"] == "5/s"


def test_status_shows_the_limits_the_leader_keeps(backend, start_worker, zk_client, settings,
                                                  monkeypatch, zk_hosts, zk_root):
    """`zktasks status` and the dashboard showed their own process's RATE_LIMITS: during
    a deploy that changes a limit, or from a shell started with other settings, they
    showed a limit the leader did not keep. The leader now says which it keeps."""
    from tests.conftest import use_zookeeper

    leader = start_worker(queues=["default"], concurrency=1)
    wait_until(lambda: leader.leader is not None and leader.leader.is_leader, 60, "a leader")
    # This process now has other limits than the leader started with.
    use_zookeeper(settings, monkeypatch, zk_hosts, zk_root,
                  RATE_LIMITS={"paced": "10/s", "emails": "100/m"})

    def status() -> dict:
        out = io.StringIO()
        call_command("zktasks", "status", "--json", stdout=out)
        return {q["name"]: q for q in json.loads(out.getvalue())["queues"]}

    wait_for_data(zk_client, backend.store.layout.ratelimits,
                  lambda data: data.get("limits") == RATE_LIMITS)
    wait_until(lambda: status()["paced"].get("rate_limit_source") == "leader", 30,
               "the live cache to read the leader's limits")
    queues = status()
    assert queues["paced"]["rate_limit"] == "5/s"
    assert queues["paced"]["rate_limit_here"] == "10/s"
    assert queues["trickle"]["rate_limit"] == "1/h" and queues["trickle"]["rate_limit_differs"]
    assert queues["trickle"]["rate_limit_here"] is None
    assert queues["emails"]["rate_limit"] is None  # limited here only: not by the leader
    assert queues["emails"]["rate_limit_here"] == "100/m"
    assert not queues["default"].get("rate_limit_differs")

    out = io.StringIO()
    call_command("zktasks", "status", stdout=out)
    text = out.getvalue()
    row = next(line for line in text.splitlines() if line.split()[:1] == ["paced"])
    assert row.split()[-2:] == ["5/s*", "(10/s)"]
    assert "are the leader's, not this process's RATE_LIMITS" in text


def test_limits_that_cannot_be_written_cost_the_leader_nothing(
        backend, start_worker, zk_client, caplog):
    """The write is for display only. Refused by an ACL set by hand on `ratelimits`, it
    ended the term as if the election znode were gone: the worker won again, failed
    again, 68 times in 15 s in a review's probe, and no job was ever handed out."""
    import logging

    from kazoo.security import ACL, Id, Permissions

    caplog.set_level(logging.INFO, logger="zktasks")
    path = backend.store.layout.ratelimits
    zk_client.ensure_path(path)
    zk_client.set_acls(path, [ACL(Permissions.ALL & ~Permissions.WRITE, Id("world", "anyone"))])
    worker = start_worker(queues=["default"], concurrency=1)
    assert tasks.add.submit(1, 2).wait(timeout=60).return_value == 3
    assert worker.leader.is_leader
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "leadership lost" in m]
    assert [m for m in messages if "could not write the rate limits" in m
            and "NoAuth" in m] != []


def test_limits_that_cannot_be_read_leave_the_overview_whole(
        backend, start_worker, zk_client):
    """Read with the leader, an unreadable `ratelimits` (an ACL) failed the dashboard's
    whole live read: no workers, no leader, "ZooKeeper refused the read"."""
    from kazoo.security import ACL, Id, Permissions

    from zktasks import dashboard

    path = backend.store.layout.ratelimits
    zk_client.ensure_path(path)
    zk_client.set_acls(path, [ACL(Permissions.ALL & ~Permissions.READ, Id("world", "anyone"))])
    try:
        start_worker(queues=["default"], concurrency=1)
        assert tasks.add.submit(1, 2).wait(timeout=60).return_value == 3
        state = dashboard.live_state(backend)
        wait_until(lambda: state.snapshot()["leader"] is not None, 30,
                   "the leader on the overview")
        snapshot = state.snapshot()
        assert snapshot["ok"] and snapshot["workers"]
        assert snapshot["leader"]["rate_limits"] is None
        rows = {q["name"]: q
                for q in dashboard.with_rate_limits(snapshot, backend.conf)["queues"]}
        assert rows["paced"]["rate_limit"] == "5/s"
        assert rows["paced"]["rate_limit_source"] == "settings"
    finally:
        # Unreadable, its children cannot be listed: the root's teardown could not
        # delete the tree.
        zk_client.set_acls(path, [ACL(Permissions.ALL, Id("world", "anyone"))])
