"""Watch functions marked `inline_watch` run on kazoo's connection thread, others on its
callback thread, against a real ZooKeeper (handler.py)."""

import logging
import threading
import traceback

from kazoo.client import KazooClient

from zktasks.handler import SelectorCachingHandler, inline_watch


def connect(hosts: str) -> KazooClient:
    client = KazooClient(hosts=hosts, handler=SelectorCachingHandler())
    client.start(timeout=15)
    return client


def callers() -> set[str]:
    return {frame.name for frame in traceback.extract_stack()}


def test_an_inline_watch_runs_on_the_connection_thread_and_others_on_kazoos(zk_hosts,
                                                                             zk_root):
    client = connect(zk_hosts)
    try:
        client.ensure_path(zk_root)
        seen = {}
        fired = {"inline": threading.Event(), "plain": threading.Event()}

        @inline_watch
        def inline(event):
            seen["inline"] = (event.path, threading.get_ident(), callers())
            fired["inline"].set()

        def plain(event):
            seen["plain"] = (event.path, threading.get_ident(), callers())
            fired["plain"].set()

        client.get_children(zk_root, watch=inline)
        client.get(zk_root, watch=plain)
        client.create(f"{zk_root}/a")        # fires the children watch
        client.set(zk_root, b"changed")      # fires the data watch
        assert fired["inline"].wait(10) and fired["plain"].wait(10)

        inline_path, inline_thread, inline_stack = seen["inline"]
        plain_path, plain_thread, plain_stack = seen["plain"]
        assert inline_path == plain_path == zk_root
        assert "_read_watch_event" in inline_stack  # called from the connection loop
        assert "_read_watch_event" not in plain_stack  # from kazoo's callback queue
        assert len({inline_thread, plain_thread, threading.get_ident()}) == 3
    finally:
        client.stop()
        client.close()


def test_a_failing_inline_watch_is_logged_and_the_connection_goes_on(zk_hosts, zk_root,
                                                                     caplog):
    client = connect(zk_hosts)
    try:
        client.ensure_path(zk_root)
        fired = threading.Event()

        @inline_watch
        def broken(event):
            raise RuntimeError("a bug in a watch function")

        @inline_watch
        def working(event):
            fired.set()

        client.get_children(zk_root, watch=broken)
        with caplog.at_level(logging.ERROR, logger="zktasks.handler"):
            client.create(f"{zk_root}/a")
            # Still connected and answering: the next watch fires as usual.
            client.get_children(zk_root, watch=working)
            client.create(f"{zk_root}/b")
            assert fired.wait(10)
        assert client.connected
        assert sorted(client.get_children(zk_root)) == ["a", "b"]
        assert [str(r.exc_info[1]) for r in caplog.records
                if r.name == "zktasks.handler"] == ["a bug in a watch function"]
    finally:
        client.stop()
        client.close()
