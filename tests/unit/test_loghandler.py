"""runworker's own log handler: quiet lines and warnings go out at once, busy INFO lines
leave together within the delay, and nothing is lost or reordered on flush or close."""

import io
import logging
import time

import pytest

from tests.waiting import wait_until
from zktasks.loghandler import GroupingStreamHandler


class CountingStream(io.StringIO):
    def __init__(self):
        super().__init__()
        self.writes = 0

    def write(self, text):
        self.writes += 1
        return super().write(text)


@pytest.fixture
def log():
    made = []

    def make(delay):
        stream = CountingStream()
        handler = GroupingStreamHandler(stream, delay=delay)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        logger = logging.getLogger(f"zktasks.test-loghandler-{len(made)}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        made.append((logger, handler))
        return logger, handler, stream

    yield make
    for logger, handler in made:
        logger.removeHandler(handler)
        handler.close()


def test_a_quiet_line_is_written_at_once_and_busy_ones_wait_for_a_warning(log):
    # A delay longer than the machine has been up (monotonic() counts from boot): the
    # first line still goes at once. The flusher would wait that long: it plays no part.
    logger, _, stream = log(delay=time.monotonic() + 3600)
    logger.info("one")
    assert stream.getvalue() == "INFO one\n"  # nothing written for `delay`: at once
    logger.info("two")
    logger.info("three")
    assert stream.getvalue() == "INFO one\n"  # held: one was written just now
    logger.warning("four")
    assert stream.getvalue() == "INFO one\nINFO two\nINFO three\nWARNING four\n"
    assert stream.writes == 2  # the held lines left in one write, with the warning


def test_flush_and_close_write_what_is_held(log):
    logger, handler, stream = log(delay=3600)
    logger.info("a")
    logger.info("b")
    handler.flush()
    assert stream.getvalue() == "INFO a\nINFO b\n"
    logger.info("c")
    handler.close()
    assert stream.getvalue() == "INFO a\nINFO b\nINFO c\n"


def test_the_flusher_writes_held_lines_when_no_other_line_comes(log):
    logger, _, stream = log(delay=0.05)
    logger.info("first")
    logger.info("held")
    wait_until(lambda: stream.getvalue().endswith("INFO held\n"), timeout=10,
               message="the flusher to write the held line")
    assert stream.getvalue() == "INFO first\nINFO held\n"


def test_a_line_that_cannot_be_formatted_is_reported_and_no_other_line_is_lost(log, capsys):
    logger, handler, stream = log(delay=3600)
    logger.info("first")
    logger.info("held")  # waits: "first" was written just now
    # Straight to the handler: pytest's own capture handlers would fail the test first.
    bad = logging.LogRecord("x", logging.INFO, __file__, 1, "%d", ("not a number",), None)
    handler.handle(bad)  # logging reports it (raiseExceptions) on stderr
    assert "--- Logging error ---" in capsys.readouterr().err
    logger.warning("fine")
    assert stream.getvalue() == "INFO first\nINFO held\nWARNING fine\n"


@pytest.mark.parametrize("created", [1e9 + 0.999, 1.7e9 + 0.0004, 1.7e9 + 59.5])
def test_the_formatter_writes_the_same_time_as_loggings_own(created):
    """Formatter makes the date and clock once a second: the text is logging's own, for
    a second it has seen before and for the next one."""
    from zktasks.loghandler import LOG_FORMAT, Formatter

    ours, theirs = Formatter(LOG_FORMAT), logging.Formatter(LOG_FORMAT)
    for at in (created, created + 0.25, created + 1.0, created):
        record = logging.LogRecord("zktasks.worker", logging.INFO, __file__, 1,
                                   "job succeeded job=%s", ("x",), None)
        record.created, record.msecs = at, int((at - int(at)) * 1000)
        assert ours.format(record) == theirs.format(record)
    dated = Formatter(LOG_FORMAT, datefmt="%H:%M")
    assert dated.format(record) == logging.Formatter(LOG_FORMAT, "%H:%M").format(record)
