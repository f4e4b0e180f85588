"""Periodic schedules on a real ZooKeeper: one job per tick, across leader changes."""

import pytest
from django.tasks.signals import task_enqueued

from tests.conftest import use_zookeeper, zk_tasks_setting
from tests.waiting import wait_until
from zktasks.records import StatusRecord

SCHEDULES = {"beat": {"task": "tests.tasks.add", "every": 1, "args": [2, 3]}}


@pytest.fixture
def zk_settings(settings, zk_hosts, zk_root, monkeypatch):
    """Overrides the suite's fixture: a schedule ticking every second."""
    return use_zookeeper(settings, monkeypatch, zk_hosts, zk_root, SCHEDULES=SCHEDULES)


def tick_jobs(zk_client, backend):
    layout = backend.store.layout
    jobs = []
    for job_id in zk_client.get_children(layout.status_dir):
        record = StatusRecord.from_bytes(zk_client.get(layout.status(job_id))[0])
        if record.extra.get("schedule") == "beat":
            jobs.append(record)
    return jobs


def finished_ticks(zk_client, backend):
    return [r for r in tick_jobs(zk_client, backend) if r.is_finished]


def test_schedule_runs_one_job_per_tick(backend, start_worker, zk_client):
    enqueued = {}

    def receiver(sender, task_result, **kwargs):
        enqueued[task_result.id] = (sender, task_result.task.module_path, task_result.args)

    # task_enqueued for each tick's job, sent where it was submitted (the leader's
    # process), as for a submit: it was never sent for ticks.
    task_enqueued.connect(receiver, weak=False)
    try:
        start_worker()
        wait_until(lambda: len(finished_ticks(zk_client, backend)) >= 3, 30, "three ticks")
        jobs = tick_jobs(zk_client, backend)
        ticks = [r.extra["tick"] for r in jobs]
        assert len(ticks) == len(set(ticks))  # never twice for one tick
        assert all(r.attempts <= 1 for r in jobs)
        done = [r for r in jobs if r.is_finished]
        assert all(r.state == "SUCCESSFUL" for r in done)
        assert backend.get_result(done[0].id).return_value == 5
        wait_until(lambda: {r.id for r in done} <= set(enqueued), 30,
                   "each tick's job to be announced")
        assert enqueued[done[0].id] == (type(backend), "tests.tasks.add", [2, 3])
    finally:
        task_enqueued.disconnect(receiver)


def test_a_tick_whose_answer_was_lost_is_still_announced(backend, start_worker, zk_client,
                                                         monkeypatch):
    """The tick's multi lands and its answer is lost with the connection: the leader
    found the tick recorded at its next pass and never sent task_enqueued for its job
    (a submit() whose answer is lost does send it, after reading that it landed)."""
    from kazoo.exceptions import ConnectionLoss

    announced = set()

    def receiver(sender, task_result, **kwargs):
        announced.add(task_result.id)

    worker = start_worker()
    transaction, lost = worker.client.transaction, []

    def answer_lost():
        txn = transaction()
        commit = txn.commit

        def commit_then_lose():
            ticking = any("/schedules/" in getattr(op, "path", "") for op in txn.operations)
            results = commit()
            if ticking and not lost and not any(isinstance(r, Exception) for r in results):
                lost.append(results)
                raise ConnectionLoss("the answer was lost (test)")
            return results

        txn.commit = commit_then_lose
        return txn

    task_enqueued.connect(receiver, weak=False)
    try:
        monkeypatch.setattr(worker.client, "transaction", answer_lost)
        wait_until(lambda: lost and len(finished_ticks(zk_client, backend)) >= 3, 60,
                   "three ticks, one of them with its answer lost")
        ids = {r.id for r in finished_ticks(zk_client, backend)}
        wait_until(lambda: ids <= announced, 30, "every tick's job announced")
    finally:
        task_enqueued.disconnect(receiver)


