"""`manage.py zktasks`: the overview, one job, and the operator's actions, from a shell."""

import io
import json
import os
import re
import signal
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command
from django.tasks import TaskResultStatus

from tests import tasks
from tests.conftest import REPO, use_zookeeper, zk_tasks_setting
from tests.dashboard.test_deadletters import parked_job, plant
from tests.waiting import wait_for_children, wait_until
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
    wait_until(lambda: json.loads(zktasks("status", "--json"))["leader"], 60, "a leader")

    data = json.loads(zktasks("status", "--json"))
    queues = {q["name"]: q for q in data["queues"]}
    assert queues["emails"]["pending"] == 1
    assert (queues["default"]["succeeded"], queues["default"]["failed"]) == (1, 1)
    assert data["totals"]["workers"] == 1 and data["leader"]["worker"] == worker.worker_id
    assert [f["task"] for f in data["recent_failures"]] == ["tests.tasks.boom"]

    text = zktasks("status")
    assert worker.worker_id in text and "leader: " + worker.worker_id in text
    assert ("1 pending, 0 delayed, 0 assigned (running, or held by a worker), "
            "1 succeeded, 1 failed") in text
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
    for not_a_name in ("..", ".", "a/b"):  # kazoo raised ValueError on the first two
        with pytest.raises(CommandError, match="No worker .* is registered"):
            zktasks("drain", not_a_name)
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


def test_cancel_pending_empties_a_queue_and_leaves_delayed_jobs(backend, zk_client):
    from datetime import timedelta

    from django.utils import timezone

    from tests.pending import pending_nodes

    waiting = tasks.add.submit_many([((i, i), {}) for i in range(30)])
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).submit(1, 1)
    with pytest.raises(CommandError, match="cancels about 30 job.*--yes"):
        zktasks("cancel-pending", "default")  # no terminal: it only counts
    assert len(pending_nodes(zk_client, backend.store.layout)) == 30
    out = json.loads(zktasks("cancel-pending", "default", "--yes", "--json"))
    assert out == {"queue": "default", "cancelled": 30}
    assert pending_nodes(zk_client, backend.store.layout) == []
    for job in waiting:
        job.refresh()
        assert job.status == TaskResultStatus.FAILED and job.worker_ids == []
        assert job.errors[-1].exception_class_path == "zktasks.exceptions.JobCancelled"
    later.refresh()
    assert later.status == TaskResultStatus.READY


def test_cancel_pending_never_sends_a_multi_over_the_request_limit(backend):
    """Four records of ~400 KB: one multi would be 1.6 MB, over jute.maxbuffer, which
    ZooKeeper answers by dropping the connection (retried until CONNECT_TIMEOUT)."""
    jobs = [tasks.add.submit(os.urandom(300_000), b"") for _ in range(4)]
    assert backend.cancel_pending("default") == 4
    for job in jobs:
        job.refresh()
        assert job.status == TaskResultStatus.FAILED


def test_cancel_pending_beside_running_workers_cancels_or_runs_each_job_once(
        backend, start_worker):
    """The leader assigns while the queue is emptied: every job either ran (and was
    never cancelled) or was cancelled (and never ran), never both, never neither."""
    start_worker(concurrency=2)
    jobs = tasks.short_sleep.submit_many([((0.005,), {}) for _ in range(400)])
    cancelled = backend.cancel_pending("default")
    for job in jobs:
        job.wait(timeout=60)
    ran = [j for j in jobs if j.status == TaskResultStatus.SUCCESSFUL]
    stopped = [j for j in jobs if j.status == TaskResultStatus.FAILED]
    assert len(ran) + len(stopped) == len(jobs)
    assert len(stopped) == cancelled
    assert all(j.worker_ids == [] and len(j.errors) == 1 for j in stopped)
    assert all(j.errors == [] for j in ran)


class _Terminal(io.StringIO):
    """What the user types at a terminal: stdin that is a tty."""

    def isatty(self):
        return True


def test_purge_at_a_terminal_asks_and_takes_no_for_an_answer(backend, start_worker,
                                                             monkeypatch, capsys):
    start_worker()
    ok = tasks.add.submit(1, 2)
    ok.wait(timeout=30)
    monkeypatch.setattr("sys.stdin", _Terminal("no\n"))
    with pytest.raises(CommandError, match="Nothing deleted"):
        zktasks("purge")
    assert backend.store.read_status(ok.id) is not None
    monkeypatch.setattr("sys.stdin", _Terminal("yes\n"))
    # The question goes to stderr: with --json, stdout is the JSON alone (| jq).
    out = zktasks("purge", "--json")
    assert json.loads(out)["purged"] == 1
    asked = capsys.readouterr().err
    assert "This deletes about 1 SUCCESSFUL and FAILED results" in asked
    assert "Type 'yes' to go ahead" in asked
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


