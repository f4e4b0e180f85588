"""The Schedules page: each schedule's last tick and its job, the next tick, the error of
a failing one, escaped; kept current by the live cache's "schedules" topic."""

import json

from django.tasks import task_backends

from tests.conftest import zk_tasks_setting
from tests.dashboard.conftest import url
from tests.dashboard.test_pages import text, wait_live
from tests.waiting import wait_until
from zktasks import dashboard

HOSTILE = "<script>alert('tick')</script>"


def test_the_page_shows_a_ticking_schedule_and_links_its_last_job(
        admin_client, settings, zk_hosts, zk_root, start_worker):
    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, SCHEDULES={
        "beat": {"task": "tests.tasks.add", "every": 1, "args": [2, 3]}})
    start_worker()
    reader = dashboard.Reader(task_backends["default"])
    wait_until(lambda: reader.schedules()[0].last_state, 30, "a tick with its job")
    html = text(admin_client.get(url("zktasks_schedules")))
    assert 'id="zk-schedule-beat"' in html and "every 1 s" in html
    assert "tests.tasks.add" in html and "(2, 3)" in html
    assert 'href="/admin/zktasks/job/' in html  # the last tick's job, linked
    assert 'data-zk-topics="schedules finished leader"' in html  # live.js reloads on these


def test_a_noted_error_and_state_left_behind_are_shown_escaped(
        admin_client, settings, zk_hosts, zk_root, zk_client):
    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, SCHEDULES={
        "nightly": {"task": "tests.tasks.add", "cron": "0 3 * * *"}})
    layout = task_backends["default"].store.layout
    state = {"last_tick": "2026-01-01T03:00:00+00:00", "error": HOSTILE,
             "error_at": "2026-01-02T03:00:05+00:00"}
    zk_client.create(layout.schedule("nightly"), json.dumps(state).encode(), makepath=True)
    zk_client.create(layout.schedule("retired"), b"not json")
    # An error without its time (a hand edit): the page showed a 500 (KeyError).
    zk_client.create(layout.schedule("edited"), json.dumps({
        "last_tick": "2026-01-01T03:00:00+00:00", "error": "noted by hand"}).encode())
    html = text(admin_client.get(url("zktasks_schedules")))
    assert "noted by hand" in html
    assert HOSTILE not in html and "&lt;script&gt;alert(&#x27;tick&#x27;)&lt;/script&gt;" in html
    assert "cron 0 3 * * * (UTC)" in html and "overdue" in html  # months without a tick
    assert 'id="zk-schedule-retired"' in html and "its state cannot be read" in html


def test_the_live_topic_moves_when_a_schedule_ticks(admin_client, settings, zk_hosts,
                                                    zk_root, zk_client):
    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, SCHEDULES={
        "beat": {"task": "tests.tasks.add", "every": 1}})
    layout = task_backends["default"].store.layout
    path = layout.schedule("beat")
    zk_client.create(path, json.dumps({"last_tick": "2026-01-01T00:00:00+00:00"}).encode(),
                     makepath=True)
    before = wait_live(admin_client, lambda d: "schedules" in d["topics"], "the topic")
    zk_client.set(path, json.dumps({"last_tick": "2026-01-01T00:00:01+00:00"}).encode())
    wait_live(admin_client, lambda d: d["topics"].get("schedules")
              != before["topics"]["schedules"], "the topic moved by the tick")


def test_no_schedules_says_where_to_add_them(admin_client, backend):
    html = text(admin_client.get(url("zktasks_schedules")))
    assert "No schedules" in html and "SCHEDULES" in html
    # The first poll waits only briefly (1.5 s) for the live cache's first read.
    assert wait_live(admin_client, lambda d: d["ok"], "the live cache's first read")["ok"]


def _with_schedules(settings, zk_hosts, zk_root):
    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, SCHEDULES={
        "nightly": {"task": "tests.tasks.add", "cron": "0 3 * * *", "args": [2, 3]},
        "broken": {"task": "tests.tasks.no_such_task", "cron": "0 3 * * *"}})
    return task_backends["default"]


def test_pause_and_resume_are_confirmed_logged_and_shown(
        manager_client, settings, zk_hosts, zk_root, zk_client):
    from django.contrib.admin.models import LogEntry

    from tests.dashboard.test_actions import follow, messages_of

    backend = _with_schedules(settings, zk_hosts, zk_root)
    pause = url("zktasks_schedule_action", "nightly", "pause")
    html = text(manager_client.get(pause))  # the confirmation, nothing done yet
    assert "Yes, pause it" in html and "tests.tasks.add" in html
    assert not dashboard.Reader(backend).schedules()[1].paused
    response = follow(manager_client, pause)
    assert messages_of(response) == ["Paused schedule 'nightly': no ticks until it is "
                                     "resumed."]
    assert json.loads(zk_client.get(backend.store.layout.schedule("nightly"))[0])["paused"]
    html = response.content.decode()
    assert url("zktasks_schedule_action", "nightly", "resume") in html and "paused" in html
    assert LogEntry.objects.get().change_message == messages_of(response)[0]
    again = follow(manager_client, pause)
    assert messages_of(again) == ["Schedule 'nightly' was paused already."]
    resumed = follow(manager_client, url("zktasks_schedule_action", "nightly", "resume"))
    assert messages_of(resumed) == ["Resumed schedule 'nightly' at its next tick."]
    state = json.loads(zk_client.get(backend.store.layout.schedule("nightly"))[0])
    assert "paused" not in state and state["last_tick"]


def test_run_now_submits_a_job_or_says_why_not(manager_client, settings, zk_hosts, zk_root):
    from tests.dashboard.test_actions import follow, messages_of

    backend = _with_schedules(settings, zk_hosts, zk_root)
    response = follow(manager_client, url("zktasks_schedule_action", "nightly", "run"))
    (message,) = messages_of(response)
    job_id = message.split()[2]
    assert message == f"Submitted job {job_id} of schedule 'nightly' now."
    record = backend.store.read_status(job_id).record
    assert record.extra == {"schedule": "nightly", "manual": True}
    assert record.task == "tests.tasks.add" and record.state == "READY"
    broken = follow(manager_client, url("zktasks_schedule_action", "broken", "run"))
    (message,) = messages_of(broken)
    assert message.startswith("Run now of schedule 'broken' failed: ImportError")
    assert "manage.py check" in message


def test_schedule_actions_need_the_permission_and_a_real_schedule(
        staff_client, admin_client, settings, zk_hosts, zk_root, zk_client):
    backend = _with_schedules(settings, zk_hosts, zk_root)
    pause = url("zktasks_schedule_action", "nightly", "pause")
    assert staff_client.get(pause).status_code == 403
    assert staff_client.post(pause).status_code == 403
    assert "Pause</a>" not in text(staff_client.get(url("zktasks_schedules")))
    assert zk_client.exists(backend.store.layout.schedule("nightly")) is None
    assert admin_client.get(url("zktasks_schedule_action", "nope", "pause")).status_code \
        == 404
    assert admin_client.get(url("zktasks_schedule_action", "nightly", "delete")) \
        .status_code == 404
    assert admin_client.put(pause).status_code == 405