def test_schedule_survives_a_leader_change_without_doubling(backend, start_worker, zk_client):
    first = start_worker(name="first")
    wait_until(lambda: first.leader is not None and first.leader.is_leader, 60, "a leader")
    wait_until(lambda: len(finished_ticks(zk_client, backend)) >= 2, 30, "two ticks")
    first.stop(graceful=False)  # the leader dies across a tick
    assert first.wait_stopped(60)
    before = {r.id for r in tick_jobs(zk_client, backend)}
    second = start_worker(name="second")
    wait_until(lambda: len({r.id for r in finished_ticks(zk_client, backend)} - before) >= 2,
               30, "two ticks under the new leader")
    jobs = tick_jobs(zk_client, backend)
    ticks = [r.extra["tick"] for r in jobs]
    assert len(ticks) == len(set(ticks))
    assert any(second.worker_id in r.worker_ids for r in jobs)


def test_the_schedules_znode_deleted_by_hand_is_made_again(backend, start_worker, zk_client):
    """Its state's create then met NoNode, taken for a race: no schedule ticked again
    until a process was restarted, and nothing said so."""
    start_worker()
    wait_until(lambda: len(finished_ticks(zk_client, backend)) >= 1, 30, "a tick")
    zk_client.delete(backend.store.layout.schedules, recursive=True)
    before = {r.id for r in tick_jobs(zk_client, backend)}
    wait_until(lambda: {r.id for r in finished_ticks(zk_client, backend)} - before, 60,
               "a tick after schedules/ was deleted")
    assert zk_client.exists(backend.store.layout.schedule("beat"))


def test_a_clock_set_back_reads_the_schedules_again(backend, start_worker, zk_client,
                                                    monkeypatch):
    """A leader's clock ran ahead and was set back (NTP): the next ticks it had computed
    lay that far ahead, and it skipped every tick until its clock caught up."""
    import time

    worker = start_worker()
    wait_until(lambda: len(finished_ticks(zk_client, backend)) >= 1, 30, "a tick")
    leader = worker.leader
    before = {r.id for r in tick_jobs(zk_client, backend)}
    run_schedules, shifted = leader._run_schedules, []

    def after_the_clock_went_back():
        # On the leader's thread: its state as right after its clock went back two
        # minutes (its next tick two minutes ahead, its clock's offset from monotonic
        # time two minutes less).
        if not shifted:
            leader._next_ticks["beat"] = time.time() + 120
            leader._clock_offset += 120
            shifted.append(True)
        run_schedules()

    monkeypatch.setattr(leader, "_run_schedules", after_the_clock_went_back)
    leader.wake.set()
    wait_until(lambda: {r.id for r in finished_ticks(zk_client, backend)} - before, 60,
               "a tick after the clock went back")


def test_broken_schedule_does_not_stop_the_leader(settings, zk_hosts, zk_root, start_worker,
                                                  monkeypatch):
    from tests import tasks

    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, SCHEDULES={
        "broken": {"task": "tests.tasks.no_such_task", "every": 1}})
    start_worker()
    assert tasks.add.submit(1, 1).wait(timeout=30).return_value == 2


def _with_state(settings, zk_hosts, zk_root, zk_client, name, every, last_tick):
    """Configure one schedule and record its last tick, as a leader before would have."""
    import json

    from django.tasks import task_backends

    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, SCHEDULES={
        name: {"task": "tests.tasks.add", "every": every, "args": [1, 1]}})
    backend = task_backends["default"]
    zk_client.create(backend.store.layout.schedule(name),
                     json.dumps({"last_tick": last_tick.isoformat()}).encode(), makepath=True)
    return backend


def _ticks(zk_client, backend, name):
    layout = backend.store.layout
    return [r for r in (StatusRecord.from_bytes(zk_client.get(layout.status(j))[0])
                        for j in zk_client.get_children(layout.status_dir))
            if r.extra.get("schedule") == name]


def test_a_tick_that_failed_is_tried_again_soon_not_a_period_later(
        settings, zk_hosts, zk_root, zk_client, start_worker, monkeypatch):
    """An hourly schedule whose due tick failed once (ZooKeeper unavailable for longer
    than the retries) ran an hour later, that tick folded into the next."""
    from datetime import timedelta

    from django.utils import timezone

    from zktasks import leader as leader_module
    from zktasks.exceptions import ZooKeeperUnavailableError

    backend = _with_state(settings, zk_hosts, zk_root, zk_client, "hourly", 3600,
                          timezone.now() - timedelta(hours=2))
    monkeypatch.setattr(leader_module, "SCHEDULE_RETRY", 0.2)
    real, calls = leader_module.Leader._tick_record, []

    def fails_once(self, schedule, tick):
        calls.append(tick)
        if len(calls) == 1:
            raise ZooKeeperUnavailableError("ZooKeeper did not answer (as after retries)")
        return real(self, schedule, tick)
    monkeypatch.setattr(leader_module.Leader, "_tick_record", fails_once)
    start_worker()
    wait_until(lambda: _ticks(zk_client, backend, "hourly"), 30, "the due tick, retried")
    assert len(calls) == 2 and calls[0] == calls[1]


