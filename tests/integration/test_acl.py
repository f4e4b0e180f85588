"""With AUTH set, every znode zktasks creates is readable and writable only with it."""

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl

from tests import tasks
from tests.conftest import zk_tasks_setting


@pytest.fixture
def zk_settings(settings, zk_hosts, zk_root, monkeypatch):
    """Overrides the suite's fixture: the backend authenticates as alice."""
    settings.TASKS = zk_tasks_setting(zk_hosts, zk_root, AUTH="alice:secret")
    return settings


def walk(client, path):
    yield path
    for child in client.get_children(path):
        yield from walk(client, f"{path}/{child}")


def test_every_znode_carries_the_digest_acl_and_strangers_are_refused(
        backend, start_worker, zk_hosts, zk_root):
    worker = start_worker()
    job = tasks.add.submit(1, 2)
    assert job.wait(timeout=30).return_value == 3
    worker.stop(graceful=False)  # a static tree to walk
    assert worker.wait_stopped(15)
    pending = tasks.add.submit(3, 4)
    owner = KazooClient(hosts=zk_hosts, auth_data=[("digest", "alice:secret")])
    stranger = KazooClient(hosts=zk_hosts)
    owner.start(timeout=10)
    stranger.start(timeout=10)
    try:
        paths = [p for p in walk(owner, zk_root)]
        assert len(paths) > 6
        for path in paths:
            acls, _ = owner.get_acls(path)
            owners = [(a.id.scheme, a.id.id.split(":")[0]) for a in acls]
            assert owners == [("digest", "alice")], path
        with pytest.raises(NoAuthError):
            stranger.get(backend.store.layout.status(job.id))
        with pytest.raises(NoAuthError):
            stranger.create(f"{backend.store.layout.queue('default')}/100-{'0' * 32}", b"x")
    finally:
        owner.delete(zk_root, recursive=True)  # the plugin's cleanup has no credentials
        owner.stop()
        owner.close()
        stranger.stop()
        stranger.close()
    assert pending.status == "READY"


def test_a_root_made_before_auth_was_set_is_reported_open(backend, start_worker, zk_hosts,
                                                          zk_root, caplog):
    """kazoo's default ACL applies to znodes made from then on: a ROOT that existed
    before AUTH was set stays open to anyone, and the worker says how to close it."""
    owner = KazooClient(hosts=zk_hosts, auth_data=[("digest", "alice:secret")])
    owner.start(timeout=10)
    try:
        owner.ensure_path(f"{zk_root}/status", acl=OPEN_ACL_UNSAFE)  # as before AUTH
        worker = start_worker()
        opened = [r.getMessage() for r in caplog.records
                  if r.levelname == "ERROR" and "open to anyone" in r.getMessage()]
        assert len(opened) == 1
        assert f"setAcl -R {zk_root} auth::cdrwa" in opened[0]
        assert f"{zk_root}/status" in opened[0] and "secret" not in opened[0]
        worker.stop(graceful=False)
        assert worker.wait_stopped(15)
        # What setAcl -R does, for the paths the worker checks: nothing is reported then.
        for path in walk(owner, zk_root):
            owner.set_acls(path, [make_digest_acl("alice", "secret", all=True)])
        assert backend.store.open_to_anyone() == []
    finally:
        owner.delete(zk_root, recursive=True)  # the plugin's cleanup has no credentials
        owner.stop()
        owner.close()
