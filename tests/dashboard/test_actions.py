"""Actions: POST only, CSRF-protected, confirmed first, logged in the admin log, reported."""

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.test import Client

from tests import tasks
from tests.dashboard import tasks as dash_tasks
from tests.dashboard.conftest import url
from tests.pending import pending_nodes
from tests.waiting import wait_until


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def follow(client, path, data=None):
    response = client.post(path, data or {}, follow=True)
    assert response.status_code == 200, response.content[:2000]
    return response


def test_retry_a_failed_job(admin_client, backend, start_worker, tmp_path):
    start_worker()
    marker = tmp_path / "fixed"
    job = dash_tasks.fails_until_file.submit(str(marker))
    job.wait(timeout=30)

    page = admin_client.get(url("zktasks_job_retry", job.id))
    html = page.content.decode()
    assert page.status_code == 200 and "csrfmiddlewaretoken" in html
    assert 'method="post"' in html and "Yes, retry it" in html
    assert backend.store.read_status(job.id).record.state == "FAILED"  # GET did nothing

    marker.touch()
    response = follow(admin_client, url("zktasks_job_retry", job.id))
    assert any("one more attempt" in m for m in messages_of(response))
    result = backend.wait(job.id, timeout=30)
    assert result.return_value == "recovered" and result.attempts == 2
    entry = LogEntry.objects.get()
    assert entry.action_flag == CHANGE and entry.object_id == job.id
    assert "one more attempt" in entry.get_change_message()
    assert entry.get_admin_url() == url("zktasks_job_change", job.id)


def test_retry_refuses_a_job_that_did_not_fail(admin_client, backend, start_worker):
    start_worker()
    job = tasks.add.submit(1, 1)
    job.wait(timeout=30)
    response = follow(admin_client, url("zktasks_job_retry", job.id))
    assert any("not retried" in m for m in messages_of(response))
    assert not LogEntry.objects.exists()


def test_cancel_a_pending_job(admin_client, backend):
    job = tasks.add.submit(1, 1)  # no worker: stays pending
    page = admin_client.get(url("zktasks_job_cancel", job.id))
    assert "Yes, cancel it" in page.content.decode()
    response = follow(admin_client, url("zktasks_job_cancel", job.id))
    assert any("Cancelled" in m for m in messages_of(response))
    record = backend.store.read_status(job.id).record
    assert record.state == "FAILED"
    assert record.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"
    layout = backend.store.layout
    assert pending_nodes(backend.store.client, layout) == []
    assert LogEntry.objects.get().object_id == job.id


def test_stop_a_running_job_from_its_page(admin_client, backend, start_worker, tmp_path):
    """A running job's page offers Stop…; the worker is asked, the task sees
    cancel_requested(), and the request is logged. (The form used to say a running job
    "cannot be cancelled here" while its POST asked the worker anyway, unlogged, and
    answered "not cancelled".)"""
    start_worker()
    job = tasks.stops_when_its_worker_is_lost.submit(str(tmp_path), 60)
    wait_until(lambda: (tmp_path / "1.started").exists(), 30, "the job to start")
    wait_until(lambda: backend.store.read_status(job.id).record.state == "RUNNING", 30,
               "its RUNNING record")
    assert "Stop…" in admin_client.get(url("zktasks_job_change", job.id)).content.decode()
    page = admin_client.get(url("zktasks_job_cancel", job.id)).content.decode()
    assert "Stop job" in page and "cancel_requested()" in page and 'name="force"' in page
    response = follow(admin_client, url("zktasks_job_cancel", job.id))
    assert any("Asked the worker holding the job to stop it" in m
               for m in messages_of(response))
    result = backend.wait(job.id, timeout=30)
    assert result.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"
    assert (tmp_path / "asked").exists()
    assert "Asked the worker" in LogEntry.objects.get(object_id=job.id).get_change_message()


def test_stop_with_force_terminates_the_task_process(admin_client, backend, start_worker,
                                                     tmp_path):
    start_worker(pool="process", concurrency=1)
    job = tasks.sleep_then_return.submit(str(tmp_path), 60, "never")
    wait_until(lambda: any(tmp_path.iterdir()), 60, "the job to start")
    response = follow(admin_client, url("zktasks_job_cancel", job.id), {"force": "yes"})
    assert any("terminating its task process" in m for m in messages_of(response))
    result = backend.wait(job.id, timeout=30)
    assert result.status == "FAILED"
    assert result.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"


