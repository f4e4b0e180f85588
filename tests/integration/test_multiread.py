"""ZooKeeper's multiRead (zktasks/multiread.py) against the suite's real server: the
status records of many jobs in one request, each read answering as get() would."""

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl

from tests import tasks
from zktasks import store as store_module
from zktasks.exceptions import CorruptRecord
from zktasks.multiread import get_many_async


def test_reads_answer_one_by_one_as_get_does(zk_client, zk_root):
    zk_client.create(f"{zk_root}/a", b"one", makepath=True)
    zk_client.create(f"{zk_root}/empty", b"")
    answers = get_many_async(zk_client, [f"{zk_root}/a", f"{zk_root}/missing",
                                         f"{zk_root}/empty"]).get(timeout=30)
    assert [a.__class__.__name__ for a in answers] == ["tuple", "NoNodeError", "tuple"]
    for path, answer in zip((f"{zk_root}/a", f"{zk_root}/empty"), (answers[0], answers[2]),
                            strict=True):
        data, stat = zk_client.get(path)
        assert answer == (data, stat)


def test_a_read_the_acl_forbids_fails_alone(zk_client, zk_root):
    zk_client.create(f"{zk_root}/open", b"x", makepath=True)
    zk_client.create(f"{zk_root}/closed", b"y",
                     acl=[make_digest_acl("someone", "else", all=True)])
    answers = get_many_async(zk_client, [f"{zk_root}/closed", f"{zk_root}/open"]).get(
        timeout=30)
    assert isinstance(answers[0], NoAuthError) and answers[1][0] == b"x"


def test_paths_are_under_the_clients_chroot(zk_client, zk_hosts, zk_root):
    from kazoo.client import KazooClient

    zk_client.create(f"{zk_root}/x", b"chrooted", makepath=True)
    chrooted = KazooClient(hosts=f"{zk_hosts}{zk_root}")
    chrooted.start(timeout=15.0)
    try:
        [answer] = get_many_async(chrooted, ["/x"]).get(timeout=30)
    finally:
        chrooted.stop()
        chrooted.close()
    assert answer[0] == b"chrooted"


@pytest.mark.parametrize("multi", [None, False], ids=["multiread", "one-by-one"])
def test_status_reads_of_a_batch(backend, zk_client, monkeypatch, multi):
    """read_statuses gives the same answers with and without multiRead, across more
    than one multiRead (MULTI_READ_BATCH 4 here): records, a missing one, garbage.
    Unknown at first (None), the server's support is probed once: this one has it."""
    monkeypatch.setattr(store_module, "MULTI_READ_BATCH", 4)
    store = backend.store
    store._multi_read = multi
    results = [tasks.add.submit(n, 1) for n in range(9)]
    garbage = results[3].id
    zk_client.set(store.layout.status(garbage), b"not a record")
    missing = results[0].id[:-4] + "beef"
    ids = [r.id for r in results] + [missing]
    fetch = store.read_statuses(ids)
    for result in results:
        if result.id == garbage:
            with pytest.raises(CorruptRecord):
                fetch(result.id)
            continue
        found = fetch(result.id)
        direct = store.read_status(result.id)
        assert (found.record, found.version) == (direct.record, direct.version)
    assert fetch(missing) is None
    assert store._multi_read is (multi is None)