def test_a_last_tick_recorded_in_the_future_does_not_stop_the_schedule(
        settings, zk_hosts, zk_root, zk_client, start_worker, caplog):
    """A leader whose clock ran a day ahead recorded its last tick there: the next
    leader skipped every tick until then."""
    from datetime import timedelta

    from django.utils import timezone

    backend = _with_state(settings, zk_hosts, zk_root, zk_client, "skewed", 1,
                          timezone.now() + timedelta(days=1))
    start_worker()
    wait_until(lambda: any(r.is_finished for r in _ticks(zk_client, backend, "skewed")), 30,
               "a tick despite the skewed state")
    assert any("schedule state is in the future" in r.getMessage() for r in caplog.records)


def _rows(backend=None, **kwargs):
    from django.tasks import task_backends

    from zktasks import dashboard

    reader = dashboard.Reader(backend or task_backends["default"])
    return {r.name: r for r in reader.schedules(**kwargs)}


def _command(*args) -> str:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("zktasks", "schedules", *args, stdout=out)
    return out.getvalue()


def test_the_schedules_listing_shows_the_last_tick_its_job_and_the_next(
        backend, start_worker, zk_client):
    """`zktasks schedules` (and the dashboard, from the same reader): before, nothing
    showed a schedule's state; a schedule that stopped ticking went unseen."""
    import json
    from datetime import datetime, timedelta

    worker = start_worker()
    wait_until(lambda: len(finished_ticks(zk_client, backend)) >= 2, 30, "two ticks")
    worker.stop()  # no more ticks: what the listing says can be compared with the tree
    assert worker.wait_stopped(60)
    (row,) = json.loads(_command("--json"))["schedules"]
    assert (row["name"], row["configured"], row["task"], row["when"], row["call"]) == (
        "beat", True, "tests.tasks.add", "every 1 s", "2, 3")
    records_by_id = {r.id: r for r in tick_jobs(zk_client, backend)}
    job = records_by_id[row["last_job"]]  # the last tick's job is one the leader submitted
    assert job.extra["tick"] == row["last_tick"] and row["last_state"] == job.state
    last = datetime.fromisoformat(row["last_tick"])
    assert datetime.fromisoformat(row["next_tick"]) == last + timedelta(seconds=1)
    assert row["error"] == "" and row["overdue"] is False
    assert _rows(now=last + timedelta(hours=1))["beat"].overdue  # no leader ticked since
    text = _command()
    assert "1 schedule(s)" in text and row["last_job"] in text and "every 1 s" in text


def test_a_failing_schedule_shows_its_error_until_a_tick_is_recorded(
        settings, zk_hosts, zk_root, zk_client, start_worker):
    """The leader logged a failing schedule once, and nothing else said so; now the
    error is kept in the schedule's znode, shown, and gone with the next recorded tick."""
    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, SCHEDULES={
        "nightly": {"task": "tests.tasks.no_such_task", "every": 1}})
    worker = start_worker()
    wait_until(lambda: _rows()["nightly"].error, 30, "the failed tick's error, noted")
    row = _rows()["nightly"]
    assert "no_such_task" in row.error and row.error.startswith("ImportError")
    # Its last tick is the one the leader started it from, which has no job.
    assert row.error_at is not None and row.last_tick is not None and row.last_state == ""
    text = _command()
    assert "nightly: the tick attempted at" in text and "no_such_task" in text
    worker.stop()
    assert worker.wait_stopped(60)

    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, SCHEDULES={
        "nightly": {"task": "tests.tasks.add", "every": 1, "args": [1, 2]}})  # fixed
    start_worker()
    wait_until(lambda: not _rows()["nightly"].error, 30, "the error gone with a tick")
    row = _rows()["nightly"]
    assert row.last_job and row.last_state  # the tick that cleared it has its job


