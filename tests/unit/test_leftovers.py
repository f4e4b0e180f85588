"""What a job changes in its task process's working directory and umask is put back
before the next job (zktasks/leftovers.py); the task process itself is in
tests/integration/test_task_isolation.py."""

import os
from pathlib import Path

from zktasks.leftovers import ProcessState


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_working_directory_and_umask_are_put_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    old_mask = os.umask(0o022)
    try:
        state = ProcessState()
        assert state.restore("untouched") == []

        (tmp_path / "elsewhere").mkdir()
        os.chdir(tmp_path / "elsewhere")
        os.umask(0o077)
        assert state.restore("job") == ["umask", "working directory"]
        assert os.getcwd() == str(tmp_path) and umask() == 0o022
        assert state.restore("next") == []
    finally:
        os.umask(old_mask)


def test_the_directory_is_the_one_it_started_in_not_its_path(tmp_path, monkeypatch):
    """A deploy that moves the directory aside and puts a new one in its place: a
    process no job moved stays where its worker is, and one a job moved goes back
    there, not into the new directory of the same name."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "VERSION").write_text("old")
    monkeypatch.chdir(app)
    state = ProcessState()
    app.rename(tmp_path / "app.old")
    app.mkdir()
    (app / "VERSION").write_text("new")
    assert state.restore("untouched") == []
    assert Path("VERSION").read_text() == "old"
    os.chdir(app)
    assert state.restore("job") == ["working directory"]
    assert Path("VERSION").read_text() == "old"


def test_a_job_whose_directory_was_removed_under_it_goes_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    state = ProcessState()
    (tmp_path / "scratch").mkdir()
    os.chdir(tmp_path / "scratch")
    (tmp_path / "scratch").rmdir()
    assert state.restore("job") == ["working directory"]
    assert os.getcwd() == str(tmp_path)


def test_a_failure_to_put_back_never_raises(monkeypatch, caplog):
    """The task process must go on to its next job whatever happens here."""
    state = ProcessState()

    def refuse(mask):
        raise RuntimeError("refused")

    monkeypatch.setattr(os, "umask", refuse)
    assert state.restore("job") == []
    assert "could not put back its state after job=job" in caplog.text


def test_a_job_that_closes_or_reuses_the_kept_descriptor_moves_nothing(
        tmp_path, monkeypatch, caplog):
    """A job that closes descriptors it did not open (a daemonizing library), and then
    opens a directory that gets the same number: fchdir() on it moved the process into
    that directory, after every job."""
    (tmp_path / "start").mkdir()
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "start")
    state = ProcessState()
    os.close(state._cwd)
    reused = os.open(tmp_path / "other", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert reused == state._cwd  # the lowest free number: the one just closed
        os.chdir(tmp_path)
        assert state.restore("job") == []
        assert os.getcwd() == str(tmp_path)
        assert caplog.text.count("lost the descriptor of its working directory") == 1
        assert state.restore("next") == []  # said once, then left alone
        assert caplog.text.count("lost the descriptor") == 1
    finally:
        os.close(reused)
