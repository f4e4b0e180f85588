"""Imported by nothing but a fork server told to preload it (tests/unit/test_fork_server.py):
a task process that finds it in sys.modules is a fork of a server that preloaded it."""