def test_dead_letters_page_past_one_listing(backend, zk_client):
    """--limit was capped at 200 without a word, and there was no way to see the rest."""
    planted = sorted((plant(backend, zk_client, f"junk{i}", b"x") for i in range(3)),
                     reverse=True)  # newest first
    first = zktasks("dead-letters", "--limit", "2")
    assert f"more: add --after {planted[1]}" in first
    # Exactly --limit left: no "more" that leads to nothing.
    last = zktasks("dead-letters", "--limit", "1", "--after", planted[1])
    assert planted[2] in last and "more:" not in last and "(the first" not in last
    rest = json.loads(zktasks("dead-letters", "--after", planted[1], "--json"))
    assert [e["name"] for e in rest] == planted[2:]
    with pytest.raises(CommandError, match="must be at most 200"):
        zktasks("dead-letters", "--limit", "500")


def test_discarding_the_only_place_a_job_waits_says_the_job_was_failed(backend, zk_client):
    job, parked = parked_job(backend, zk_client)
    out = json.loads(zktasks("discard", parked, "--json"))
    assert out == {"entry": parked, "discarded": True, "failed_job": job.id}
    assert job.wait(timeout=5).status == "FAILED"
    junk = plant(backend, zk_client, "junk", b"x")
    assert zktasks("discard", junk).strip() == f"Discarded dead letter {junk}."


def test_escape_sequences_in_a_tasks_error_do_not_reach_the_terminal(backend, start_worker,
                                                                    caplog):
    evil = "\x1b]0;retitled\x07\x1b[2Jcleared\nforged line"
    start_worker()
    job = tasks.boom.submit(evil)
    job.wait(timeout=30)
    shown = zktasks("show", job.id)
    assert "\x1b" not in shown and "\\x1b]0;retitled\\x07" in shown
    assert json.loads(zktasks("show", job.id, "--json"))["errors"][-1]["message"] == evil

    def logged():
        return [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("job failed")]
    # The worker logs the failure once it is recorded: maybe just after wait() returned.
    wait_until(logged, 60, "the worker's log line")
    head, *block = logged()[0].split("\n")
    assert "\x1b" not in logged()[0]
    assert "cleared\\nforged line" in head
    # The traceback follows, each line behind "  | ": no line can pass for a log line.
    assert block and all(line.startswith("  | ") for line in block)
    assert "  | forged line" in block and "  | Traceback (most recent call last):" in block


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


# -- the command line itself ----------------------------------------------------------------


