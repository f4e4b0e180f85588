"""Sharded pending jobs (tree.LAYOUT: jobs/{queue}/{shard}/{job_node}) on a real ZooKeeper:
order across shards, long backlogs, empty-shard sweeps racing submits, submit_many, the
migration of unsharded trees."""

import os
import secrets
import threading
import time

import pytest
from kazoo.exceptions import NoNodeError

from tests import tasks
from tests.conftest import use_zookeeper
from tests.pending import pending_nodes
from tests.waiting import wait_for_deletion, wait_until
from zktasks import SerializationError
from zktasks.leader import Leader
from zktasks.store import BULK_JOBS, failures
from zktasks.tree import job_node_name, parse_shard, shard_name

NOW_MS = int(time.time() * 1000)


def job_id_at(ms: int, counter: int = 0) -> str:
    """A job id as new_job_id() makes them, for a chosen submission time."""
    return f"{ms:012x}{counter:04x}{secrets.token_hex(8)}"


def submit_at(backend, task, ms, *args, counter=0):
    record, result = backend.prepare(task, args, {}, job_id=job_id_at(ms, counter))
    backend.write(record, result)
    return result


def marks(marker_dir) -> dict[int, int]:
    runs: dict[int, int] = {}
    for name in os.listdir(marker_dir):
        number = int(name.split("-", 1)[0])
        runs[number] = runs.get(number, 0) + 1
    return runs


