"""The log handler `runworker` installs when the project configures no logging.

A busy worker logs two lines per job ("job started", "job succeeded"). With
logging.StreamHandler each line is a write() system call, and CPython lets go of the GIL
around every system call: another thread takes it, and the logging thread waits to get
it back. bench/run.py's "switches" column counted about 1.5 of a tuned worker's 8 thread
switches per no-op job there.

This handler writes at once whatever is quiet: a line goes straight out when nothing was
written for `delay` seconds, and every WARNING or worse goes out at once together with
the lines before it. Only under load do INFO lines gather, for at most `delay` (10 ms),
and leave in one write: on the next line past the deadline, or from a flusher thread
woken by the first line held. The price: a worker killed with SIGKILL loses the INFO
lines of its last `delay`; their jobs' states are in ZooKeeper all the same, and a normal
exit (SIGTERM, SIGINT, an error) flushes through logging.shutdown().

logging.handlers.MemoryHandler holds lines too, but only flushes on a count or a level,
so a quiet worker's last lines would wait indefinitely.
"""

import logging
import math
import sys
import threading
import time

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class Formatter(logging.Formatter):
    """logging.Formatter, the same text, with the time's date and clock (asctime without
    its milliseconds) made once a second rather than for every line: time.localtime()
    and strftime() for each of a busy worker's two lines per job were a third of its
    logging's cost (bench --profile). A `datefmt` of one's own is formatted as usual."""

    _second: tuple[int, str] | None = None

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt or not self.default_msec_format:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        cached = self._second
        if cached is None or cached[0] != second:
            text = time.strftime(self.default_time_format, self.converter(record.created))
            cached = self._second = (second, text)  # one tuple: threads see either whole
        return self.default_msec_format % (cached[1], record.msecs)


def format_last_resort(after: logging.Handler | None = None) -> None:
    """Give the records no handler takes (Python's last resort: WARNING and worse, as a
    bare message) our timestamped format, in a process whose project configures no
    logging: a task's own `logging.getLogger(__name__).warning(...)` then reads like the
    worker's lines. Only logging.lastResort changes, so a logger the project did
    configure is left alone, and nothing is printed twice.

    `after`: a handler holding lines back (runworker's GroupingStreamHandler), flushed
    before each such record, so that it never comes out ahead of earlier lines.
    """
    if logging.getLogger().handlers:
        return  # the project's root handlers take everything that propagates
    handler = _LastResort(sys.stderr, after=after)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(Formatter(LOG_FORMAT))
    logging.lastResort = handler


class _LastResort(logging.StreamHandler):
    def __init__(self, stream, *, after: logging.Handler | None):
        super().__init__(stream)
        self.after = after

    def emit(self, record: logging.LogRecord) -> None:
        if self.after is not None:
            self.after.flush()
        # sys.stderr as it is now, as Python's own last resort writes: a redirect (or a
        # stream replaced and closed since) would otherwise be missed for good.
        self.stream = sys.stderr
        super().emit(record)


class GroupingStreamHandler(logging.StreamHandler):
    def __init__(self, stream=None, *, delay: float = 0.01, flush_level: int = logging.WARNING):
        super().__init__(stream)
        self.delay = delay
        self.flush_level = flush_level
        self._lines: list[str] = []
        # Monotonic time of the last write; never at first. (Not 0.0: monotonic() counts
        # from boot, so on a machine up for less than `delay` the first line would wait.)
        self._written_at = -math.inf
        self._due = threading.Event()
        self._closed = False
        self._flusher = threading.Thread(target=self._flush_held, daemon=True,
                                         name="zktasks-log-flusher")
        self._flusher.start()

    def emit(self, record: logging.LogRecord) -> None:
        # Called under the handler's lock (Handler.handle).
        try:
            self._lines.append(self.format(record) + self.terminator)
            now = time.monotonic()
            if record.levelno >= self.flush_level or now - self._written_at >= self.delay:
                self._write(now)
            elif len(self._lines) == 1:
                self._due.set()  # the first line held: the flusher writes it in time
        except RecursionError:  # as StreamHandler does
            raise
        except Exception:
            # A record that cannot be formatted never joined the held lines, which stay
            # for the next write; lines a failed write took are gone with it.
            self.handleError(record)

    def _write(self, now: float) -> None:
        lines, self._lines = self._lines, []
        self.stream.write("".join(lines))
        self.stream.flush()
        self._written_at = now

    def flush(self) -> None:
        with self.lock:
            if self._lines:
                self._write(time.monotonic())
            else:
                super().flush()

    def _flush_held(self) -> None:
        while not self._closed:
            self._due.wait()
            self._due.clear()
            # A deadline, not a synchronisation: held lines wait at most this long.
            time.sleep(self.delay)
            try:
                self.flush()
            except Exception:
                # The lines of a failed write are lost with it (as with StreamHandler);
                # the flusher stays, so later lines still leave within the delay.
                pass

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._closed = True
            self._due.set()
            super().close()
