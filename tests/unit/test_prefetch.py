"""The prefetch a worker advertises (zktasks/prefetch.py): pure policy, no ZooKeeper."""

from zktasks import prefetch
from zktasks.prefetch import Prefetch


def test_it_starts_at_four_per_runner_as_celery():
    policy = Prefetch(concurrency=3)
    assert policy.current == 12
    assert policy.wanted(None, now=0.0) is None  # nothing measured yet


def test_short_jobs_raise_it_to_sixteen_per_runner():
    policy = Prefetch(concurrency=2)
    assert policy.wanted(prefetch.SHORT_ENTER_S, now=0.0) == 32
    assert policy.wanted(prefetch.SHORT_ENTER_S * 1.01, now=0.0) is None


def test_between_the_thresholds_it_stays_where_it_is():
    policy = Prefetch(concurrency=2)
    between = (prefetch.SHORT_ENTER_S + prefetch.SHORT_LEAVE_S) / 2
    assert policy.wanted(between, now=0.0) is None  # not short enough to go up
    policy.advertised(32, now=0.0)
    assert policy.wanted(between, now=100.0) is None  # not long enough to go down
    assert policy.wanted(prefetch.SHORT_LEAVE_S * 1.01, now=100.0) == 8


def test_a_change_is_held_before_the_next_one():
    policy = Prefetch(concurrency=2)
    policy.advertised(32, now=10.0)
    long = prefetch.SHORT_LEAVE_S * 10
    assert policy.wanted(long, now=10.0 + prefetch.HOLD_S / 2) is None
    assert policy.wanted(long, now=10.0 + prefetch.HOLD_S) == 8
    policy.advertised(8, now=12.0)
    assert policy.current == 8


def test_a_prefetch_given_by_the_user_never_changes():
    for fixed in (0, 1, 5):
        policy = Prefetch(concurrency=2, fixed=fixed)
        assert policy.current == fixed
        assert policy.wanted(0.0001, now=0.0) is None
        assert policy.wanted(60.0, now=1000.0) is None
