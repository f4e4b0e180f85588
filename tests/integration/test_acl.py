"""With AUTH set, every znode zktasks creates is readable and writable only with it."""

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

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
