"""Sharded delayed jobs (tree.LAYOUT: delayed/{due_minute}/{second}/{name}) on a real
ZooKeeper: where a job waits, promotion across shards, empty shards swept once past, the
migration of flat delayed/ trees, and the dashboard's counts."""

from datetime import timedelta

from django.utils import timezone

from tests import tasks
from tests.pending import delayed_nodes
from tests.waiting import wait_for_children
from zktasks.tree import delayed_node_name, delayed_shards, is_delayed_shard, job_second


def test_a_delayed_job_waits_in_its_due_minute_and_submission_second(backend, zk_client):
    when = timezone.now() + timedelta(hours=2)
    job = tasks.add.using(run_after=when).submit(1, 2)
    layout = backend.store.layout
    [minute] = zk_client.get_children(layout.delayed)
    [second] = zk_client.get_children(layout.delayed_minute(minute))
    [name] = zk_client.get_children(layout.delayed_shard(minute, second))
    assert int(minute) == int(when.timestamp()) // 60 * 60
    assert int(second) == job_second(job.id)
    assert delayed_shards(name) == (minute, second) and job.id in name


def test_jobs_due_soon_all_run_and_leave_no_delayed_node(backend, start_worker, zk_client):
    """Twelve jobs due within two seconds (one or two due minutes) are promoted and run."""
    start_worker(concurrency=4)
    now = timezone.now()
    soon = [tasks.add.using(run_after=now + timedelta(seconds=0.5 + n * 0.1)).submit(n, 1)
            for n in range(12)]
    assert [r.wait(timeout=60).return_value for r in soon] == [n + 1 for n in range(12)]
    assert delayed_nodes(zk_client, backend.store.layout) == []


def test_an_empty_past_minute_is_swept(backend, start_worker, zk_client):
    layout = backend.store.layout
    store = backend.store
    store.ensure_skeleton()
    past = f"{(int(timezone.now().timestamp()) - 3600) // 60 * 60:010d}"
    zk_client.create(layout.delayed_shard(past, "1700000000"), b"", makepath=True)
    future = f"{(int(timezone.now().timestamp()) + 3600) // 60 * 60:010d}"
    zk_client.create(layout.delayed_minute(future), b"")
    start_worker()
    # Watched: the past minute goes (its empty shard first); the future one stays.
    wait_for_children(zk_client, layout.delayed, lambda c: past not in c)
    assert zk_client.exists(layout.delayed_minute(future))


def test_a_flat_delayed_tree_is_migrated_by_the_leader(backend, start_worker, zk_client):
    """Delayed jobs written directly in delayed/ (older versions) are moved into their
    shards by the leader and run when due; a cancel finds a flat one too."""
    store = backend.store
    layout = store.layout
    store.ensure_skeleton()
    when = timezone.now() + timedelta(seconds=1)
    flat = []
    for n in range(5):
        record, result = backend.prepare(tasks.add.using(run_after=when), (n, n), {})
        name = delayed_node_name(int(when.timestamp() * 1000), record.priority, record.id,
                                 record.queue)
        zk_client.create(layout.status(record.id), record.to_bytes())
        zk_client.create(layout.unsharded_delayed_job(name), b"")
        flat.append(result)
    assert backend.cancel(flat[0].id) is True  # found in its old place
    start_worker()
    assert [r.wait(timeout=60).return_value for r in flat[1:]] == [2, 4, 6, 8]
    assert all(is_delayed_shard(n) for n in zk_client.get_children(layout.delayed))