def zktasks_and_stderr(*args) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("zktasks", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def django_admin(*args, settings="tests.settings", timeout=120):
    """Run `python -m django ARGS` as a shell would: argv parsed by Django itself."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings}
    return subprocess.run([sys.executable, "-m", "django", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def settings_module(tmp_path, monkeypatch):
    """Write a settings module over tests.settings for subprocesses; return its name."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(tmp_path), str(REPO), os.environ.get("PYTHONPATH")])))

    def write(body: str) -> str:
        name = f"cli_settings_{len(list(tmp_path.glob('cli_settings_*.py')))}"
        (tmp_path / f"{name}.py").write_text(
            "from tests.settings import *  # noqa: F403\n" + body)
        return name
    return write


def test_options_work_before_and_after_the_action(backend):
    tasks.add.submit(1, 1)
    assert json.loads(zktasks("--json", "status"))["totals"]["pending"] == 1
    assert json.loads(zktasks("status", "-v", "2", "--json"))["totals"]["pending"] == 1
    assert json.loads(zktasks("--backend", "nope", "pending", "--backend", "default",
                              "--json"))["total"] == 1
    with pytest.raises(CommandError, match="No task backend 'nope'"):
        zktasks("--backend", "nope", "status")
    # As a shell passes them: Django's own options after the action too.
    done = django_admin("zktasks", "status", "--settings", "tests.settings", "-v", "2",
                        "--traceback", "--no-color", "--skip-checks", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["totals"]["pending"] == 1
    before = django_admin("zktasks", "--json", "--verbosity", "0", "pending", "--limit", "1")
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout)["total"] == 1


def test_a_root_that_does_not_exist_is_said_on_stderr(backend, zk_client):
    assert zk_client.exists(backend.conf.root) is None  # a fresh root: nobody used it
    out, err = zktasks_and_stderr("status", "--json")
    assert json.loads(out)["root_exists"] is False
    assert f"ROOT {backend.conf.root!r} does not exist in ZooKeeper" in err
    for args in (("jobs",), ("pending",), ("dead-letters", "--json")):
        out, err = zktasks_and_stderr(*args)
        assert "does not exist in ZooKeeper" in err, args
    json.loads(out)  # stdout stays JSON
    tasks.add.submit(1, 1)
    out, err = zktasks_and_stderr("status", "--json")
    assert json.loads(out)["root_exists"] is True and err == ""
    assert zktasks_and_stderr("pending")[1] == ""


def test_pending_refuses_a_queue_neither_configured_nor_used(settings, monkeypatch, zk_hosts,
                                                            zk_root):
    use_zookeeper(settings, monkeypatch, zk_hosts, zk_root, queues=["default", "emails"])
    with pytest.raises(CommandError, match=r"Queue 'nosuch' is not in .*QUEUES"):
        zktasks("pending", "nosuch")
    with pytest.raises(CommandError, match="'a/b' is not a valid queue name"):
        zktasks("pending", "a/b")
    job = tasks.email.submit("ada@example.com")
    # Dropped from QUEUES while it still holds jobs: they can be found.
    use_zookeeper(settings, monkeypatch, zk_hosts, zk_root, queues=["default"])
    assert [r["id"] for r in json.loads(zktasks("pending", "emails", "--json"))["rows"]] \
        == [job.id]


def test_pending_paging_hint_offers_only_the_cursor(backend):
    jobs = [tasks.email.submit(f"{i}@example.com") for i in range(3)]
    text = zktasks("pending", "emails", "--limit", "2")
    [hint] = [line for line in text.splitlines() if line.startswith("more:")]
    cursor = hint.removeprefix("more: add --after ")
    assert " " not in cursor  # no "(looked at 0 to find these)"
    rest = json.loads(zktasks("pending", "emails", "--after", cursor, "--json"))
    assert [r["id"] for r in rest["rows"]] == [jobs[2].id]


def test_bad_cursors_are_refused(backend):
    with pytest.raises(CommandError, match="'garbage' is not a cursor of `jobs`"):
        zktasks("jobs", "--after", "garbage")
    with pytest.raises(CommandError, match="'garbage' is not a cursor of `pending`"):
        zktasks("pending", "--after", "garbage")
    with pytest.raises(CommandError, match="is not a cursor of `pending`"):
        zktasks("pending", "--after", f"1700000000000/{'0' * 32}")  # a jobs cursor


@pytest.mark.parametrize("value,match", [
    ("inf", "not a finite number"), ("nan", "not a finite number"),
    ("1e30", "more than 100 years"), ("1e11", "more than 100 years"),
    ("-1", "must not be negative"), ("soon", "not a number of seconds"),
])
def test_absurd_durations_are_refused(value, match):
    with pytest.raises(CommandError, match=match):
        zktasks("purge", "--older-than", value, "--yes")
    with pytest.raises(CommandError, match=match):
        call_command("runworker", "--drain-timeout", value)


def test_runworker_refuses_a_name_that_is_no_znode_name():
    for name in ("a/b", ".hidden", "", "x" * 101):
        with pytest.raises(CommandError, match="is not a valid worker name"):
            call_command("runworker", "--name", name)
    done = django_admin("runworker", "--name", "a/b")
    assert done.returncode == 2 and "NoNodeError" not in done.stderr
    assert "argument --name: 'a/b' is not a valid worker name" in done.stderr


def test_job_ids_in_upper_case_and_not_found_messages(backend):
    job = tasks.add.submit(1, 1)
    assert f"job:       {job.id}" in zktasks("show", job.id.upper())
    for action in ("show", "retry", "cancel"):
        with pytest.raises(CommandError, match=r"No job has the id '0{32}' \(expired") as info:
            zktasks(action, "0" * 32)
        assert ".." not in str(info.value) and "'. (" not in str(info.value)


def test_an_unreachable_ensemble_is_said_in_shell_words(settings):
    hosts = f"127.0.0.1:{free_port()}"
    settings.TASKS = zk_tasks_setting(hosts, "/zktasks-nowhere", CONNECT_TIMEOUT=1.0)
    for args in (("status",), ("show", "0" * 32), ("jobs",), ("pending",),
                 ("dead-letters",)):
        with pytest.raises(CommandError) as info:
            zktasks(*args)
        message = str(info.value)
        assert f"ZooKeeper at {hosts!r} did not answer within 1 s" in message, args
        assert "check TASKS['default']['OPTIONS']['HOSTS']" in message
        assert "this page" not in message


def test_kazoo_stays_quiet_in_the_shell_unless_asked(settings_module):
    hosts = f"127.0.0.1:{free_port()}"
    name = settings_module(
        f"TASKS = {zk_tasks_setting(hosts, '/zktasks-nowhere', CONNECT_TIMEOUT=1.0)!r}\n")
    quiet = django_admin("zktasks", "status", settings=name)
    assert quiet.returncode == 1 and "did not answer within 1 s" in quiet.stderr
    assert "Connection dropped" not in quiet.stderr, quiet.stderr
    loud = django_admin("zktasks", "status", "-v", "2", settings=name)
    assert loud.returncode == 1 and "Connection dropped" in loud.stderr


def test_the_shell_puts_back_the_log_levels_it_quiets(backend):
    import logging

    handler = logging.getLogger("zktasks.handler")
    handler.setLevel(logging.WARNING)  # the project's
    try:
        zktasks("status")
        assert handler.level == logging.WARNING
        assert logging.getLogger("kazoo").level == logging.NOTSET
    finally:
        handler.setLevel(logging.NOTSET)


def test_runworker_without_logging_settings_formats_kazoo_lines(settings_module):
    hosts = f"127.0.0.1:{free_port()}"
    name = settings_module(
        "LOGGING = {}\n"
        f"TASKS = {zk_tasks_setting(hosts, '/zktasks-nowhere', CONNECT_TIMEOUT=1.0)!r}\n")
    done = django_admin("runworker", "--pool", "thread", "--startup-timeout", "1",
                        settings=name)
    assert done.returncode == 1 and "Could not connect to ZooKeeper" in done.stderr
    kazoo = [line for line in done.stderr.splitlines() if "kazoo" in line
             or line.startswith("Connection dropped")]
    assert kazoo, done.stderr
    for line in kazoo:
        assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING kazoo\.", line), line


def test_runworker_keeps_the_projects_log_level(backend, runworker, zk_client, monkeypatch):
    # tests.settings' LOGGING reads the zktasks level from ZKTASKS_LOG_LEVEL; the fixture
    # passes -v 2, which used to force INFO over it.
    monkeypatch.setenv("ZKTASKS_LOG_LEVEL", "WARNING")
    proc = runworker("--pool", "thread", "--concurrency", "1", name="quiet")
    wait_for_children(zk_client, backend.store.layout.workers, lambda c: len(c) == 1, 60)
    assert tasks.add.submit(2, 3).wait(timeout=60).return_value == 5
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    log = proc.log_path.read_text()
    assert "zktasks worker stopped" in log  # the command's own lines still go out
    for info in ("worker registered", "leader elected", "job started", "job succeeded"):
        assert info not in log, log


def test_delayed_lists_waiting_jobs_the_first_due_first(backend):
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    later = tasks.add.using(run_after=now + timedelta(hours=2)).submit(1, 1)
    sooner = tasks.add.using(run_after=now + timedelta(hours=1)).submit(1, 2)
    mail = tasks.email.using(run_after=now + timedelta(hours=3)).submit("a@b.c")
    tasks.add.submit(1, 3)  # ready now: not delayed

    page = json.loads(zktasks("delayed", "--limit", "2", "--json"))
    assert page["total"] == 3 and [r["id"] for r in page["rows"]] == [sooner.id, later.id]
    assert page["rows"][0]["due_at"]
    rest = json.loads(zktasks("delayed", "--after", page["next_cursor"], "--json"))
    assert [r["id"] for r in rest["rows"]] == [mail.id] and rest["next_cursor"] is None
    assert [r["id"] for r in json.loads(zktasks("delayed", "emails", "--json"))["rows"]] \
        == [mail.id]
    text = zktasks("delayed")
    assert "3 job(s) delayed of 3" in text and "DUE" in text and sooner.id in text
    with pytest.raises(CommandError, match="'garbage' is not a cursor of `delayed`"):
        zktasks("delayed", "--after", "garbage")
