"""The dashboard escapes what it shows and never unpickles what it has not verified."""

import base64
import pickle

from tests.dashboard import tasks as dash_tasks
from tests.dashboard.conftest import url
from tests.waiting import wait_until

SCRIPT = "<script>alert('x')</script>"
TAG = "<img src=x onerror=alert(1)>"  # no "/": it goes into a znode name


def pages(job_id, root_path):
    return [
        url("zktasks_overview"),
        url("zktasks_job_changelist"),
        url("zktasks_job_change", job_id),
        url("zktasks_tree", path=root_path),
    ]


def test_user_supplied_text_is_escaped_everywhere(admin_client, backend, start_worker):
    start_worker(name=TAG)
    job = dash_tasks.raise_text.submit(SCRIPT)
    job.wait(timeout=30)
    from zktasks import dashboard

    state = dashboard.live_state(backend)
    wait_until(lambda: state.snapshot()["recent_failures"], 60, "the failure in the cache")
    for page in pages(job.id, f"/status/{job.id}") + [url("zktasks_pending"),
                                                      url("zktasks_assignments")]:
        response = admin_client.get(page)
        html = response.content.decode()
        assert response.status_code == 200, page
        assert "<script>alert" not in html and "<img src=x" not in html, page
    html = admin_client.get(url("zktasks_job_change", job.id)).content.decode()
    assert "&lt;script&gt;alert(" in html
    html = admin_client.get(url("zktasks_overview")).content.decode()
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def evil_pickle(marker) -> bytes:
    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    return pickle.dumps(Evil())


def test_a_tampered_payload_is_not_unpickled_by_the_web_process(admin_client, backend,
                                                                zk_client, tmp_path):
    marker = tmp_path / "unpickled"
    job = dash_tasks.echo.submit("harmless")  # no worker: stays pending
    path = backend.store.layout.status(job.id)
    raw, stat = zk_client.get(path)
    record = raw.decode()
    import json

    data = json.loads(record)
    data["payload"] = {"mac": data["payload"]["mac"],  # a valid MAC, over other bytes
                       "data": base64.b64encode(evil_pickle(marker)).decode()}
    zk_client.set(path, json.dumps(data).encode(), version=stat.version)

    html = admin_client.get(url("zktasks_job_change", job.id)).content.decode()
    assert "fails its signature check" in html
    assert 'id="zk-args"' not in html
    html = admin_client.get(url("zktasks_tree", path=f"/status/{job.id}")).content.decode()
    assert "signed dill" in html
    admin_client.get(url("zktasks_live", job=job.id))
    # The live cache reads the job on its own thread: wait until it has read the tampered
    # record (its version), or the check below could come before the read it is about.
    from zktasks import dashboard

    state = dashboard.live_state(backend)
    tampered = stat.version + 1
    wait_until(lambda: state.snapshot(job_id=job.id)["job"]["version"] == tampered, 60,
               "the live cache to read the tampered record")
    admin_client.get(url("zktasks_overview"))
    assert not marker.exists()


def test_an_unsigned_result_is_not_unpickled_by_the_web_process(admin_client, backend,
                                                                start_worker, zk_client,
                                                                tmp_path):
    import json

    start_worker()
    marker = tmp_path / "unpickled"
    job = dash_tasks.echo.submit("fine")
    job.wait(timeout=30)
    path = backend.store.layout.status(job.id)
    raw, stat = zk_client.get(path)
    data = json.loads(raw)
    data["result"] = {"mac": "0" * 64, "data": base64.b64encode(evil_pickle(marker)).decode()}
    zk_client.set(path, json.dumps(data).encode(), version=stat.version)

    html = admin_client.get(url("zktasks_job_change", job.id)).content.decode()
    assert "Not shown" in html and "signature check" in html
    assert "echo(&#x27;fine&#x27;)" in html  # the verified arguments still show
    assert not marker.exists()


def test_a_record_of_an_odd_shape_breaks_no_page(admin_client, backend, start_worker,
                                                 zk_client):
    """A status record whose id is not its znode's (a "/" in it broke every link) or
    whose fields have other types is shown as corrupt, never as a server error."""
    import json

    start_worker()
    odd_id, odd_extra = dash_tasks.raise_text.submit("x"), dash_tasks.echo.submit("y")
    odd_id.wait(timeout=30)
    odd_extra.wait(timeout=30)
    for job, change in ((odd_id, {"id": "a/b"}), (odd_extra, {"extra": ["not", "a dict"]})):
        path = backend.store.layout.status(job.id)
        data = json.loads(zk_client.get(path)[0])
        zk_client.set(path, json.dumps({**data, **change}).encode())
    from zktasks import dashboard

    state = dashboard.live_state(backend)
    wait_until(lambda: state.snapshot()["recent_failures"], 60, "the failure in the cache")
    for page in pages(odd_id.id, f"/status/{odd_id.id}") + [
            url("zktasks_job_change", odd_extra.id), url("zktasks_pending"),
            url("zktasks_assignments")]:
        response = admin_client.get(page)
        assert response.status_code == 200, page
    html = admin_client.get(url("zktasks_job_change", odd_extra.id)).content.decode()
    assert "not a dict" not in html and "status record" in html


def test_an_error_with_a_lone_surrogate_breaks_no_page(admin_client, backend, start_worker,
                                                       zk_client):
    """A file name that is not UTF-8, through os.fsdecode(), gives a lone surrogate: in an
    error message it made the job page and the whole Results list answer 500, and
    `zktasks show` fail on a UTF-8 terminal. It is shown as an escape; so is one in a
    record written before that (or by hand)."""
    import io
    import json
    import os

    from django.core.management import call_command

    start_worker()
    name = os.fsdecode(b"caf\xe9.txt")
    job = dash_tasks.raise_text.submit(f"cannot import {name}")
    assert "cannot import caf\\udce9.txt" in job.wait(timeout=30).errors[-1].traceback
    older = dash_tasks.raise_text.submit("older")
    older.wait(timeout=30)
    path = backend.store.layout.status(older.id)
    data = json.loads(zk_client.get(path)[0])
    data["errors"][-1]["message"] = "older caf\udce9"
    zk_client.set(path, json.dumps(data).encode())  # ASCII JSON: "\udce9"
    for shown in (job, older):
        for page in (url("zktasks_job_change", shown.id), url("zktasks_job_changelist")):
            response = admin_client.get(page)
            assert response.status_code == 200, page
        assert "caf\\udce9" in admin_client.get(
            url("zktasks_job_change", shown.id)).content.decode()
        terminal = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
        call_command("zktasks", "show", shown.id, stdout=terminal)
        terminal.flush()
        assert b"caf\\udce9" in terminal.buffer.getvalue()
