"""One watch function per job status znode and client, shared by every waiter.

`result.wait()` reads the job's status znode with a one-shot watch and sleeps until it
fires (rule 7: each waiter watches its own job). kazoo keeps a client's watch functions
for a path in a set until the znode changes; a wait that times out leaves its function
there. A view that long-polls `wait(timeout=25)` on a job that waits for hours in a
backlog added one function (and the Event it holds) per poll: 300 polls, 300 functions.
Here the function for a path is made once and wakes whichever waiters are registered at
the time, so kazoo's set holds one, and a waiter that leaves only drops its waker.

An entry goes once its watch fires with nobody waiting, or once a waiter sees the job
finished (no change will come).
"""

import threading
from collections.abc import Callable

from .handler import inline_watch


class StatusWatches:
    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[tuple[int, str], tuple[Callable, set[Callable]]] = {}

    def join(self, client, path: str, waker: Callable[[], None]) -> Callable:
        """Register `waker` for changes of `path`; return the watch function to read with."""
        key = (id(client), path)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = (self._watch_for(key), set())
            entry[1].add(waker)
            return entry[0]

    def leave(self, client, path: str, waker: Callable[[], None], *,
              finished: bool = False) -> None:
        """Drop `waker`; with `finished`, drop the entry too once nobody else waits."""
        key = (id(client), path)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry[1].discard(waker)
            if finished and not entry[1]:
                del self._entries[key]

    def _watch_for(self, key):
        @inline_watch
        def on_change(event):
            # kazoo's connection thread: only signal (every waker does).
            with self._lock:
                entry = self._entries.get(key)
                wakers = list(entry[1]) if entry is not None else []
                if entry is not None and entry[0] is on_change and not wakers:
                    del self._entries[key]  # fired for nobody: kazoo forgot it too
            for wake in wakers:
                wake()

        return on_change


watches = StatusWatches()