def test_shard_names_sort_like_the_jobs_inside():
    ids = [job_id_at(NOW_MS - 5000), job_id_at(NOW_MS), job_id_at(NOW_MS + 3000)]
    nodes = [job_node_name(p, i) for p in (5, 0, -5) for i in ids]
    assert sorted(nodes, key=lambda n: (shard_name(100 - int(n[:3]), n[4:]), n)) == sorted(nodes)
    assert parse_shard(shard_name(7, ids[1])) == (7, NOW_MS // 1000)
    assert parse_shard(job_node_name(7, ids[1])) is None  # a job is never taken for a shard


def test_order_across_shards_is_priority_then_fifo(backend, start_worker, tmp_path):
    """Jobs in many shards (three priorities, seconds apart, submitted out of order) run
    highest priority first, then oldest first, one at a time."""
    low = tasks.mark.using(priority=-10)
    high = tasks.mark.using(priority=10)
    expected = []
    plan = [(tasks.mark, NOW_MS - 30_000, 0), (low, NOW_MS - 60_000, 0),
            (high, NOW_MS - 5_000, 1), (tasks.mark, NOW_MS - 40_000, 1),
            (high, NOW_MS - 50_000, 0), (low, NOW_MS - 20_000, 1),
            (tasks.mark, NOW_MS - 40_000, 0)]
    results = []
    for number, (task, ms, counter) in enumerate(plan):
        results.append(submit_at(backend, task, ms, str(tmp_path), number, counter=counter))
        expected.append((-task.priority, ms, counter, number))
    layout = backend.store.layout
    assert len(backend.store.children(layout.queue("default"))) == 6  # shards
    start_worker(concurrency=1, prefetch=0)
    done = [r.wait(timeout=60) for r in results]
    order = [r.return_value for r in sorted(done, key=lambda r: r.started_at)]
    assert order == [number for *_, number in sorted(expected)]


def test_a_backlog_spanning_many_shards_drains(backend, start_worker, tmp_path):
    """1,200 jobs over 240 shards (seconds) and two priorities: every job runs, and the
    leader deletes the emptied shards (they are all old)."""
    records = []
    for n in range(1200):
        task = tasks.mark.using(priority=n % 2)
        record, _ = backend.prepare(task, (str(tmp_path), n), {},
                                    job_id=job_id_at(NOW_MS - 600_000 + (n // 10) * 1000, n))
        records.append(record)
    batches = backend.store.submit_many(records)
    assert batches >= 1200 // BULK_JOBS + 1  # bounded by jobs and by bytes
    layout = backend.store.layout
    assert len(backend.store.children(layout.queue("default"))) == 240
    leader_worker = start_worker(concurrency=8, prefetch=20)
    start_worker(concurrency=8, lead=False)
    wait_until(lambda: len(marks(tmp_path)) == 1200, 120, "every job to run")
    wait_until(lambda: backend.store.children(layout.queue("default")) == [], 30,
               "the empty shards to be swept")
    assert pending_nodes(backend.store.client, layout) == []
    leader = leader_worker.leader
    assert leader.max_listed <= 240  # the shard list; never the 1,200 jobs at once


def test_an_empty_old_shard_swept_while_submits_race_into_it(backend, start_worker, tmp_path,
                                                             zk_client, monkeypatch):
    """The leader deletes an old shard once it is empty and SHARD_GRACE past its creation,
    while submitters keep putting jobs with that second into it: each submit lands
    before the delete (NotEmpty), or meets NoNode and makes the shard again. Two rounds
    of three racing submitters, the shard swept after each: no job is lost, none fails
    to submit, and the second round remakes the shard. (The shard goes along with an
    assignment, or alone 1-3 s after it may once no job comes: SWEEP_ALIGN 2 s.)"""
    monkeypatch.setattr("zktasks.leader.SWEEP_ALIGN", 2.0)
    start_worker(concurrency=4)
    old_ms = NOW_MS - 120_000
    layout = backend.store.layout
    shard = layout.shard("default", shard_name(0, job_id_at(old_ms)))
    submitted = []
    errors = []

    def submitter(offset):
        try:
            for i in range(30):
                submitted.append(submit_at(backend, tasks.mark, old_ms + 1, str(tmp_path),
                                           offset + i, counter=offset + i))
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    # Before the submitters start: an empty shard of that second.
    backend.store.client.ensure_path(shard)
    for round_ in range(2):
        # Each round's own sweep, not one left over from the round before (a shard swept
        # mid-round and made again counted twice): the shard is there when the round's
        # submits start (made above, or by them in the second round), and gone once its
        # jobs ran, so swept after the round's last submit.
        assert (zk_client.exists(shard) is None) == (round_ == 1)
        threads = [threading.Thread(target=submitter, args=(round_ * 10_000 + k * 1000,))
                   for k in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        for result in submitted:
            assert result.wait(timeout=60).status == "SUCCESSFUL"
        wait_for_deletion(zk_client, shard, timeout=60)
    assert sorted(marks(tmp_path)) == sorted(r.return_value for r in submitted)
    assert len(submitted) == 180


def test_submit_many_writes_thousands_in_batched_multis(backend, start_worker, tmp_path,
                                                        zk_client):
    results = tasks.mark.submit_many([((str(tmp_path), n), {}) for n in range(3000)])
    assert len(results) == 3000 and len({r.id for r in results}) == 3000
    layout = backend.store.layout
    assert len(pending_nodes(zk_client, layout)) == 3000
    assert all(zk_client.exists(layout.status(r.id)) for r in results[::97])
    start_worker(concurrency=8, prefetch=20)
    wait_until(lambda: len(marks(tmp_path)) == 3000, 180, "every job to run")
    assert results[-1].wait(timeout=30).return_value == 2999


def test_submit_many_writes_nothing_when_one_call_is_bad(backend, zk_client, tmp_path):
    calls = [((str(tmp_path), n), {}) for n in range(1500)]
    calls[1234] = ((str(tmp_path), (i for i in range(3))), {})  # cannot be pickled
    with pytest.raises(SerializationError) as caught:
        tasks.mark.submit_many(calls)
    assert "item 1234" in "".join(caught.value.__notes__)
    layout = backend.store.layout
    assert pending_nodes(zk_client, layout) == []
    assert not zk_client.exists(layout.status_dir) or zk_client.get_children(
        layout.status_dir) == []
    with pytest.raises(Exception, match="unique"):
        tasks.mark.using(unique_key="k").submit_many([((str(tmp_path), 1), {})])


def test_a_tree_from_before_sharding_is_migrated_by_the_leader(backend, start_worker,
                                                              tmp_path, zk_client):
    """Pending jobs written flat in jobs/{queue} (older versions) are moved into shards
    by the leader, then run; a cancel finds a flat job too."""
    store = backend.store
    layout = store.layout
    store.ensure_queue("default")
    flat = []
    for n in range(30):
        record, result = backend.prepare(tasks.mark, (str(tmp_path), n), {})
        zk_client.create(layout.status(record.id), record.to_bytes())
        zk_client.create(layout.unsharded_job("default", job_node_name(0, record.id)),
                         store.job_data(record))
        flat.append(result)
    assert backend.cancel(flat[0].id) is True  # found in its old place
    start_worker(concurrency=4)
    for result in flat[1:]:
        assert result.wait(timeout=60).status == "SUCCESSFUL"
    assert sorted(marks(tmp_path)) == list(range(1, 30))
    assert all(parse_shard(n) for n in zk_client.get_children(layout.queue("default")))


def test_the_leader_reads_only_the_shards_it_needs(backend, zk_client):
    """With 2,000 pending jobs in 20 shards and no free capacity beyond one batch, the
    leader lists the shard names and the first shard or two, not the backlog."""
    records = []
    for n in range(2000):
        record, _ = backend.prepare(tasks.add, (n, n), {},
                                    job_id=job_id_at(NOW_MS - 100_000 + (n // 100) * 1000, n))
        records.append(record)
    backend.store.submit_many(records)
    stop = threading.Event()
    leader = Leader(backend.store, "reader", stop=stop)
    assert leader.contend()
    try:
        leader._tick()
    finally:
        leader._release()
    assert leader.max_listed == 100  # one shard's worth (the shard list has 20 names)
    assert sum(len(v) for v in leader.loaded["default"].values()) == 100
    assert len(leader.shards["default"]) == 20


def test_the_dashboards_pending_pages_walk_the_shards(backend):
    """The pending page lists only the shards holding the page; its total comes from the
    shards' stats; the cursor carries on across shards in assignment order."""
    from zktasks.dashboard import Reader

    records = []
    for n in range(25):
        task = tasks.add.using(priority=(5 if n % 5 == 0 else 0))
        record, _ = backend.prepare(task, (n, n), {},
                                    job_id=job_id_at(NOW_MS - 50_000 + (n // 5) * 1000, n))
        records.append(record)
    backend.store.submit_many(records)
    expected = sorted(job_node_name(r.priority, r.id) for r in records)
    reader = Reader(backend, client=backend.store.client)
    seen, after = [], None
    while True:
        page = reader.pending("default", after=after, limit=7)
        assert page.total == 25
        seen.extend(row.note for row in page.rows)
        if page.exhausted:
            break
        after = page.next_cursor
    assert seen == expected


def test_a_job_whose_shard_someone_else_made_again_is_sent_again(backend, zk_client):
    """A multi that meets NoNode on a pending job is sent again once the shard is there,
    whoever made it: here the first multi deletes the shard itself before its create,
    so the shard exists again (rolled back) when the submitter goes to make it."""
    store = backend.store
    store.ensure_queue("default")
    record, _ = backend.prepare(tasks.add, (1, 2), {}, job_id=job_id_at(NOW_MS - 90_000))
    job_path = store.waiting_path(record)
    shard = job_path.rsplit("/", 1)[0]
    zk_client.create(shard)
    sends = []

    def build(txn):
        sends.append(len(sends))
        if len(sends) == 1:
            txn.delete(shard)
        txn.create(job_path, b"")

    assert failures(store.with_shards(build, [job_path])) == []
    assert len(sends) == 2
    assert zk_client.exists(job_path)


def test_a_nonode_on_another_path_is_the_callers(backend, zk_client):
    """NoNode on an op that is not a pending job's create (an assignment taken back) is
    returned at once: no shard made, nothing sent again."""
    store = backend.store
    store.ensure_queue("default")
    record, _ = backend.prepare(tasks.add, (1, 2), {}, job_id=job_id_at(NOW_MS - 80_000))
    job_path = store.waiting_path(record)
    gone = store.layout.assignment("nobody", record.id)
    sends = []

    def build(txn):
        sends.append(1)
        txn.delete(gone)
        txn.create(job_path, b"")

    failed = failures(store.with_shards(build, [job_path]))
    assert failed[0][0] == 0 and isinstance(failed[0][1], NoNodeError)
    assert len(sends) == 1
    assert zk_client.exists(job_path.rsplit("/", 1)[0]) is None


def test_the_leader_keeps_a_new_shard_of_an_old_second_for_a_grace(backend, zk_client,
                                                                     monkeypatch):
    """An empty shard of a second long past, made just now (a late clock, a retried
    submit), is kept SHARD_GRACE after its creation, so its submitter's job lands in it;
    then it is swept."""
    # Longer than the default 2 s: the first tick below must come within the grace,
    # after a leader election, on a machine that may be loaded.
    grace = 6.0
    monkeypatch.setattr("zktasks.leader.SHARD_GRACE", grace)
    monkeypatch.setattr("zktasks.leader.SWEEP_ALIGN", 2.0)  # due 1-3 s after, not 5-15
    store = backend.store
    store.ensure_queue("default")
    shard = store.layout.shard("default", shard_name(0, job_id_at(NOW_MS - 300_000)))
    zk_client.create(shard)
    created = zk_client.exists(shard).ctime / 1000
    leader = Leader(store, "sweeper", stop=threading.Event())
    assert leader.contend()
    try:
        leader._tick()
        assert zk_client.exists(shard) is not None
        assert leader._sweep_at >= created + grace
        # A deadline, not a synchronisation: the grace is measured on the clock.
        time.sleep(max(0.0, leader._sweep_at - time.time()))
        leader._tick()
        assert zk_client.exists(shard) is None
    finally:
        leader._release()


def test_empty_shards_go_together_in_one_transaction_on_an_aligned_second(
        settings, monkeypatch, own_server, zk_root):
    """Jobs one a second each open a shard; deleting each emptied one alone was a fourth
    write transaction per job. Empty shards become deletable on multiples of SWEEP_ALIGN
    and go in one fenced multi: five old ones, one transaction. A server of the test's
    own, so that the zxids between two markers count the leader's writes only."""
    from django.tasks import task_backends

    import zktasks.leader as leader_module

    monkeypatch.setattr(leader_module, "SHARD_GRACE", 0.0)
    monkeypatch.setattr(leader_module, "SWEEP_ALIGN", 2.0)
    use_zookeeper(settings, monkeypatch, own_server.hosts, zk_root, CONNECT_TIMEOUT=60.0)
    store = task_backends["default"].store
    store.ensure_queue("default")
    layout = store.layout
    leader = Leader(store, "sweeper", stop=threading.Event())
    assert leader.contend()
    try:
        leader._tick()  # the term's first writes (buckets taken up), before the shards
        shards = [shard_name(0, job_id_at(NOW_MS - 300_000 + k * 1000)) for k in range(5)]
        for shard in shards:
            store.raw_client.create(layout.shard("default", shard))
        leader.mark("*")  # whether or not the queue's watch fired yet
        # The leader dates each shard from the tick that first lists it, and a shard
        # seen at T is due at the first multiple of 2 s at least 1 s after T: a tick
        # straddling an odd second (a loaded machine, the other half of `make test`)
        # made two due times, and two multis. Begun just past an odd second, the tick
        # has almost 2 s to list them all (a clock alignment, not a synchronisation).
        time.sleep((1.02 - time.time() % 2.0) % 2.0)
        leader._tick()
        deadline = leader._sweep_at
        if deadline is not None:  # made just before a multiple of 2 s: kept till then
            assert deadline % 2.0 == 0
            assert all(store.raw_client.exists(layout.shard("default", s)) for s in shards)
            # A deadline, not a synchronisation: the alignment is on the clock.
            time.sleep(max(0.0, deadline - time.time()))
        before = store.raw_client.create(f"{zk_root}-marker-", sequence=True)
        leader._tick()
        after = store.raw_client.create(f"{zk_root}-marker-", sequence=True)
        assert store.raw_client.get_children(layout.queue("default")) == []
        zxids = [store.raw_client.exists(path).czxid for path in (before, after)]
        assert zxids[1] - zxids[0] == 2  # the markers' own and one between
    finally:
        leader._release()


def test_empty_old_shards_ride_in_the_next_assignment_multi(settings, monkeypatch,
                                                            own_server, zk_root,
                                                            start_worker):
    """With a job to hand out, the empty shards old enough to delete go in its
    assignment multi, at no transaction of their own: the queue's last change of
    children is the transaction that took the job's node out of its shard. A server of
    the test's own, so that no other test's leader sweeps there."""
    from django.tasks import task_backends

    import zktasks.leader as leader_module

    monkeypatch.setattr(leader_module, "SHARD_GRACE", 0.0)
    # The next multiple of 1e9 s is in 2033: no shard goes in a multi of its own here.
    monkeypatch.setattr(leader_module, "SWEEP_ALIGN", 1e9)
    use_zookeeper(settings, monkeypatch, own_server.hosts, zk_root, CONNECT_TIMEOUT=60.0)
    store = task_backends["default"].store
    store.ensure_queue("default")
    layout, client = store.layout, store.raw_client
    old = [shard_name(tasks.add.priority, job_id_at(NOW_MS - 500_000 + k * 1000))
           for k in range(3)]
    for shard in old:
        client.create(layout.shard("default", shard))
    start_worker(concurrency=1)
    result = tasks.add.submit(1, 2)
    assert result.wait(timeout=30).return_value == 3
    own = shard_name(tasks.add.priority, result.id)
    assert client.get_children(layout.queue("default")) == [own]
    assert client.exists(layout.queue("default")).pzxid == client.exists(
        layout.shard("default", own)).pzxid


def test_a_riding_shard_a_job_landed_in_does_not_hold_up_the_assignment(
        backend, start_worker, zk_client, monkeypatch):
    """The leader saw a shard empty and sent its delete along with an assignment, but a
    job had landed in it meanwhile (its watch not yet taken up: held back here): the
    multi fails on that shard (NotEmpty), the batch goes again without it at once, and
    the shard is listed again, its job handed out next."""
    import zktasks.leader as leader_module

    monkeypatch.setattr(leader_module, "SHARD_GRACE", 0.0)
    monkeypatch.setattr(leader_module, "SWEEP_ALIGN", 1e9)  # none goes alone (till 2033)
    store, layout = backend.store, backend.store.layout
    store.ensure_queue("default")
    old_ms = NOW_MS - 600_000
    shard = shard_name(tasks.add.priority, job_id_at(old_ms))
    key = f"s:default/{shard}"
    zk_client.create(layout.shard("default", shard))
    start_worker(concurrency=2, lead=False)
    leader = Leader(store, "sweeper", stop=threading.Event())
    assert leader.contend()
    try:
        leader._tick()
        assert leader.loaded["default"][shard] == []
        landed = submit_at(backend, tasks.add, old_ms + 1, 20, 1)  # into the old shard
        fresh = tasks.add.submit(1, 2)  # into a new one
        wait_until(lambda: key in leader._dirty and "q:default" in leader._dirty, 30,
                   "the watches on the old shard and on the queue to fire")
        with leader._dirty_lock:
            leader._dirty.discard(key)  # a watch not yet taken up when the leader plans
        leader._tick()
        assert fresh.wait(timeout=30).return_value == 3
        assert zk_client.exists(layout.shard("default", shard)) is not None
        assert key in leader._dirty  # listed again next tick
        leader._tick()
        assert landed.wait(timeout=30).return_value == 21
    finally:
        leader._release()


def test_deleting_empty_shards_keeps_one_a_job_landed_in(backend, zk_client):
    """A job landed in a shard between the leader's listing and its delete: the multi
    fails on that shard (NotEmpty) and goes again without it; one already gone counts as
    gone; a gone fence raises NoNodeError, deleting nothing."""
    store, layout = backend.store, backend.store.layout
    store.ensure_queue("default")
    shards = [shard_name(0, job_id_at(NOW_MS - 400_000 + k * 1000)) for k in range(4)]
    for shard in shards[:3]:
        zk_client.create(layout.shard("default", shard))
    landed = job_node_name(0, job_id_at(NOW_MS - 399_000))
    assert shard_name(0, landed.split("-", 1)[1]) == shards[1]
    zk_client.create(layout.shard_child("default", shards[1], landed))
    fence = zk_client.create(f"{layout.root}/fence-", ephemeral=True, sequence=True)
    pairs = [("default", shard) for shard in shards]
    with pytest.raises(NoNodeError):
        store.delete_shards(fence + "-gone", pairs)
    assert sorted(zk_client.get_children(layout.queue("default"))) == sorted(shards[:3])
    assert store.delete_shards(fence, pairs) == {pairs[0], pairs[2], pairs[3]}
    assert zk_client.get_children(layout.queue("default")) == [shards[1]]
    assert zk_client.get_children(layout.shard("default", shards[1])) == [landed]


def test_deleting_paths_counts_its_own_and_steps_over_those_it_cannot(backend, zk_client):
    """`delete_paths` (dead-letter expiry) sends its multis as `delete_shards` does: one
    already gone, or not empty, is left out and the rest sent again; the count is of
    the znodes this call deleted. Without a fence, and with one."""
    store, root = backend.store, backend.store.layout.root
    store.ensure_queue("default")  # the root, and the skeleton under it
    paths = [f"{root}/doomed-{k}" for k in range(4)]
    for path in paths[:2] + paths[3:]:
        zk_client.create(path)
    assert store.delete_paths(None, paths) == 3
    assert not any(zk_client.exists(path) for path in paths)
    for path in paths:
        zk_client.create(path)
    zk_client.create(f"{paths[1]}/child")
    fence = zk_client.create(f"{root}/fence-", ephemeral=True, sequence=True)
    assert store.delete_paths(fence, paths) == 3
    assert [path for path in paths if zk_client.exists(path)] == [paths[1]]


def test_a_job_in_another_shard_than_its_name_s_is_moved_aside_not_spun_on(
        backend, start_worker, zk_client):
    """Assigning deletes the path a job's name gives; a node put by hand in an older
    shard made that multi fail on every try, with every job planned beside it, while the
    leader re-listed and re-sent without pause. It is moved aside (and can be re-queued
    from there to its right place); the others run."""
    layout = backend.store.layout
    record, misplaced_result = backend.prepare(tasks.add, (20, 1), {},
                                               job_id=job_id_at(NOW_MS - 120_000))
    node = job_node_name(record.priority, record.id)
    wrong_shard = shard_name(record.priority, job_id_at(NOW_MS - 180_000))
    path = layout.shard_child("default", wrong_shard, node)
    backend.store.ensure_queue("default")
    zk_client.create(layout.status(record.id), record.to_bytes())
    zk_client.create(path, b"", makepath=True)
    start_worker(concurrency=2)
    others = [tasks.add.submit(n, 1) for n in range(4)]
    assert [r.wait(timeout=30).return_value for r in others] == [1, 2, 3, 4]
    wait_until(lambda: zk_client.exists(path) is None, 30, "the misplaced node moved aside")
    [letter] = [e for e in backend.dead_letters(50) if e.path == path]
    assert letter.kind == "misplaced_job" and letter.job_id == record.id
    assert shard_name(record.priority, record.id) in letter.reason
    assert backend.requeue_dead_letter(letter.name) == record.id
    assert misplaced_result.wait(timeout=30).return_value == 21


def test_shards_swept_when_first_seen_leave_nothing_behind_in_the_leader(
        backend, zk_client, monkeypatch):
    """Empty shards (a backlog cancelled, say) listed for the first time and swept at
    once: the leader kept three entries per shard for the rest of its term."""
    import zktasks.leader as leader_module

    monkeypatch.setattr(leader_module, "SHARD_GRACE", 0.0)
    monkeypatch.setattr(leader_module, "SWEEP_ALIGN", 0.0)  # at once, not on a multiple
    layout = backend.store.layout
    backend.store.ensure_queue("default")
    shards = [shard_name(0, job_id_at(NOW_MS - 300_000 + k * 1000)) for k in range(5)]
    for shard in shards:
        zk_client.create(layout.shard("default", shard), b"", makepath=True)
    stop = threading.Event()
    leader = Leader(backend.store, "sweeper", stop=stop)
    try:
        assert leader.contend()
        leader._tick()
        assert zk_client.get_children(layout.queue("default")) == []
        keys = {f"s:default/{shard}" for shard in shards}
        assert not keys & set(leader._born), leader._born
        assert not keys & set(leader._listed_at)
        assert not keys & set(leader._watch_fns)
    finally:
        stop.set()
        leader.cancel()
        leader._release()


def test_a_job_into_a_new_shard_makes_it_in_its_own_transaction(backend, zk_client):
    """At low load nearly every job opens a new second's shard: the submit multi creates
    it (one transaction) rather than failing on it, creating it, and going again."""
    layout = backend.store.layout
    ms = NOW_MS + 86_400_000  # a second no other job of this test is in
    result = submit_at(backend, tasks.add, ms, 1, 2)
    node = job_node_name(result.task.priority, result.id)
    shard = layout.shard("default", shard_name(result.task.priority, result.id))
    assert zk_client.exists(shard).czxid == zk_client.exists(f"{shard}/{node}").czxid
    assert pending_nodes(zk_client, layout) == [node]


def test_a_shard_made_by_someone_else_between_the_read_and_the_multi(backend, zk_client,
                                                                     monkeypatch):
    """The shard looked missing, then another submitter made it: the multi that would
    have made it again fails on it (NodeExists) and is sent again without it; the job is
    written once, and the caller sees its own ops' results only."""
    store, layout = backend.store, backend.store.layout
    ms = NOW_MS + 2 * 86_400_000
    # The shard of any job of that second and of the task's priority.
    shard = layout.shard("default", shard_name(tasks.add.priority, job_id_at(ms)))
    missing = store._missing_shards

    def made_meanwhile(waiting):
        found = missing(waiting)
        assert found == [shard]
        zk_client.create(shard, b"", makepath=True)
        return found

    monkeypatch.setattr(store, "_missing_shards", made_meanwhile)
    result = submit_at(backend, tasks.add, ms, 3, 4)
    node = job_node_name(result.task.priority, result.id)
    assert zk_client.exists(shard).czxid < zk_client.exists(f"{shard}/{node}").czxid
    assert pending_nodes(zk_client, layout) == [node]
    assert backend.get_result(result.id).status == "READY"
