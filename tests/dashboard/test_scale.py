"""100,000 finished jobs: the results pages, the overview and the live endpoint stay
cheap. "Cheap" is counted, not timed: the ZooKeeper requests a page makes (through a
counting wrapper around the dashboard's real client) are bounded by the page, never by
the number of records. Page times are bench/ material, not test assertions."""

import random
import re
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest

from tests.dashboard.conftest import url
from tests.waiting import wait_until
from zktasks import records
from zktasks.dashboard import PAGE_SIZE, SCAN_BUDGET
from zktasks.records import ErrorRecord, StatusRecord
from zktasks.tree import finished_bucket, finished_entry, finished_leaf, new_job_id

RECORDS = 100_000
PER_BUCKET = 1_000
BATCH = 250          # jobs per multi (two creates each)
IN_FLIGHT = 8        # multis pipelined at once


def pipelined(client, builds):
    """Commit multis, IN_FLIGHT at a time; every op must succeed."""
    pending = []

    def drain(limit):
        while len(pending) > limit:
            results = pending.pop(0).get(timeout=60)
            failed = [r for r in results if isinstance(r, Exception)]
            assert not failed, failed[:3]

    for build in builds:
        txn = client.transaction()
        build(txn)
        pending.append(txn.commit_async())
        drain(IN_FLIGHT)
    drain(0)