def test_a_last_tick_at_the_ends_of_time_is_a_note_not_a_broken_page(
        settings, zk_hosts, zk_root, zk_client):
    """A hand-made last tick that computes to no date ("9999-12-31T23:59", or year 1
    with an offset) raised out of the whole listing: the dashboard's Schedules page and
    `zktasks schedules` failed for every schedule."""
    import json

    from django.tasks import task_backends

    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, SCHEDULES={
        "late": {"task": "tests.tasks.add", "cron": "0 0 * * *", "args": [1, 1]},
        "early": {"task": "tests.tasks.add", "every": 60, "args": [1, 1]},
        "fine": {"task": "tests.tasks.add", "every": 60, "args": [1, 1]}})
    layout = task_backends["default"].store.layout
    for name, tick in (("late", "9999-12-31T23:59:00+00:00"),
                       ("early", "0001-01-01T00:00:00+05:00")):
        zk_client.create(layout.schedule(name), json.dumps({"last_tick": tick}).encode(),
                         makepath=True)
    rows = _rows()
    assert "cannot be used" in rows["late"].note and rows["late"].last_tick is None
    assert "cannot be used" in rows["early"].note and rows["early"].last_tick is None
    assert "cannot be used" not in rows["fine"].note and rows["fine"].next_tick is not None
    assert "cannot be used" in _command()


def test_state_left_by_a_schedule_no_longer_configured_is_listed_as_such(backend, zk_client):
    import json

    from django.utils import timezone

    zk_client.create(backend.store.layout.schedule("retired"),
                     json.dumps({"last_tick": timezone.now().isoformat()}).encode(),
                     makepath=True)
    rows = _rows()
    assert set(rows) == {"beat", "retired"}
    assert not rows["retired"].configured and "not in SCHEDULES" in rows["retired"].note
    assert rows["retired"].next_tick is None
    assert "retired: not in SCHEDULES" in _command()


def _tick_ids(zk_client, backend, name):
    """The schedule's tick jobs (not those of "run now")."""
    return {r.id: r for r in _ticks(zk_client, backend, name) if "tick" in r.extra}


def test_pause_stops_the_ticks_resume_skips_what_was_missed_and_run_now_runs_one(
        settings, zk_hosts, zk_root, zk_client, start_worker):
    """Celery beat's admin can disable an entry and run one at once; zktasks had no
    way short of editing SCHEDULES and restarting the workers."""
    from datetime import datetime

    from django.tasks import task_backends

    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, SCHEDULES={
        "beat": {"task": "tests.tasks.add", "every": 1, "args": [2, 3]},
        "witness": {"task": "tests.tasks.add", "every": 1, "args": [0, 0]}})
    backend = task_backends["default"]
    start_worker()
    wait_until(lambda: any(r.is_finished for r in _ticks(zk_client, backend, "beat")), 30,
               "a tick of beat")
    assert backend.pause_schedule("beat") is True
    assert backend.pause_schedule("beat") is False  # already paused
    paused_with = set(_tick_ids(zk_client, backend, "beat"))
    state_before = zk_client.get(backend.store.layout.schedule("beat"))[0]
    witnessed = set(_tick_ids(zk_client, backend, "witness"))
    # The leader goes through every schedule at each tick: two more of the witness's
    # ticks mean beat's tick times came and went twice while it was paused.
    wait_until(lambda: len(set(_tick_ids(zk_client, backend, "witness")) - witnessed) >= 2,
               30, "two ticks of the witness")
    assert set(_tick_ids(zk_client, backend, "beat")) == paused_with
    assert _rows()["beat"].paused and "paused" in _command()

    now = backend.run_schedule_now("beat")  # paused or not
    assert now.wait(timeout=30).return_value == 5
    record = backend.store.read_status(now.id).record
    assert record.extra == {"schedule": "beat", "manual": True}
    assert zk_client.get(backend.store.layout.schedule("beat"))[0] == state_before

    assert backend.resume_schedule("beat") is True
    assert backend.resume_schedule("beat") is False  # not paused
    resumed_from = datetime.fromisoformat(json_of(zk_client, backend, "beat")["last_tick"])
    wait_until(lambda: set(_tick_ids(zk_client, backend, "beat")) - paused_with, 30,
               "a tick after the resume")
    new = [r for i, r in _tick_ids(zk_client, backend, "beat").items() if i not in paused_with]
    # None of the ticks skipped while paused was run on resume.
    assert all(datetime.fromisoformat(r.extra["tick"]) > resumed_from for r in new)


