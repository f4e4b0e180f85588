"""A schedule's state in ZooKeeper (`schedules/{name}`), and what people do to it.

The state is a small JSON object: `last_tick` (the last tick that got its job), and,
when set, `paused` (the leader submits no ticks) and `error`/`error_at` (why the last
attempted tick failed, noted by the leader). The leader advances `last_tick` in the
multi that creates a tick's job (store.submit_tick), with the version it read, so a
pause or resume landing meanwhile makes that multi fail and the leader read again:
a paused schedule never gets one more tick.

Pause and resume are versioned read-modify-writes, retried on a concurrent change.
Resuming records the current tick as done, so a pause is a gap, not a backlog: the
ticks it skipped are not run on resume (Celery beat's disabled entries work the same).
"Run now" submits an ordinary job of the schedule's task and arguments (its own id),
outside the ticks: the schedule's state does not change.
"""

from datetime import datetime

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from . import records
from .exceptions import CorruptRecord, ZkTasksError

ATTEMPTS = 20  # read-modify-writes tried against concurrent writers before giving up


def read(store, name: str) -> tuple[dict, int | None]:
    """The state and its znode's version; ({}, None) when no leader has recorded it."""
    path = store.layout.schedule(name)
    try:
        raw, stat = store.retry(store.client.get, path)
    except NoNodeError:
        return {}, None
    return records.loads(raw, path=path), stat.version


def last_tick(state: dict, path: str = "") -> datetime | None:
    """The state's last tick; None for a schedule no leader has started. CorruptRecord
    if it is not a time with its zone (as the leader writes it)."""
    value = state.get("last_tick")
    if value is None:
        return None
    try:
        tick = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        tick = None
    if tick is None or tick.tzinfo is None:
        raise CorruptRecord(f"The znode {path} holds no last tick zktasks wrote: "
                            f"{str(value)[:80]!r}.")
    return tick


def _update(store, name: str, change) -> bool:
    """Apply `change(state) -> new state or None (no change)`; return whether it wrote."""
    path = store.layout.schedule(name)
    tried = None
    store.catch_up()  # as the last pause or resume left it, whoever made it
    for _ in range(ATTEMPTS):
        state, version = read(store, name)
        if tried is not None and state == tried:
            # Our write landed, its answer lost with the connection: the retry met our
            # own version (rule 4). Without this, pause() said "paused already".
            return True
        new = change(dict(state))
        if new is None:
            return False
        tried = new
        try:
            if version is None:
                store.ensure_skeleton()
                store.retry(store.client.create, path, records.dumps(new))
            else:
                store.retry(store.client.set, path, records.dumps(new), version=version)
            return True
        except (BadVersionError, NodeExistsError, NoNodeError):
            continue  # the leader (or another person) wrote meanwhile: read again
    raise ZkTasksError(f"The state of schedule {name!r} kept changing under {ATTEMPTS} "
                       "attempts to update it; try again.")


def pause(store, name: str) -> bool:
    """Stop the schedule's ticks; False if it was paused already."""
    def change(state):
        if state.get("paused"):
            return None
        return {**state, "paused": True, "paused_at": records.now().isoformat()}
    return _update(store, name, change)


def resume(store, schedule, now: datetime | None = None) -> bool:
    """Let the schedule tick again from its next tick; False if it was not paused.

    The current tick is recorded as its last (unless a later one is), so the ticks
    skipped while paused do not come back as one catch-up job.
    """
    now = now or records.now()

    def change(state):
        if not state.get("paused"):
            return None
        latest = schedule.latest_tick(now)
        last = last_tick(state, store.layout.schedule(schedule.name))
        return {"last_tick": max(latest, last).isoformat() if last else latest.isoformat()}
    return _update(store, schedule.name, change)
