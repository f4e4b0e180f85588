"""The dead-letter page and its actions: re-queue and discard, confirmed, logged, staff only."""

from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.test import Client

from tests import tasks
from tests.dashboard.conftest import url
from tests.dashboard.test_actions import follow, messages_of
from tests.pending import pending_nodes
from tests.waiting import wait_until
from zktasks import dashboard, deadletter

HOSTILE_NAME = "<img src=x onerror=alert(1)>"
HOSTILE_DATA = b"<script>alert('x')</script>"


def plant(backend, zk_client, name, data):
    """A foreign name in jobs/default, moved aside as the leader would."""
    store = backend.store
    store.ensure_queue("default")
    path = store.layout.unsharded_job("default", name)
    zk_client.create(path, data)
    entry, failed = deadletter.move_aside(store, path, data, 0, kind="foreign_name",
                                          reason=f"{name!r} is not a job name", by="leader x")
    assert not failed
    return entry.rsplit("/", 1)[1]


def parked_job(backend, zk_client):
    """A READY job that waits nowhere (its pending node moved aside): a re-queue case."""
    job = tasks.add.submit(2, 3)
    store = backend.store
    (node,) = pending_nodes(zk_client, store.layout)
    path = store.layout.job("default", node)
    _, failed = deadletter.move_aside(store, path, b"", 0, kind="unreadable_assignment",
                                      reason="planted by a test", by="test", job_id=job.id)
    assert not failed
    return job, backend.dead_letters()[0].name


def test_the_page_lists_entries_escaped(admin_client, backend, zk_client):
    plant(backend, zk_client, HOSTILE_NAME, HOSTILE_DATA)
    plant(backend, zk_client, "binary", b"\x00\x01\x02\xff" * 10)
    response = admin_client.get(url("zktasks_deadletters"))
    html = response.content.decode()
    assert response.status_code == 200
    assert "<img src=x" not in html and "<script>alert" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert "binary, 40 bytes" in html
    assert "foreign_name" in html and "Dead letters, newest first · 2" in html
    assert html.count('class="zk-deadletter"') == 2
    assert ">Discard</a>" in html and ">Re-queue</a>" not in html  # no job to re-queue


def test_the_overview_counts_and_links_them(admin_client, backend, zk_client):
    plant(backend, zk_client, "junk", b"x")
    state = dashboard.live_state(backend)
    wait_until(lambda: state.snapshot()["totals"]["dead_letters"] == 1, 60, "count")
    html = admin_client.get(url("zktasks_overview")).content.decode()
    assert (f'<a href="{url("zktasks_deadletters")}"><span data-live="totals.dead_letters">'
            '1</span> dead letters</a>') in html


def test_requeue_after_a_confirmation_runs_the_job(admin_client, backend, zk_client,
                                                   start_worker):
    job, name = parked_job(backend, zk_client)
    page = admin_client.get(url("zktasks_deadletters"))
    assert url("zktasks_deadletter_requeue", name) in page.content.decode()
    confirm = admin_client.get(url("zktasks_deadletter_requeue", name))
    html = confirm.content.decode()
    assert confirm.status_code == 200 and "Yes, re-queue it" in html
    assert "csrfmiddlewaretoken" in html and job.id in html
    assert backend.dead_letters()[0].name == name  # GET did nothing

    response = follow(admin_client, url("zktasks_deadletter_requeue", name))
    assert any("Re-queued from the dead letters" in m for m in messages_of(response))
    assert backend.dead_letters() == []
    start_worker()
    assert backend.wait(job.id, timeout=30).return_value == 5
    entry = LogEntry.objects.get()
    assert entry.action_flag == CHANGE and entry.object_id == job.id
    assert name in entry.get_change_message()
    detail = admin_client.get(url("zktasks_job_change", job.id)).content.decode()
    assert "re-queued from the dead letters" in detail


def test_a_refused_requeue_says_why_and_logs_nothing(admin_client, backend, zk_client):
    name = plant(backend, zk_client, "junk", b"x")
    response = follow(admin_client, url("zktasks_deadletter_requeue", name))
    assert any("refers to no job" in m for m in messages_of(response))
    assert not LogEntry.objects.exists()
    assert [e.name for e in backend.dead_letters()] == [name]


def test_discard_after_a_confirmation(admin_client, backend, zk_client):
    name = plant(backend, zk_client, HOSTILE_NAME, HOSTILE_DATA)
    page = admin_client.get(url("zktasks_deadletter_discard", name))
    html = page.content.decode()
    assert "Yes, discard it" in html and "<img src=x" not in html
    response = follow(admin_client, url("zktasks_deadletter_discard", name))
    assert any("Discarded" in m for m in messages_of(response))
    assert backend.dead_letters() == []
    entry = LogEntry.objects.get()
    assert entry.action_flag == DELETION and name in entry.object_repr
    response = follow(admin_client, url("zktasks_deadletter_discard", name))
    assert any("gone already" in m for m in messages_of(response))
    assert admin_client.get(url("zktasks_deadletter_discard", name)).status_code == 404


def test_discarding_the_only_place_a_job_waits_fails_the_job_and_says_so_first(
        admin_client, backend, zk_client):
    job, name = parked_job(backend, zk_client)
    html = admin_client.get(url("zktasks_deadletter_discard", name)).content.decode()
    assert "this entry is the only place it waits" in html and job.id in html
    assert backend.get_result(job.id).status == "READY"  # GET did nothing

    response = follow(admin_client, url("zktasks_deadletter_discard", name))
    assert any(f"Job {job.id}, which waited nowhere else, was failed as cancelled" in m
               for m in messages_of(response))
    assert backend.dead_letters() == []
    # Before, the job stayed READY with nowhere to run: a wait() never returned.
    result = backend.wait(job.id, timeout=5)
    assert result.status == "FAILED"
    assert result.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"
    assert "discarded with dead-letter entry" in result.errors[-1].traceback
    assert backend.cancel(job.id) is True  # it counts as cancelled
    assert pending_nodes(zk_client, backend.store.layout) == []


def test_discarding_an_entry_whose_job_waits_elsewhere_leaves_the_job_alone(
        admin_client, backend, zk_client):
    job = tasks.add.submit(2, 3)
    store = backend.store
    path = store.layout.unsharded_job("default", "copy")
    zk_client.create(path, b"")
    _, failed = deadletter.move_aside(store, path, b"", 0, kind="unreadable_assignment",
                                      reason="planted by a test", by="test", job_id=job.id)
    assert not failed
    name = backend.dead_letters()[0].name
    html = admin_client.get(url("zktasks_deadletter_discard", name)).content.decode()
    assert "is not touched" in html
    assert backend.discard_dead_letter(name)  # the job still waits in its queue
    assert backend.get_result(job.id).status == "READY"
    assert len(pending_nodes(zk_client, store.layout)) == 1


def test_actions_need_csrf_post_and_the_permission(backend, zk_client, admin_user,
                                                   admin_client, staff_client):
    name = plant(backend, zk_client, "junk", b"x")
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    for action in ("zktasks_deadletter_requeue", "zktasks_deadletter_discard"):
        assert client.post(url(action, name)).status_code == 403
        assert admin_client.put(url(action, name)).status_code == 405
        assert admin_client.delete(url(action, name)).status_code == 405
        assert staff_client.get(url(action, name)).status_code == 403
        assert staff_client.post(url(action, name)).status_code == 403
    html = staff_client.get(url("zktasks_deadletters")).content.decode()
    assert "junk" in html and ">Discard</a>" not in html  # may look, may not act
    assert [e.name for e in backend.dead_letters()] == [name]
    assert not LogEntry.objects.exists()