def json_of(zk_client, backend, name) -> dict:
    import json

    return json.loads(zk_client.get(backend.store.layout.schedule(name))[0])


def test_a_schedule_paused_before_any_leader_saw_it_does_not_tick_until_resumed(
        settings, zk_hosts, zk_root, zk_client, start_worker):
    from django.tasks import task_backends

    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, SCHEDULES={
        "beat": {"task": "tests.tasks.add", "every": 1, "args": [2, 3]},
        "witness": {"task": "tests.tasks.add", "every": 1, "args": [0, 0]}})
    backend = task_backends["default"]
    assert backend.pause_schedule("beat") is True  # makes the znode: no last_tick in it
    start_worker()
    wait_until(lambda: len(_tick_ids(zk_client, backend, "witness")) >= 2, 30,
               "two ticks of the witness")
    assert _ticks(zk_client, backend, "beat") == []
    assert backend.resume_schedule("beat") is True
    wait_until(lambda: any(r.is_finished for r in _ticks(zk_client, backend, "beat")), 30,
               "beat ticking once resumed")


def test_schedule_actions_name_the_schedules_there_are(backend):
    import pytest
    from django.core.management import CommandError, call_command

    from zktasks import ScheduleNotFound

    with pytest.raises(ScheduleNotFound, match="'beat'"):
        backend.pause_schedule("nope")
    with pytest.raises(CommandError, match="No schedule is named 'nope'.*'beat'"):
        call_command("zktasks", "run-schedule", "nope")


def test_run_schedule_from_the_shell_says_what_it_submitted_or_why_not(
        settings, zk_hosts, zk_root, start_worker):
    import pytest
    from django.core.management import CommandError, call_command
    from django.tasks import task_backends

    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, SCHEDULES={
        "beat": {"task": "tests.tasks.add", "cron": "0 3 1 1 *", "args": [2, 3]},
        "broken": {"task": "tests.tasks.no_such_task", "cron": "0 3 1 1 *"}})
    from io import StringIO

    out = StringIO()
    call_command("zktasks", "run-schedule", "beat", "--json", stdout=out)
    import json

    job = json.loads(out.getvalue())["job"]
    start_worker()
    assert task_backends["default"].get_result(job).wait(timeout=30).return_value == 5
    with pytest.raises(CommandError, match="not run: ImportError.*manage.py check"):
        call_command("zktasks", "run-schedule", "broken")


@pytest.mark.parametrize("garbage", [
    b"not json", b'["a list"]', b'{"last_tick": "yesterday"}',
    b'{"last_tick": "2026-01-01T00:00:00"}',  # no zone: cannot be compared with now
], ids=["not-json", "not-an-object", "not-a-time", "naive-time"])
def test_a_corrupt_schedule_state_goes_to_the_dead_letters_and_the_schedule_ticks_on(
        settings, zk_hosts, zk_root, zk_client, start_worker, monkeypatch, garbage):
    """An unreadable state (written by hand, say) stopped its schedule for good: the
    leader logged an error once, then skipped it on every pass."""
    from django.tasks import task_backends

    from zktasks import deadletter
    from zktasks import leader as leader_module

    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, SCHEDULES={
        "mangled": {"task": "tests.tasks.add", "every": 1, "args": [1, 1]}})
    backend = task_backends["default"]
    path = backend.store.layout.schedule("mangled")
    zk_client.create(path, garbage, makepath=True)
    monkeypatch.setattr(leader_module, "SCHEDULE_RETRY", 0.2)
    start_worker()
    wait_until(lambda: any(r.is_finished for r in _ticks(zk_client, backend, "mangled")), 30,
               "a tick after the corrupt state")
    letters = [e for e in deadletter.listing(backend.store) if e.path == path]
    assert [(e.kind, e.data) for e in letters] == [("corrupt_schedule", garbage)]
    assert "starts again from now" in letters[0].reason
    assert _rows(backend)["mangled"].note == ""  # its state is the leader's again


