"""A one-shot latch on a bare lock: threading.Event's set() and wait(), cheaper.

Every job crosses threads several times in a worker (a runner waits for its start to be
written, a caller for kazoo's reply), and threading.Event does each crossing through a
Condition: Python code that allocates a lock per wait and walks a list of waiters per
set. A latch that opens once needs none of that: it is a lock taken at birth, released
by set(); a waiter takes it and hands it straight back, so every later waiter passes.
All of it runs in C. It cannot be cleared, which is all a one-shot signal needs.
"""

import threading


class Latch:
    __slots__ = ("_lock", "_set")

    def __init__(self):
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        try:
            self._lock.release()
        except RuntimeError:
            pass  # a racing set() released it first

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set (or `timeout` seconds); return whether it is set."""
        if self._set:
            return True
        if self._lock.acquire(True, -1 if timeout is None else max(0.0, timeout)):
            try:
                self._lock.release()  # pass it on to the next waiter
            except RuntimeError:
                pass  # a racing set() released it while we held it: open either way
        return self._set
