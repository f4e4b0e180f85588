"""Wait on ZooKeeper watches and conditions with deadlines (never a bare sleep)."""

import json
import threading
import time


def wait_for_data(zk_client, path, predicate, timeout=30.0):
    """Block until the JSON data at `path` satisfies `predicate`, via a DataWatch."""
    matched = threading.Event()
    seen = {}

    def on_data(data, stat):
        if data is None:
            return True
        try:
            value = json.loads(data)
        except ValueError:
            return True
        seen["last"] = value
        if predicate(value):
            matched.set()
            return False  # stop watching
        return True

    zk_client.DataWatch(path, on_data)
    assert matched.wait(timeout), f"{path} never matched; last seen {seen.get('last')!r}"
    return seen["last"]


def wait_for_children(zk_client, path, predicate, timeout=30.0):
    """Block until the children of `path` satisfy `predicate`, via a ChildrenWatch."""
    matched = threading.Event()
    seen = {}

    def on_children(children):
        seen["last"] = children
        if predicate(children):
            matched.set()
            return False
        return True

    zk_client.ensure_path(path)
    zk_client.ChildrenWatch(path, on_children)
    assert matched.wait(timeout), f"children of {path} never matched; last {seen.get('last')!r}"
    return seen["last"]


def wait_until(predicate, timeout=30.0, message="condition"):
    """Poll a local condition (no watch exists for it) until true or the deadline."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {message}"
        pause.wait(0.02)


def wait_for_deletion(zk_client, path, timeout=30.0):
    """Block until the znode at `path` does not exist, via a DataWatch."""
    gone = threading.Event()

    def on_data(data, stat):
        if stat is None:
            gone.set()
            return False
        return True

    zk_client.DataWatch(path, on_data)
    assert gone.wait(timeout), f"{path} still exists after {timeout:g}s"