def test_pause_and_resume_whose_answer_was_lost_say_what_they_did(backend, monkeypatch):
    """The write lands, the answer is lost with the connection, and the retry meets our
    own write (NodeExists, BadVersion): it was ours, so the call says it paused (or
    resumed) instead of "paused already" ("not paused")."""
    from kazoo.exceptions import ConnectionLoss

    from zktasks import schedule_state

    client = backend.store.client
    path = backend.store.layout.schedule("beat")
    for verb in ("create", "set"):
        real = getattr(client, verb)
        answers = []

        def lands_then_connection_lost(*args, real=real, answers=answers, **kwargs):
            result = real(*args, **kwargs)
            if args[0] == path:
                answers.append(result)
                if len(answers) == 1:
                    raise ConnectionLoss("the answer was lost (test)")
            return result

        monkeypatch.setattr(client, verb, lands_then_connection_lost)
    # schedule_state's calls as they are (the backend's go through a bounded view).
    store, schedule = backend.store, backend.schedule("beat")
    assert schedule_state.pause(store, "beat") is True  # made the znode: create
    assert schedule_state.pause(store, "beat") is False
    assert schedule_state.resume(store, schedule) is True  # set
    assert schedule_state.resume(store, schedule) is False
    assert len(answers) == 1  # one set landed (its answer lost); the retry met BadVersion


def test_a_schedule_whose_ticks_cannot_be_computed_does_not_stop_assignment(
        backend, start_worker, monkeypatch, caplog):
    """Its error is logged and it is tried again later; the leader's term goes on. The
    next tick was computed outside the guard: the error ended every leader's term at its
    first pass, and no job was assigned at all."""
    import logging

    from tests import tasks
    from zktasks.schedules import Schedule

    caplog.set_level(logging.INFO, logger="zktasks.leader")

    def never(self, when):
        raise ValueError(f"{self.name} never matches (test)")

    monkeypatch.setattr(Schedule, "latest_tick", never)
    monkeypatch.setattr(Schedule, "next_tick", never)
    start_worker()
    assert tasks.add.submit(1, 1).wait(timeout=30).return_value == 2
    assert "schedule failed name=beat" in caplog.text
    assert "leader failed" not in caplog.text


def test_a_schedule_no_leader_has_taken_up_says_why(
        settings, zk_hosts, zk_root, monkeypatch, start_worker):
    """A configured schedule with no state in ZooKeeper: its next tick is counted from
    now, so nothing said it was not ticking, whether no worker led or the leader did
    not have it in its SCHEDULES (a deploy under way, a process with other settings)."""
    from datetime import UTC, datetime, timedelta

    row = _rows()["beat"]  # the module's schedule, and no worker yet
    assert "no worker leads, so nothing ticks" in row.note
    assert not row.overdue  # no tick was missed: its next one is still ahead
    assert "beat: no worker leads, so nothing ticks" in _command()

    use_zookeeper(settings, monkeypatch, zk_hosts, zk_root)  # a leader without schedules
    worker = start_worker()
    wait_until(lambda: worker.leader is not None and worker.leader.is_leader, 60, "a leader")
    use_zookeeper(settings, monkeypatch, zk_hosts, zk_root, SCHEDULES=SCHEDULES)
    row = _rows(now=datetime.now(UTC) + timedelta(minutes=1))["beat"]
    assert "no tick recorded since the leader took over" in row.note
    assert "not in the leader's SCHEDULES" in row.note


def test_a_schedule_s_state_deleted_by_hand_is_made_again_from_its_last_tick(
        backend, start_worker, zk_client):
    """Taken for a new schedule, a schedule whose znode was deleted started again from
    now: its state was made again with the current tick, whose job was never submitted
    (a daily schedule lost a day). The leader goes on from the last tick it saw."""
    import json
    import threading
    from datetime import datetime

    from zktasks.schedules import tick_job_id

    start_worker()
    wait_until(lambda: finished_ticks(zk_client, backend), 30, "a tick")
    path = backend.store.layout.schedule("beat")
    deleted, made_again, ticks = threading.Event(), threading.Event(), []

    def watch(data, stat):
        if data is None:
            deleted.set()
        elif deleted.is_set():
            ticks.append(json.loads(data)["last_tick"])
            made_again.set()
            return False
        return True

    zk_client.DataWatch(path, watch)
    zk_client.delete(path)
    assert made_again.wait(30), "the schedule's state was not made again"
    tick = datetime.fromisoformat(ticks[0])
    # The tick it was made again with has its job: none was skipped.
    assert zk_client.exists(backend.store.layout.status(tick_job_id("beat", tick)))