def test_the_dashboard_counts_and_lists_delayed_jobs_across_shards(backend, zk_client):
    from tests.waiting import wait_until
    from zktasks import dashboard

    now = timezone.now()
    jobs = [tasks.add.using(run_after=now + timedelta(minutes=m)).submit(m, 0)
            for m in (5, 65, 125)]
    mail = tasks.email.using(run_after=now + timedelta(minutes=6)).submit("a@b.c")
    reader = dashboard.Reader(backend)
    page = reader.delayed(limit=2)
    assert page.total == 4
    assert [r.id for r in page.rows] == [jobs[0].id, mail.id]  # the first due first
    rest = reader.delayed(after=page.next_cursor, limit=10)
    assert [r.id for r in rest.rows] == [jobs[1].id, jobs[2].id]
    assert reader.delayed("emails").total == 1

    # A page lists only the due minutes it needs: it stops at the minute that brings
    # one name more than the page holds; the filtered total is known only once the
    # walk reached the end.
    listed = []
    real = reader.client.get_children_async

    def counted(path, *args, **kwargs):  # counts, and goes on to the real server
        listed.append(path)
        return real(path, *args, **kwargs)

    reader.client.get_children_async = counted
    try:
        page = reader.delayed(limit=1)
        assert [r.id for r in page.rows] == [jobs[0].id] and page.total == 4
        depth = backend.store.layout.delayed.count("/") + 2
        shards = {p for p in listed if p.count("/") == depth}
        # jobs[0]'s minute, then mail's (one more name, to know a next page exists);
        # not the minutes an hour and two hours on.
        assert len(shards) == 2 and page.next_cursor
        page = reader.delayed("default", after=page.next_cursor, limit=1)
        assert [r.id for r in page.rows] == [jobs[1].id] and page.total is None
    finally:
        reader.client.get_children_async = real

    state = dashboard.live_state(backend)
    wait_until(lambda: state.snapshot()["totals"]["delayed"] == 4, 60, "counts")
    counts = {q["name"]: q["delayed"] for q in state.snapshot()["queues"]}
    assert counts == {"default": 3, "emails": 1}
    # A job leaving a shard that stays (no leader runs here to sweep it) fires no watch
    # the cache holds: the poll sees the shard's cversion move and lists that shard.
    assert backend.cancel(mail.id) is True
    assert len(delayed_nodes(zk_client, backend.store.layout)) == 3
    wait_until(lambda: state.snapshot()["totals"]["delayed"] == 3, 60, "the new count")
    counts = {q["name"]: q["delayed"] for q in state.snapshot()["queues"]}
    assert counts["default"] == 3 and not counts.get("emails")


def test_more_due_jobs_than_the_leader_loads_at_once_all_run(backend, start_worker,
                                                             zk_client, monkeypatch):
    """The leader holds at most DELAYED_LOAD due names; moving them fires the watches
    that bring it back for the rest."""
    from zktasks import leader

    monkeypatch.setattr(leader, "DELAYED_LOAD", 5)
    due = timezone.now() + timedelta(seconds=1)
    jobs = tasks.add.using(run_after=due).submit_many([((n, 1), {}) for n in range(23)])
    start_worker(concurrency=4)
    assert [r.wait(timeout=60).return_value for r in jobs] == [n + 1 for n in range(23)]
    assert delayed_nodes(zk_client, backend.store.layout) == []


def test_a_filtered_delayed_page_looks_at_a_bounded_number_of_names(backend):
    """A queue filter matching one job among many: each page lists at most the minutes
    that bring its budget of names, says how many it looked at, and the cursor walks on
    until the match, never showing a job twice."""
    from zktasks import dashboard

    now = timezone.now()
    others = [tasks.add.using(run_after=now + timedelta(minutes=m)).submit(m, 0)
              for m in (5, 5, 6, 6, 7, 7)]
    mail = tasks.email.using(run_after=now + timedelta(minutes=20)).submit("a@b.c")
    reader = dashboard.Reader(backend)
    assert reader.delayed("emails").rows[0].id == mail.id  # the default budget: one page

    pages, after = [], None
    while True:
        page = reader.delayed("emails", after=after, budget=2)
        pages.append(page)
        if page.exhausted:
            break
        assert page.next_cursor and page.next_cursor != after and len(pages) < 10
        after = page.next_cursor
    # Minutes 5, 6 and 7 hold two names each: a page per minute, nothing matched, then
    # the mail's minute, which ends the walk.
    assert [p.scanned for p in pages[:-1]] == [2, 2, 2]
    assert all(not p.rows and p.total is None for p in pages[:-1])
    assert [r.id for r in pages[-1].rows] == [mail.id]
    # Unfiltered, a page fills before a budget over its size runs out.
    page = reader.delayed(limit=3, budget=4)
    assert len(page.rows) == 3 and {r.id for r in page.rows} <= {o.id for o in others[:4]}
    assert page.total == 7 and not page.exhausted and page.scanned == 0
