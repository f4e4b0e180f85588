"""Processes on different members of an ensemble: one member trails its leader.

A web process submits through one member and hands the job's id on (a redirect, a row in
the database); another process, connected to a member that has not applied the submit
yet, asks about it. ZooKeeper promises a session its own writes only. Before
Store.catch_up, such a process was told "no such job" (get_result, wait, cancel, the
dashboard's job page: and a job whose cancel said so ran), and an operator's action
right after another's was decided on the state before it. The member is made to trail
on purpose (tests/lagging.py), and let go after RELEASE seconds: a call that catches
up waits for it; one that reads the member's state as the truth answers at once.
"""

import pytest
from django.tasks import TaskResultStatus

from tests import tasks
from tests.conftest import zk_tasks_setting
from tests.lagging import TrailingEnsemble
from zktasks import schedule_state
from zktasks.backend import ZooKeeperBackend

RELEASE = 0.6  # seconds: well under the ensemble's syncLimit × tickTime (2 s)


@pytest.fixture(scope="module")
def trailing_ensemble():
    ensemble = TrailingEnsemble()
    try:
        yield ensemble.start()
    finally:
        ensemble.close()


@pytest.fixture
def near_and_far(settings, trailing_ensemble, zk_root):
    """(backend on the ensemble's leader, backend on a follower, that follower). The
    first is TASKS["default"]; both are closed when the settings are put back."""
    leader, follower = trailing_ensemble.leader(), trailing_ensemble.a_follower()
    schedules = {"beat": {"task": "tests.tasks.add", "every": 3600, "args": [1, 2]}}
    settings.TASKS = zk_tasks_setting(leader.hosts, zk_root, SCHEDULES=schedules)
    near = ZooKeeperBackend("default", settings.TASKS["default"])
    far = ZooKeeperBackend("default", zk_tasks_setting(follower.hosts, zk_root,
                                                       SCHEDULES=schedules)["default"])
    near.store.ensure_skeleton()
    far.store.catch_up()  # connected, and up to date before the test makes it trail
    return near, far, follower


def test_a_job_submitted_through_another_member_is_found(trailing_ensemble, near_and_far):
    near, far, follower = near_and_far
    with trailing_ensemble.trailing(follower, release_after=RELEASE):
        job = near.enqueue(tasks.add, (1, 2), {})
        assert far.get_result(job.id).status == TaskResultStatus.READY
    with trailing_ensemble.trailing(follower, release_after=RELEASE):
        job = near.enqueue(tasks.add, (3, 4), {})
        with pytest.raises(TimeoutError):  # it exists, and no worker runs it
            far.wait(job.id, timeout=RELEASE * 3)


def test_a_cancel_of_a_job_just_submitted_elsewhere_cancels_it(trailing_ensemble,
                                                              near_and_far):
    near, far, follower = near_and_far
    with trailing_ensemble.trailing(follower, release_after=RELEASE):
        job = near.enqueue(tasks.add, (1, 2), {})
        assert far.cancel(job.id) is True
    cancelled = near.get_result(job.id)
    assert cancelled.status == TaskResultStatus.FAILED
    assert cancelled.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"


def test_the_dashboard_shows_a_job_just_submitted_elsewhere(trailing_ensemble,
                                                           near_and_far):
    from zktasks.dashboard import Reader

    near, far, follower = near_and_far
    reader = Reader(far, client=far.store.client)
    with trailing_ensemble.trailing(follower, release_after=RELEASE):
        job = near.enqueue(tasks.add, (1, 2), {})
        detail = reader.job(job.id)
    assert detail is not None and detail.record.id == job.id


def test_an_operator_action_right_after_another_sees_it(trailing_ensemble, near_and_far):
    """Resumed through one member, paused at once through another: the pause was
    refused as "paused already" (read from the trailing member), and the schedule went
    on ticking. cancel_pending() right after submits left them READY, to run."""
    near, far, follower = near_and_far
    assert near.pause_schedule("beat") is True
    far.store.catch_up()
    with trailing_ensemble.trailing(follower, release_after=RELEASE):
        assert near.resume_schedule("beat") is True
        assert far.pause_schedule("beat") is True
    assert schedule_state.read(near.store, "beat")[0].get("paused") is True

    with trailing_ensemble.trailing(follower, release_after=RELEASE):
        jobs = [near.enqueue(tasks.add, (i, 1), {}) for i in range(3)]
        assert far.cancel_pending("default") == 3
    assert {near.get_result(j.id).status for j in jobs} == {TaskResultStatus.FAILED}


def test_a_wait_right_after_a_retry_elsewhere_waits_for_the_new_attempt(
        trailing_ensemble, near_and_far):
    """The first read of the wait, from the trailing member, showed the failure before
    the retry: wait() returned it at once, while the job was READY again."""
    near, far, follower = near_and_far
    job = near.enqueue(tasks.add, (1, 2), {})
    assert near.cancel(job.id) is True  # FAILED (cancelled): a job retry() takes
    far.store.catch_up()
    with trailing_ensemble.trailing(follower, release_after=RELEASE):
        assert near.retry(job.id) is True
        with pytest.raises(TimeoutError, match="state READY"):  # no worker runs it
            far.wait(job.id, timeout=RELEASE * 3)


@pytest.fixture
def dashboard_on_the_follower(settings, trailing_ensemble, zk_root, admin_client):
    """(admin client of a dashboard whose process is on a follower, backend on the
    ensemble's leader, that follower)."""
    leader, follower = trailing_ensemble.leader(), trailing_ensemble.a_follower()
    settings.TASKS = zk_tasks_setting(follower.hosts, zk_root)
    near = ZooKeeperBackend("default", zk_tasks_setting(leader.hosts, zk_root)["default"])
    near.store.ensure_skeleton()
    from django.tasks import task_backends

    task_backends["default"].store.catch_up()
    return admin_client, near, follower


def test_dashboard_pages_for_what_another_process_just_made(trailing_ensemble,
                                                            dashboard_on_the_follower):
    """The search by id said "No job has the id", a dead letter's confirm page was a
    404, and a job page opened before its member had the job never updated: no watch
    is left on a node that does not exist."""
    from django.tasks import task_backends

    from tests.dashboard.conftest import url
    from tests.waiting import wait_until
    from zktasks import dashboard, deadletter

    client, near, follower = dashboard_on_the_follower
    with trailing_ensemble.trailing(follower, release_after=RELEASE):
        job = near.enqueue(tasks.add, (1, 2), {})
        response = client.get(url("zktasks_job_changelist", q=job.id))
    assert response.status_code == 302 and job.id in response["Location"]

    store = near.store
    with trailing_ensemble.trailing(follower, release_after=RELEASE):
        path, data = deadletter.entry(store, "/elsewhere", b"junk", kind="foreign_name",
                                      reason="made by another process", by="test")
        store.client.create(path, data)
        name = path.rsplit("/", 1)[1]
        response = client.get(url("zktasks_deadletter_requeue", name))
    assert response.status_code == 200

    state = dashboard.live_state(task_backends["default"])
    with trailing_ensemble.trailing(follower):  # held until the block ends
        job = near.enqueue(tasks.add, (3, 4), {})
        state.snapshot(job_id=job.id, wait=30)  # read from the trailing member: no job
    assert near.cancel(job.id) is True
    wait_until(lambda: state.snapshot(job_id=job.id) and
               state.jobs.get(job.id, {}).get("state") == "FAILED", 30,
               "the job page's live state to follow the job")