def test_cancel_refuses_a_finished_job(admin_client, backend, start_worker):
    start_worker()
    job = tasks.add.submit(1, 1)
    job.wait(timeout=30)
    response = follow(admin_client, url("zktasks_job_cancel", job.id))
    assert any("not cancelled" in m for m in messages_of(response))
    assert not LogEntry.objects.exists()


def test_purge_finished_results_after_a_confirmation(admin_client, backend, start_worker):
    start_worker()
    ok = [tasks.add.submit(i, 1) for i in range(3)]
    bad = tasks.boom.submit("x")
    for job in [*ok, bad]:
        job.wait(timeout=30)
    from zktasks import dashboard

    state = dashboard.live_state(backend)
    wait_until(lambda: state.snapshot()["totals"]["succeeded"] == 3, 60, "counts")

    form = admin_client.get(url("zktasks_purge"))
    assert form.status_code == 200 and "Review" in form.content.decode()
    review = admin_client.post(url("zktasks_purge"), {"states": ["SUCCESSFUL"],
                                                      "older_than": ""})
    html = review.content.decode()
    assert review.status_code == 200 and 'id="zk-estimate">3<' in html
    assert backend.store.read_status(ok[0].id) is not None  # not yet

    response = follow(admin_client, url("zktasks_purge"),
                      {"states": ["SUCCESSFUL"], "older_than": "", "confirm": "yes"})
    assert any("Purged 3 finished results" in m for m in messages_of(response))
    assert all(backend.store.read_status(j.id) is None for j in ok)
    assert backend.store.read_status(bad.id) is not None  # failed ones were not asked for
    entry = LogEntry.objects.get()
    assert entry.action_flag == DELETION and "3 finished results" in entry.object_repr


def test_the_purge_estimate_of_a_process_that_served_no_page_yet(admin_client, backend,
                                                                start_worker):
    """A web server's other process (gunicorn's workers) may get the review first: its
    live cache had read nothing, and the estimate said 0 of 3."""
    from zktasks import dashboard

    start_worker()
    for job in [tasks.add.submit(i, 1) for i in range(3)]:
        job.wait(timeout=30)
    dashboard.reset_live_states()  # as in a process that has served no page
    review = admin_client.post(url("zktasks_purge"), {"states": ["SUCCESSFUL"],
                                                      "older_than": ""})
    assert 'id="zk-estimate">3<' in review.content.decode()


def test_purge_by_age_keeps_recent_results(admin_client, backend, start_worker):
    start_worker()
    job = tasks.add.submit(1, 1)
    job.wait(timeout=30)
    response = follow(admin_client, url("zktasks_purge"),
                      {"states": ["SUCCESSFUL", "FAILED"], "older_than": "3600",
                       "confirm": "yes"})
    assert any("Purged 0 finished results" in m for m in messages_of(response))
    assert backend.store.read_status(job.id) is not None


def test_purge_form_errors_are_shown(admin_client, backend):
    response = admin_client.post(url("zktasks_purge"), {"older_than": "bogus"})
    html = response.content.decode()
    assert response.status_code == 200 and "errornote" in html


def test_drain_a_worker(admin_client, backend, start_worker, zk_client):
    worker = start_worker()
    page = admin_client.get(url("zktasks_drain", worker.worker_id))
    assert "Yes, drain it" in page.content.decode()
    response = follow(admin_client, url("zktasks_drain", worker.worker_id))
    assert any("is draining" in m for m in messages_of(response))
    assert worker.wait_stopped(30), "the worker did not drain and exit"
    assert zk_client.exists(backend.store.layout.worker(worker.worker_id)) is None
    entry = LogEntry.objects.get()
    assert worker.worker_id in entry.object_repr


def test_drain_of_a_vanished_worker_says_so(admin_client, backend):
    backend.store.ensure_skeleton()
    response = follow(admin_client, url("zktasks_drain", "gone-123"))
    assert any("is gone" in m for m in messages_of(response))
    assert admin_client.get(url("zktasks_drain", "gone-123")).status_code == 404


