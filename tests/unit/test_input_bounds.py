"""Values past what the tree can name or ZooKeeper accepts are refused where they are
given, with a message, not found later as a kazoo error or a job that never runs."""

from datetime import UTC, datetime, timedelta

import pytest

from tests import tasks
from zktasks import InvalidTaskError
from zktasks.conf import MAX_RECORD_LIMIT, Options
from zktasks.exceptions import ConfigurationError
from zktasks.records import MAX_MESSAGE_BYTES, MAX_TRACEBACK_BYTES, ErrorRecord, clip
from zktasks.serialization import MAX_RETRY_DELAY, RetryPolicy
from zktasks.tree import (
    QUEUE_RE,
    ZNODE_NAME_RE,
    delayed_node_name,
    is_job_id,
    parse_bucket,
    parse_delayed_node,
)


@pytest.mark.parametrize("options, match", [
    ({"HOSTS": "zk1:0"}, "port is not between 1 and 65535"),
    ({"HOSTS": "zk1:99999"}, "port is not between 1 and 65535"),
    ({"ROOT": "/tasks/.."}, "refuses '.' and '..'"),
    ({"ROOT": "/tasks/./x"}, "refuses '.' and '..'"),
    ({"ROOT": "/ta\x01sks"}, "control characters"),
    ({"ROOT": "/zookeeper/tasks"}, "keeps /zookeeper"),
    ({"MAX_RECORD_BYTES": 0xFFFFF}, f"between 10000 and {MAX_RECORD_LIMIT}"),
])
def test_settings_zookeeper_would_refuse_later_are_refused_now(options, match):
    with pytest.raises(ConfigurationError, match=match):
        Options.from_params("default", {"OPTIONS": options})


def test_a_root_that_only_starts_like_zookeeper_s_own_is_fine():
    assert Options.from_params("default", {"OPTIONS": {"ROOT": "/zookeeperish"}}).root \
        == "/zookeeperish"


def test_names_with_a_final_newline_or_control_characters_are_refused():
    """`$` matches before a final newline: "emails\\n" passed as a queue name, and
    ZooKeeper refused the create with a bare kazoo error."""
    assert not QUEUE_RE.match("emails\n") and not is_job_id("a" * 32 + "\n")
    assert not ZNODE_NAME_RE.match("key\x01") and not ZNODE_NAME_RE.match("key\n")
    assert ZNODE_NAME_RE.match("clé-2") and not ZNODE_NAME_RE.match("..")
    with pytest.raises(InvalidTaskError, match="Queue name"):
        tasks.add.using(queue_name="emails\n")


def test_a_run_after_the_tree_cannot_name_is_refused_at_submit():
    """Due times are named in 13 digits of milliseconds: datetime.max ("never") made a
    name no reader parses, and the job waited forever as garbage with no job id."""
    with pytest.raises(InvalidTaskError, match="too far ahead"):
        tasks.add.using(run_after=datetime.max.replace(tzinfo=UTC))
    last = datetime(2286, 11, 20, tzinfo=UTC)
    tasks.add.using(run_after=last)  # still named in 13 digits
    name = delayed_node_name(int(last.timestamp() * 1000), 0, "a" * 32, "default")
    assert parse_delayed_node(name) is not None


@pytest.mark.parametrize("ttl", [10**12, 1e300, float("inf"), float("nan")])
def test_a_result_ttl_the_finished_index_cannot_name_is_refused(ttl):
    with pytest.raises(InvalidTaskError, match="result_ttl"):
        tasks.add.using(result_ttl=ttl)


def test_the_longest_result_ttl_still_names_a_bucket():
    tasks.add.using(result_ttl=10**12 - 1)
    assert parse_bucket(f"{1_700_000_000_000:013d}-{10**12 - 1}") is not None


@pytest.mark.parametrize("asked, expected", [
    (float("inf"), MAX_RETRY_DELAY), (1e12, MAX_RETRY_DELAY), (-5, 0.0), (2.5, 2.5),
])
def test_retry_delays_are_capped(asked, expected):
    from zktasks import Retry

    policy = RetryPolicy()
    assert policy.delay(1, Retry(delay=asked)) == expected
    assert RetryPolicy(backoff=lambda *_: asked).delay(1, ValueError()) \
        == expected


def test_a_retry_delay_of_nan_is_an_error_not_zero():
    from zktasks import Retry

    with pytest.raises(ValueError, match="NaN"):
        RetryPolicy().delay(1, Retry(delay=float("nan")))


def test_error_text_is_bounded_in_encoded_bytes():
    """2,000 emoji are 2,000 characters but 24,000 bytes of ASCII JSON."""
    try:
        raise ValueError("\U0001F600" * 5_000)
    except ValueError as exc:
        error = ErrorRecord.from_exception(exc)
    import json

    assert len(json.dumps(error.message)) <= MAX_MESSAGE_BYTES
    assert error.message and set(error.message) == {"\U0001F600"}
    # The exception's text is cut in the traceback too, which keeps its frames.
    assert error.traceback.endswith("\U0001F600… (5,013 characters)\n")
    assert len(json.dumps(error.traceback)) <= MAX_TRACEBACK_BYTES
    assert clip("abc", 10, 100) == "abc" and clip("x" * 50, 10, 100, keep_end=True) \
        == "x" * 10
    assert timedelta(seconds=MAX_RETRY_DELAY) < timedelta(days=3700)
