"""Fixtures shared by the suite. The ZooKeeper fixtures (zookeeper, zk_hosts, zk_root,
zk_client, zk_ensemble) come from the zktasks.testing plugin."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def zk_tasks_setting(hosts: str, root: str, **options) -> dict:
    return {
        "default": {
            "BACKEND": "zktasks.backend.ZooKeeperBackend",
            "QUEUES": options.pop("queues", []),
            "OPTIONS": {"HOSTS": hosts, "ROOT": root, "SESSION_TIMEOUT": 4.0,
                        "CONNECT_TIMEOUT": 10.0, **options},
        }
    }


def use_zookeeper(settings, monkeypatch, hosts: str, root: str, **options):
    """Point TASKS (and runworker subprocesses, through the environment) at hosts/root.

    Test modules that need another server or other options override `zk_settings` with
    a fixture calling this.
    """
    settings.TASKS = zk_tasks_setting(hosts, root, **options)
    monkeypatch.setenv("ZKTASKS_TEST_HOSTS", hosts)
    monkeypatch.setenv("ZKTASKS_TEST_ROOT", root)
    return settings


def impatient(store, seconds: float = 1.0):
    """Make `store` give up on ZooKeeper after `seconds` (its CONNECT_TIMEOUT: bounded
    calls, pipelined multis) from now on; return a function that puts its own back.

    For the frozen part of a test only: the first connect and the first writes to a
    freshly started server keep the generous bound, which a loaded machine may need.
    """
    generous = store.options
    store.options = dataclasses.replace(generous, connect_timeout=seconds)

    def restore() -> None:
        store.options = generous

    return restore


@pytest.fixture(autouse=True)
def _fresh_live_states():
    """Each test starts and ends without a dashboard live cache of an earlier test: its
    thread and watches would keep reading (and counting in watch tallies) meanwhile."""
    from zktasks import dashboard

    dashboard.reset_live_states()
    yield
    dashboard.reset_live_states()


@pytest.fixture
def own_server():
    """A ZooKeeper server of the test's own, for tests that stop, freeze or restart it
    (the suite's server is shared by every test)."""
    from zktasks.testing import ZooKeeperServer

    server = ZooKeeperServer().start()
    yield server
    server.close()


@pytest.fixture
def zk_settings(settings, zk_hosts, zk_root, monkeypatch):
    """Point the default task backend at a fresh root of the suite's ZooKeeper."""
    return use_zookeeper(settings, monkeypatch, zk_hosts, zk_root)


@pytest.fixture
def backend(zk_settings):
    from django.tasks import task_backends

    return task_backends["default"]


@pytest.fixture
def start_worker(zk_worker):
    """The plugin's zk_worker (in-process workers, thread pool by default), under the
    name this suite grew up with."""
    return zk_worker


@pytest.fixture
def runworker(zk_settings, tmp_path):
    """Start `manage.py runworker` subprocesses with the test's settings."""
    procs = []

    def start(*args, name=None, settings="tests.settings", env=None, own_group=False):
        """`own_group`: in a process group of its own (signal it with os.killpg)."""
        env = {**os.environ, **(env or {})}
        env["DJANGO_SETTINGS_MODULE"] = settings
        env.setdefault("ZKTASKS_LOG_LEVEL", "INFO")
        log = tmp_path / f"worker-{len(procs)}.log"
        cmd = [sys.executable, "-m", "django", "runworker", "-v", "2", *args]
        if name:
            cmd += ["--name", name]
        handle = open(log, "wb")  # noqa: SIM115 - closed in teardown
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                **({"process_group": 0} if own_group else {}))
        proc.log_path = log
        proc.log_handle = handle
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)
        proc.log_handle.close()
