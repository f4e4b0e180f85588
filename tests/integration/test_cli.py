"""`manage.py zktasks`: the overview, one job, and the operator's actions, from a shell."""

import io
import json
import os
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command
from django.tasks import TaskResultStatus

from tests import tasks
from tests.conftest import REPO, zk_tasks_setting
from tests.dashboard.test_deadletters import parked_job, plant
from tests.waiting import wait_until
from zktasks.testing import free_port


def zktasks(*args) -> str:
    out = io.StringIO()
    call_command("zktasks", *args, stdout=out)
    return out.getvalue()


def test_status_shows_the_leader_workers_and_counts_per_queue(backend, start_worker):
    worker = start_worker(queues=["default"])
    assert tasks.add.submit(1, 2).wait(timeout=30).status == TaskResultStatus.SUCCESSFUL
    assert tasks.boom.submit("no").wait(timeout=30).status == TaskResultStatus.FAILED
    waiting = tasks.email.submit("ada@example.com")  # no worker serves "emails"
    wait_until(lambda: json.loads(zktasks("status", "--json"))["leader"], 20, "a leader")

    data = json.loads(zktasks("status", "--json"))
    queues = {q["name"]: q for q in data["queues"]}
    assert queues["emails"]["pending"] == 1
    assert (queues["default"]["succeeded"], queues["default"]["failed"]) == (1, 1)
    assert data["totals"]["workers"] == 1 and data["leader"]["worker"] == worker.worker_id
    assert [f["task"] for f in data["recent_failures"]] == ["tests.tasks.boom"]

    text = zktasks("status")
    assert worker.worker_id in text and "leader: " + worker.worker_id in text
    assert "1 pending, 0 delayed, 0 running, 1 succeeded, 1 failed" in text
    assert waiting.status == TaskResultStatus.READY


def test_show_prints_a_job_its_errors_and_where_it_is(backend, start_worker):
    start_worker()
    job = tasks.boom.submit("the reason")
    job.wait(timeout=30)
    text = zktasks("show", job.id)
    assert f"job:       {job.id}" in text and "state:     FAILED" in text
    assert "arguments: 'the reason'" in text
    assert "ValueError: the reason" in text  # the last error, with its traceback
    assert "finished index:" in text and "status record:" in text

    data = json.loads(zktasks("show", job.id, "--json"))
    assert data["state"] == "FAILED" and data["attempts"] == 1
    assert data["errors"][0]["exception"] == "builtins.ValueError"
    assert "Traceback" in data["errors"][0]["traceback"]

    done = tasks.add.submit(20, 22)
    done.wait(timeout=30)
    assert "result:    42" in zktasks("show", done.id)


def test_jobs_lists_finished_ones_filtered_and_in_pages(backend, start_worker):
    start_worker()
    ok = [tasks.add.submit(i, i) for i in range(3)]
    bad = tasks.boom.submit("listed")
    for job in [*ok, bad]:
        job.wait(timeout=30)
    every = json.loads(zktasks("jobs", "--json"))["rows"]
    assert {r["id"] for r in every} == {j.id for j in [*ok, bad]}
    failed = json.loads(zktasks("jobs", "--state", "FAILED", "--json"))["rows"]
    assert [(r["id"], r["error"]) for r in failed] == [(bad.id, "builtins.ValueError: listed")]
    assert [r["id"] for r in json.loads(zktasks("jobs", "--task", "boom", "--json"))["rows"]] \
        == [bad.id]
    first = json.loads(zktasks("jobs", "--limit", "3", "--json"))
    rest = json.loads(zktasks("jobs", "--limit", "3", "--after", first["next_cursor"],
                              "--json"))
    assert len(first["rows"]) == 3 and rest["next_cursor"] is None
    assert {r["id"] for r in first["rows"] + rest["rows"]} == {r["id"] for r in every}
    assert "more: add --after" in zktasks("jobs", "--limit", "1")


def test_pending_lists_a_queue_in_assignment_order(backend):
    low = tasks.email.using(priority=-5).submit("later@example.com")
    high = [tasks.email.using(priority=5).submit(f"{i}@example.com") for i in range(2)]
    page = json.loads(zktasks("pending", "emails", "--limit", "2", "--json"))
    assert page["total"] == 3 and {r["id"] for r in page["rows"]} == {j.id for j in high}
    rest = json.loads(zktasks("pending", "emails", "--after", page["next_cursor"], "--json"))
    assert [r["id"] for r in rest["rows"]] == [low.id]
    assert "0 job(s) pending in 'default' of 0" in zktasks("pending")


def test_retry_sends_a_failed_job_back_and_refuses_others(backend, start_worker):
    start_worker()
    failed = tasks.boom.submit("again")
    failed.wait(timeout=30)
    assert "for one more attempt" in zktasks("retry", failed.id)
    wait_until(lambda: backend.get_result(failed.id).attempts == 2
               and backend.get_result(failed.id).status == TaskResultStatus.FAILED,
               30, "the second attempt")
    ok = tasks.add.submit(1, 1)
    ok.wait(timeout=30)
    with pytest.raises(CommandError, match="only a FAILED job can be, and it is SUCCESSFUL"):
        zktasks("retry", ok.id)


