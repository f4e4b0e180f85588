import pytest

from zktasks.executor import ProcessRunner


@pytest.fixture
def process_runner():
    """A ProcessRunner with one real task process (no ZooKeeper involved)."""
    runner = ProcessRunner(1)
    runner.start()
    yield runner
    runner.stop()
