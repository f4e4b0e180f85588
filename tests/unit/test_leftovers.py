"""What a job changes in its task process's state is put back before the next job
(zktasks/leftovers.py); the task process itself is in
tests/integration/test_task_isolation.py."""

import os

from zktasks.leftovers import ProcessState


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_working_directory_umask_and_environment_are_put_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ZKTASKS_TEST_KEPT", "kept")
    monkeypatch.setenv("ZKTASKS_TEST_CHANGED", "before")
    monkeypatch.delenv("ZKTASKS_TEST_ADDED", raising=False)
    old_mask = os.umask(0o022)
    try:
        state = ProcessState()
        assert state.restore("untouched") == []

        (tmp_path / "elsewhere").mkdir()
        os.chdir(tmp_path / "elsewhere")
        os.umask(0o077)
        del os.environ["ZKTASKS_TEST_KEPT"]
        os.environ["ZKTASKS_TEST_CHANGED"] = "after"
        os.environ["ZKTASKS_TEST_ADDED"] = "added"
        assert state.restore("job") == ["umask", "working directory", "environment"]

        assert os.getcwd() == str(tmp_path) and umask() == 0o022
        assert os.environ["ZKTASKS_TEST_KEPT"] == "kept"
        assert os.environ["ZKTASKS_TEST_CHANGED"] == "before"
        assert "ZKTASKS_TEST_ADDED" not in os.environ
        assert state.restore("next") == []
    finally:
        os.umask(old_mask)


def test_a_working_directory_removed_since_is_given_up(tmp_path, monkeypatch, caplog):
    """Nothing to go back to: one warning, and the jobs after it go on."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    state = ProcessState()
    os.chdir(tmp_path)
    gone.rmdir()
    assert state.restore("job") == []
    assert "could not go back to its working directory" in caplog.text
    assert state.restore("next") == []
    assert os.getcwd() == str(tmp_path)


def test_a_failure_to_put_back_never_raises(monkeypatch, caplog):
    """The task process must go on to its next job whatever happens here."""
    state = ProcessState()

    def refuse(mask):
        raise RuntimeError("refused")

    monkeypatch.setattr(os, "umask", refuse)
    assert state.restore("job") == []
    assert "could not put back its state after job=job" in caplog.text