def test_cancel_a_pending_job_and_refuse_a_finished_one(backend):
    job = tasks.add.submit(2, 2)  # no worker: it waits
    assert "is cancelled: it will not run" in zktasks("cancel", job.id)
    result = backend.get_result(job.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"
    # Cancelled is where it stays: asking again says so.
    assert json.loads(zktasks("cancel", job.id, "--json"))["cancelled"] is True


def test_cancel_of_a_held_job_asks_its_worker(backend, start_worker, tmp_path):
    start_worker()
    job = tasks.until_cancelled.submit(str(tmp_path / "marker"))
    wait_until(lambda: backend.get_result(job.id).status == TaskResultStatus.RUNNING, 30,
               "running")
    assert "it was asked to stop" in zktasks("cancel", job.id)
    result = job.wait(timeout=30)
    assert result.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"
    assert "is cancelled" in zktasks("cancel", job.id)  # stopped on request: cancelled
    done = tasks.add.submit(1, 1)
    done.wait(timeout=30)
    with pytest.raises(CommandError, match=r"has finished \(SUCCESSFUL\); nothing to cancel"):
        zktasks("cancel", done.id)


def test_bad_ids_and_unknown_things_say_what_is_wrong(backend, zk_client):
    garbled = tasks.add.submit(1, 1)  # no worker: nobody meets the garbage below
    zk_client.set(backend.store.layout.status(garbled.id), b"\x00 not json")
    with pytest.raises(CommandError, match="tree page shows its raw bytes"):
        zktasks("show", garbled.id)
    with pytest.raises(CommandError, match="is not a job id"):
        zktasks("show", "nope")
    with pytest.raises(CommandError, match="No job has the id .* never submitted here"):
        zktasks("show", "0" * 32)
    with pytest.raises(CommandError, match="No job has the id"):
        zktasks("retry", "0" * 32)
    with pytest.raises(CommandError, match="No worker 'w-1' is registered"):
        zktasks("drain", "w-1")
    with pytest.raises(CommandError, match="No dead-letter entry"):
        zktasks("discard", "nothing-here")


def test_purge_asks_first_then_deletes_what_was_asked(backend, start_worker):
    start_worker()
    ok = tasks.add.submit(1, 2)
    bad = tasks.boom.submit("x")
    ok.wait(timeout=30)
    bad.wait(timeout=30)
    # pytest's stdin is no terminal: without --yes the command only estimates.
    with pytest.raises(CommandError, match="deletes about 1 SUCCESSFUL results.*--yes"):
        zktasks("purge", "--state", "SUCCESSFUL")
    assert backend.store.read_status(ok.id) is not None
    assert "Purged 1 SUCCESSFUL results" in zktasks("purge", "--state", "SUCCESSFUL", "--yes")
    assert backend.store.read_status(ok.id) is None
    assert backend.store.read_status(bad.id) is not None
    # Nothing finished an hour ago: an age keeps the recent ones.
    assert json.loads(zktasks("purge", "--older-than", "3600", "--yes", "--json")) == {
        "purged": 0, "states": ["SUCCESSFUL", "FAILED"], "older_than": 3600.0}
    assert backend.store.read_status(bad.id) is not None


def test_purge_at_a_terminal_asks_and_takes_no_for_an_answer(backend, start_worker,
                                                             monkeypatch):
    start_worker()
    ok = tasks.add.submit(1, 2)
    ok.wait(timeout=30)
    answers = iter(["no", "yes"])
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: next(answers))
    with pytest.raises(CommandError, match="Nothing deleted"):
        zktasks("purge")
    assert backend.store.read_status(ok.id) is not None
    out = zktasks("purge")
    assert "This deletes about 1 SUCCESSFUL and FAILED results" in out
    assert "Purged 1 SUCCESSFUL and FAILED results" in out
    assert backend.store.read_status(ok.id) is None


def test_dead_letters_are_listed_requeued_and_discarded(backend, zk_client, start_worker):
    junk = plant(backend, zk_client, "junk", b"x")
    job, parked = parked_job(backend, zk_client)
    listed = json.loads(zktasks("dead-letters", "--json"))
    assert {e["name"] for e in listed} == {junk, parked}
    assert {e["job_id"] for e in listed} == {None, job.id}
    assert "requeue ENTRY" in zktasks("dead-letters")

    with pytest.raises(CommandError, match="refers to no job"):
        zktasks("requeue", junk)
    assert f"Re-queued job {job.id}" in zktasks("requeue", parked)
    start_worker()
    assert job.wait(timeout=30).return_value == 5
    assert "Discarded dead letter" in zktasks("discard", junk)
    assert json.loads(zktasks("dead-letters", "--json")) == []


def test_drain_asks_a_worker_to_leave(backend, start_worker):
    worker = start_worker()
    assert "is draining" in zktasks("drain", worker.worker_id)
    assert worker.wait_stopped(30), "the worker did not drain and stop"


def test_an_unreachable_ensemble_is_an_error_that_names_it(settings):
    hosts = f"127.0.0.1:{free_port()}"
    settings.TASKS = zk_tasks_setting(hosts, "/zktasks-nowhere", CONNECT_TIMEOUT=1.0)
    for args in (("status",), ("show", "0" * 32), ("retry", "0" * 32)):
        with pytest.raises(CommandError, match=hosts):
            zktasks(*args)


def test_help_lists_the_actions():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    top = subprocess.run([sys.executable, "-m", "django", "zktasks", "--help"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=60)
    assert top.returncode == 0, top.stderr
    for action in ("status", "show", "retry", "cancel", "purge", "drain", "dead-letters",
                   "requeue", "discard"):
        assert action in top.stdout
    purge = subprocess.run([sys.executable, "-m", "django", "zktasks", "purge", "--help"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert purge.returncode == 0 and "--older-than SECONDS" in purge.stdout
