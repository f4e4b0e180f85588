"""Sample tasks of the demo: one quick, one that fails, one slow, one on another queue,
and one that a schedule runs (settings.TASKS[...]["OPTIONS"]["SCHEDULES"])."""

import time

from django.utils import timezone

from zktasks import zk_task


@zk_task
def add(a, b):
    return a + b


@zk_task(priority=10)
def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


@zk_task
def divide(a, b):
    return a / b  # divide(1, 0) fails with ZeroDivisionError, traceback recorded


@zk_task(timeout=60)
def slow(seconds):
    time.sleep(seconds)
    return f"slept {seconds}s"


@zk_task(queue_name="emails")
def send_welcome(address):
    return f"welcome mail queued for {address}"


@zk_task
def heartbeat():
    """Run by the demo's schedule every 30 s: see the dashboard's Schedules tab."""
    return f"alive at {timezone.now():%H:%M:%S} UTC"