@pytest.fixture(scope="module")
def big_tree(zookeeper, zk_hosts):
    """A ROOT holding RECORDS finished jobs in the finished index (10% failed)."""
    from kazoo.client import KazooClient

    from zktasks.testing import _delete_tree
    from zktasks.tree import Layout

    root = f"/zktasks-scale-{random.getrandbits(32):08x}"
    layout = Layout(root)
    client = KazooClient(hosts=zk_hosts, timeout=30)
    client.start(timeout=15)
    for path in layout.skeleton():
        client.ensure_path(path)
    start = records.now() - timedelta(hours=2)
    jobs = []  # (bucket, job_id, state)
    for n in range(RECORDS):
        finished = start + timedelta(seconds=10 * (n // PER_BUCKET), milliseconds=n % 5000)
        state = records.FAILED if n % 10 == 0 else records.SUCCESSFUL
        jobs.append((finished, new_job_id(), state))
    queues = ("default", "emails", "reports")

    def record(finished, job_id, state, n):
        errors = (ErrorRecord(exception_class_path="builtins.ValueError", message="bad",
                              traceback="Traceback...\nValueError: bad\n", attempt=1),) \
            if state == records.FAILED else ()
        return StatusRecord(
            id=job_id, task=f"app.tasks.task_{n % 7}", backend="default",
            queue=queues[n % 3], priority=0, state=state,
            enqueued_at=finished - timedelta(seconds=1), started_at=finished,
            finished_at=finished, last_attempted_at=finished, attempts=1,
            worker_ids=("w-1",), errors=errors,
        ).to_bytes()

    leaves = sorted({finished_leaf(int(f.timestamp() * 1000)) for f, _, _ in jobs})
    buckets = sorted({leaf.split("/")[0] for leaf in leaves})
    pipelined(client, [lambda txn, b=b: txn.create(layout.finished_bucket(b)) for b in buckets])
    pipelined(client, [lambda txn, b=b: txn.create(layout.finished_bucket(b)) for b in leaves])

    def builds():
        for first in range(0, RECORDS, BATCH):
            def build(txn, first=first):
                for n in range(first, min(first + BATCH, RECORDS)):
                    finished, job_id, state = jobs[n]
                    leaf = finished_leaf(int(finished.timestamp() * 1000))
                    txn.create(layout.status(job_id), record(finished, job_id, state, n))
                    txn.create(layout.finished_entry(
                        leaf, finished_entry(job_id, state, queues[n % 3])))
            yield build

    made = time.monotonic()
    pipelined(client, builds())
    made = time.monotonic() - made
    yield {"root": root, "jobs": jobs, "layout": layout, "made_in": made}

    # 200,000 znodes: delete them in pipelined multis (a recursive delete would take
    # minutes, one round trip each).
    def deletes():
        for first in range(0, RECORDS, BATCH):
            def build(txn, first=first):
                for n in range(first, min(first + BATCH, RECORDS)):
                    finished, job_id, state = jobs[n]
                    leaf = finished_leaf(int(finished.timestamp() * 1000))
                    txn.delete(layout.status(job_id))
                    txn.delete(layout.finished_entry(
                        leaf, finished_entry(job_id, state, queues[n % 3])))
            yield build

    try:
        pipelined(client, deletes())
    finally:
        client.stop()
        client.close()
        _delete_tree(zk_hosts, root)


@pytest.fixture
def big(settings, big_tree, zk_hosts):
    from tests.conftest import zk_tasks_setting

    settings.TASKS = zk_tasks_setting(zk_hosts, big_tree["root"])
    return big_tree


@pytest.fixture
def zk(big, monkeypatch):
    """Record the reads this thread makes through the dashboard's client, as (op, path).

    The wrapper only counts: every call goes on to the real client and server. Reads of
    the live cache's own thread are not counted (they are not the request's).
    """
    from django.tasks import task_backends

    from zktasks.dashboard import connect, live_state

    backend = task_backends["default"]
    client = connect(backend.conf, wait=15)
    # The totals on these pages come from the live cache, whose first refresh lists
    # every finished bucket; a page waits for it only briefly (snapshot(wait=1.5)), too
    # briefly on a loaded machine. Warm it first: what is counted here is reads, not time.
    state = live_state(backend, client)
    wait_until(lambda: state.snapshot()["totals"]["succeeded"] == 90_000, 120,
               "the live cache's first count of the 100,000 records")
    calls: list[tuple[str, str]] = []
    me = threading.current_thread()

    def counting(op):
        real = getattr(client, op)

        def counted(path, *args, **kwargs):
            if threading.current_thread() is me:
                calls.append((op.removesuffix("_async"), path))
            return real(path, *args, **kwargs)
        return counted

    for op in ("get_async", "get_children_async", "exists_async"):
        monkeypatch.setattr(client, op, counting(op))
    return calls


def fetch(client, path, zk):
    """GET a page; return it and a Counter of its reads by kind ("list status/" for a
    list of the status parent, which a results page must never make)."""
    zk.clear()
    response = client.get(path)
    assert response.status_code in (200, 302), (path, response.status_code)
    counts = Counter(op for op, _ in zk)
    counts["list status/"] = sum(1 for op, p in zk
                                 if op == "get_children" and p.endswith("/status"))
    return response, counts


def cheap(reads) -> bool:
    """A results page: one page of status records, finished/ and at most the four
    buckets of its first batch (each with up to ten seconds), never status/."""
    return (reads["list status/"] == 0 and reads["get"] == PAGE_SIZE
            and reads["get_children"] <= 1 + 4 * 11)


def ids(response):
    return re.findall(r'zk-id"><a href="/admin/zktasks/job/([0-9a-f]{32})/"',
                      response.content.decode())


def next_link(response):
    found = re.search(r'href="([^"]*)" id="zk-next"', response.content.decode())
    return found.group(1).replace("&amp;", "&") if found else None


def test_results_pages_read_one_page_of_records_with_100000_records(admin_client, big, zk):
    newest_first = sorted(big["jobs"], key=lambda j: (int(j[0].timestamp() * 1000) // 10_000,
                                                      j[1]), reverse=True)
    response, reads = fetch(admin_client, url("zktasks_job_changelist"), zk)
    assert cheap(reads)
    assert ids(response) == [j[1] for j in newest_first[:50]]
    assert "100000" in response.content.decode()  # the total, from the cached counts

    # Five pages on, each as cheap: the cursor skips newer buckets without listing them.
    link = next_link(response)
    for page in range(2, 7):
        response, reads = fetch(admin_client, link, zk)
        assert cheap(reads), page
        assert ids(response) == [j[1] for j in newest_first[(page - 1) * 50:page * 50]]
        link = next_link(response)

    # The oldest page, straight from a cursor near the end.
    bucket = finished_bucket(int(newest_first[-60][0].timestamp() * 1000))
    response, reads = fetch(admin_client, url("zktasks_job_changelist",
                                              cursor=f"{bucket}/{newest_first[-60][1]}"), zk)
    assert cheap(reads)
    assert ids(response) == [j[1] for j in newest_first[-59:][:50]]


def test_filters_and_search_read_a_bounded_number_of_records(admin_client, big, zk):
    response, reads = fetch(admin_client, url("zktasks_job_changelist", state="FAILED"), zk)
    assert cheap(reads)
    assert len(ids(response)) == 50 and "10000" in response.content.decode()

    response, reads = fetch(admin_client, url("zktasks_job_changelist", queue="emails",
                                              task="task_3"), zk)
    # Filters on the task read records, at most SCAN_BUDGET of them (a 10th match).
    assert reads["list status/"] == 0 and 50 < reads["get"] <= SCAN_BUDGET
    assert len(ids(response)) == 50

    # A filter nothing matches looks at a bounded number of records, then says so.
    response, reads = fetch(admin_client, url("zktasks_job_changelist", task="nothing"), zk)
    assert reads["list status/"] == 0 and reads["get"] == SCAN_BUDGET
    html = response.content.decode()
    assert "No match among the results looked at so far (2000 records read)" in html
    assert next_link(response)

    job_id = big["jobs"][12_345][1]
    response, reads = fetch(admin_client, url("zktasks_job_changelist", q=job_id), zk)
    assert dict(reads) == {"get": 1, "list status/": 0}  # the record searched for
    assert response.status_code == 302


def test_overview_and_live_endpoint_serve_from_memory_with_100000_records(
        admin_client, big, zk):
    response, reads = fetch(admin_client, url("zktasks_overview"), zk)
    assert dict(reads) == {"list status/": 0}  # the live cache's thread reads, not this
    data = admin_client.get(url("zktasks_live")).json()
    assert data["totals"]["succeeded"] == 90_000 and data["totals"]["failed"] == 10_000
    assert len(data["recent_failures"]) == 10
    zk.clear()
    for _ in range(20):
        admin_client.get(url("zktasks_live"))
    assert zk == []  # served from memory
    response, reads = fetch(admin_client, url("zktasks_tree", path="/finished"), zk)
    assert reads["get_children"] == 1 and reads["exists"] <= 200  # a page of children


def test_tree_browser_pages_a_node_with_100000_children(admin_client, big, zk):
    response, reads = fetch(admin_client, url("zktasks_tree", path="/status"), zk)
    assert reads["get_children"] == 1 and reads["exists"] <= 200
    html = response.content.decode()
    assert "Children · 100000" in html
    first = sorted(j[1] for j in big["jobs"])[:200]
    assert first[0] in html and first[-1] in html
    link = re.search(r'href="([^"]*after=[^"]*)"', html).group(1).replace("&amp;", "&")
    response, reads = fetch(admin_client, link, zk)
    assert reads["get_children"] == 1 and reads["exists"] <= 200
    assert sorted(j[1] for j in big["jobs"])[200] in response.content.decode()
