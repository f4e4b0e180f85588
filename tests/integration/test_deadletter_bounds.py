"""The leader bounds the dead-letter place: entries older than DEAD_LETTER_TTL go, then
the oldest beyond DEAD_LETTER_LIMIT, with a warning that says what keeps writing."""

import logging

import pytest

from tests import tasks
from tests.conftest import use_zookeeper
from tests.waiting import wait_for_children
from zktasks import deadletter, records
from zktasks.tree import dead_letter_name

TTL = 3600
LIMIT = 3


@pytest.fixture
def zk_settings(settings, zk_hosts, zk_root, monkeypatch):
    return use_zookeeper(settings, monkeypatch, zk_hosts, zk_root,
                         DEAD_LETTER_TTL=TTL, DEAD_LETTER_LIMIT=LIMIT)


def plant(backend, zk_client, at_ms: int, kind="foreign_name", job_id=None) -> str:
    """An entry as a worker writes one, dated `at_ms` (its name carries the time)."""
    name = dead_letter_name(at_ms)
    data = deadletter.encode("/elsewhere/garbage", b"\x00junk", kind=kind,
                             reason="planted by the test", by="test", job_id=job_id,
                             keep=1024)
    zk_client.create(backend.store.layout.dead_letter(name), data, makepath=True)
    return name


def test_the_leader_expires_old_dead_letters_and_keeps_the_newest_within_the_limit(
        backend, start_worker, zk_client, caplog):
    caplog.set_level(logging.INFO, logger="zktasks")
    now_ms = int(records.now().timestamp() * 1000)
    too_old = plant(backend, zk_client, now_ms - 2 * TTL * 1000)
    # The only place a READY job waits (an assignment that did not decode): held.
    record, waiting = backend.prepare(tasks.add, (1, 2), {})
    zk_client.create(backend.store.layout.status(record.id), record.to_bytes(),
                     makepath=True)
    held = plant(backend, zk_client, now_ms - 2 * TTL * 1000 + 1,
                 kind="unreadable_assignment", job_id=record.id)
    recent = sorted(plant(backend, zk_client, now_ms - (10 - i) * 1000) for i in range(5))
    assert len(backend.dead_letters(10)) == 7

    start_worker()  # leads: its first sweep runs at once
    wait_for_children(zk_client, backend.store.layout.deadletter,
                      lambda names: sorted(names) == [held, *recent[-LIMIT:]], timeout=30)
    assert too_old not in {e.name for e in backend.dead_letters(10)}
    messages = [r.getMessage() for r in caplog.records]
    assert any("expired dead letters count=1" in m for m in messages), messages
    assert any("deleted the 2 oldest dead letters" in m and "DEAD_LETTER_LIMIT=3" in m
               for m in messages), messages
    assert any("kept 1 dead letters" in m for m in messages), messages

    # Re-queued by a person, the job runs: nothing was lost.
    assert backend.requeue_dead_letter(held) == record.id
    assert waiting.wait(timeout=30).return_value == 3