def test_drain_of_a_worker_znode_zktasks_did_not_write_says_so(admin_client, backend,
                                                              zk_client):
    """The overview offers Drain for an unreadable worker znode; the POST was a 500."""
    backend.store.ensure_skeleton()
    zk_client.create(backend.store.layout.worker("w-bad"), b"not json", ephemeral=True)
    assert "Yes, drain it" in admin_client.get(url("zktasks_drain", "w-bad")).content.decode()
    response = follow(admin_client, url("zktasks_drain", "w-bad"))
    assert any("cannot be asked to drain" in m for m in messages_of(response))
    assert zk_client.get(backend.store.layout.worker("w-bad"))[0] == b"not json"


def test_an_action_on_a_record_that_turned_corrupt_says_so(admin_client, backend, zk_client):
    job = tasks.add.submit(1, 1)
    zk_client.set(backend.store.layout.status(job.id), b"not json")
    response = follow(admin_client, url("zktasks_job_cancel", job.id))
    assert any(m.startswith("Not done:") for m in messages_of(response))


@pytest.mark.parametrize("name", ["zktasks_job_retry", "zktasks_job_cancel"])
def test_actions_need_a_csrf_token(backend, admin_user, name):
    job = tasks.add.submit(1, 1)
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.post(url(name, job.id)).status_code == 403
    assert client.post(url("zktasks_purge"), {"states": ["SUCCESSFUL"],
                                              "confirm": "yes"}).status_code == 403
    assert backend.store.read_status(job.id).record.state == "READY"
    # With the token of the confirmation page, the same POST goes through.
    page = client.get(url(name, job.id))
    token = page.context["csrf_token"]
    response = client.post(url(name, job.id), {"csrfmiddlewaretoken": str(token)})
    assert response.status_code == 302


def test_actions_refuse_other_methods(admin_client, backend):
    job = tasks.add.submit(1, 1)
    for name, args in [("zktasks_job_retry", (job.id,)), ("zktasks_job_cancel", (job.id,)),
                       ("zktasks_purge", ()), ("zktasks_drain", ("w-1",))]:
        assert admin_client.put(url(name, *args)).status_code == 405, name
        assert admin_client.delete(url(name, *args)).status_code == 405, name


def test_staff_without_the_permission_may_look_but_not_act(staff_client, backend,
                                                           start_worker):
    worker = start_worker()
    failed = tasks.boom.submit("x")
    failed.wait(timeout=30)
    html = staff_client.get(url("zktasks_job_change", failed.id)).content.decode()
    assert staff_client.get(url("zktasks_job_change", failed.id)).status_code == 200
    assert 'id="zk-retry"' not in html
    assert "Drain" not in staff_client.get(url("zktasks_overview")).content.decode()
    for name, args in [("zktasks_job_retry", (failed.id,)),
                       ("zktasks_job_cancel", (failed.id,)), ("zktasks_purge", ()),
                       ("zktasks_drain", (worker.worker_id,))]:
        assert staff_client.get(url(name, *args)).status_code == 403, name
        assert staff_client.post(url(name, *args), {"confirm": "yes"}).status_code == 403
    assert backend.store.read_status(failed.id).record.state == "FAILED"
    assert not LogEntry.objects.exists()


def test_the_manage_jobs_permission_allows_actions(manager_client, backend):
    job = tasks.add.submit(1, 1)
    response = follow(manager_client, url("zktasks_job_cancel", job.id))
    assert any("Cancelled" in m for m in messages_of(response))


def test_cancel_never_unpickles_the_job_s_arguments(admin_client, backend, start_worker,
                                                    zk_client, tmp_path):
    """Cancel and Stop asked get_result() whether the job had finished, which unpickled
    its arguments in the web process: an argument that crashes or hangs as it loads is
    a likely reason to stop a job, and it took the web server's process with it."""
    import os

    from tests.waiting import wait_for_data

    start_worker(pool="process", concurrency=1)
    # Each task process that loads it dies; this process, spared, notes it and raises.
    job = tasks.takes_anything.submit(tasks.CrashesWhoeverLoadsIt(str(tmp_path), os.getpid()))
    wait_for_data(zk_client, backend.store.layout.status(job.id),
                  lambda record: record["state"] == "FAILED")
    response = follow(admin_client, url("zktasks_job_cancel", job.id))
    assert any("not cancelled" in m for m in messages_of(response))
    loads = (tmp_path / "loaded").read_text().splitlines()
    assert len(loads) == 2 and not any(int(line.split()[0]) == os.getpid() for line in loads)
