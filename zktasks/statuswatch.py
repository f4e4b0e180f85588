"""One watch function per job status znode and client, shared by every waiter.

`result.wait()` reads the job's status znode with a one-shot watch and sleeps until it
fires (rule 7: each waiter watches its own job). kazoo keeps a client's watch functions
for a path in a set until the znode changes, adding the function of every read that
succeeds. A new function per wait grew that set in two ways: a wait that timed out left
its own (a view long-polling `wait(timeout=25)` on a job that waits for hours in a
backlog: 300 polls, 300 functions, each holding its Event), and so did every wait() on
a finished job, whose record changes only at RESULT_TTL (a day) or on a retry.

So the watch function of a path is a value: every `_Watch` for the same client and path
equals the others, kazoo's set keeps one of them, and whichever fires wakes the waiters
registered for the path at the time. Nothing here needs to know whether kazoo still
holds one: the table holds only wakers, and a path's entry goes with its last waiter.
"""

import threading
from collections.abc import Callable

from .handler import inline_watch


class StatusWatches:
    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[tuple[int, str], set[Callable[[], None]]] = {}

    def join(self, client, path: str, waker: Callable[[], None]) -> Callable:
        """Register `waker` for changes of `path`; return the watch function to read with."""
        key = (id(client), path)
        with self._lock:
            self._entries.setdefault(key, set()).add(waker)
        return _Watch(self, key)

    def leave(self, client, path: str, waker: Callable[[], None], *,
              finished: bool = False) -> None:
        """Drop `waker`, and the path's entry with its last waiter. `finished` changes
        nothing: a watch kazoo still holds for the path is the same value the next
        waiter reads with, so no entry has to be kept for it."""
        key = (id(client), path)
        with self._lock:
            wakers = self._entries.get(key)
            if wakers is None:
                return
            wakers.discard(waker)
            if not wakers:
                del self._entries[key]

    def _fire(self, key: tuple[int, str]) -> None:
        # kazoo's connection thread: only signal (every waker does).
        with self._lock:
            wakers = list(self._entries.get(key, ()))
        for wake in wakers:
            wake()


@inline_watch  # its instances are watch functions run on kazoo's connection thread
class _Watch:
    """The watch function of one (client, path): equal to every other one of them."""

    __slots__ = ("_owner", "_key")

    def __init__(self, owner: StatusWatches, key: tuple[int, str]):
        self._owner = owner
        self._key = key

    def __call__(self, event) -> None:
        self._owner._fire(self._key)

    def __eq__(self, other) -> bool:
        if not isinstance(other, _Watch):
            return NotImplemented
        return self._owner is other._owner and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"<status watch {self._key[1]!r}>"


watches = StatusWatches()
