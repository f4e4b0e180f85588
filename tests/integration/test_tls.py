"""TLS to ZooKeeper (OPTIONS['TLS']): jobs run over it, and a handshake that fails says
why instead of reading as a server that is down. A real server with a secureClientPort
and mutual TLS (ssl.clientAuth=need), certificates made by openssl for the test."""

import ssl
import subprocess

import pytest

from tests import tasks
from tests.conftest import use_zookeeper
from zktasks import ZooKeeperUnavailableError
from zktasks.client import new_client, start
from zktasks.conf import Options
from zktasks.exceptions import ConfigurationError
from zktasks.testing import ZooKeeperServer, make_tls_files


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(tls_files):
    server = ZooKeeperServer(tls=tls_files).start()
    yield server
    server.close()


def mutual(files) -> dict:
    return {"CA": str(files.ca), "CERTFILE": str(files.client_cert),
            "KEYFILE": str(files.client_key)}


@pytest.fixture
def zk_settings(settings, tls_server, tls_files, zk_root, monkeypatch):
    # A session outlives the restart test's server restart with room to spare.
    return use_zookeeper(settings, monkeypatch, tls_server.secure_hosts, zk_root,
                         TLS=mutual(tls_files), SESSION_TIMEOUT=10.0)


def options(hosts: str, tls) -> Options:
    return Options.from_params("tls", {"OPTIONS": {"HOSTS": hosts, "TLS": tls,
                                                   "CONNECT_TIMEOUT": 3.0}})


def connect(opts: Options):
    client = start(new_client(opts), opts)
    client.stop()
    client.close()


def test_jobs_run_over_tls(backend, start_worker):
    start_worker()  # it could not register over the plain port: HOSTS is the TLS one
    assert tasks.add.submit(2, 3).wait(timeout=30).return_value == 5
    assert isinstance(backend.store.raw_client._connection._socket, ssl.SSLSocket)


def test_a_tls_session_outlives_a_server_restart(backend, start_worker, tls_server):
    start_worker()
    assert tasks.add.submit(1, 1).wait(timeout=30).return_value == 2
    session = backend.store.raw_client.client_id
    tls_server.restart()  # same port, data and certificates
    assert tasks.add.submit(2, 2).wait(timeout=30).return_value == 4
    assert backend.store.raw_client.client_id == session  # resumed, not a new session


def test_a_running_client_says_why_its_tls_reconnections_fail(tls_server, tls_files,
                                                              tmp_path, caplog, monkeypatch):
    """Only kazoo's WARNING ("Connection dropped: ...") said it, several times a second,
    until the session expired. Here the CA the client trusts is replaced on disk (each
    connection reads the files again) and the server restarted."""
    import shutil

    from tests.waiting import wait_until

    monkeypatch.setattr("zktasks.handler._tls_reported", {})  # once a minute per reason
    ca = tmp_path / "ca.pem"
    shutil.copy(tls_files.ca, ca)
    opts = Options.from_params("tls", {"OPTIONS": {
        "HOSTS": tls_server.secure_hosts, "SESSION_TIMEOUT": 10.0,
        "TLS": {**mutual(tls_files), "CA": str(ca)}}})
    client = start(new_client(opts), opts)
    try:
        shutil.copy(make_tls_files(tmp_path / "other").ca, ca)
        with caplog.at_level("ERROR", logger="zktasks.handler"):
            tls_server.restart()
            wait_until(lambda: "TLS handshake with" in caplog.text, 20, "the named failure")
        [line] = {r.getMessage() for r in caplog.records if r.name == "zktasks.handler"}
        assert "unable to get local issuer certificate" in line
        assert "OPTIONS['TLS']" in line
        shutil.copy(tls_files.ca, ca)  # put right: the same session goes on
        wait_until(lambda: client.connected, 20, "the client to reconnect")
    finally:
        client.stop()
        client.close()


def test_a_given_ca_is_the_only_one_trusted(tls_server, tls_files, tmp_path, monkeypatch):
    """kazoo trusts the system's CAs besides `ca`; with CA set, only its CAs vouch."""
    stranger = make_tls_files(tmp_path / "other")
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_files.ca))  # "the system" trusts ours
    own_cert = {"CERTFILE": str(tls_files.client_cert), "KEYFILE": str(tls_files.client_key)}
    connect(options(tls_server.secure_hosts, own_cert))  # no CA: the system's, so ours
    with pytest.raises(ZooKeeperUnavailableError, match="not signed by a CA that"):
        connect(options(tls_server.secure_hosts, {"CA": str(stranger.ca), **own_cert}))


def test_a_frozen_server_costs_one_attempt_not_the_session(tls_server, tls_files):
    """A frozen server holds a TLS handshake open. kazoo waited the whole session timeout
    for it (12 s, past CONNECT_TIMEOUT); an attempt is bounded like the wait for an
    answer (a third of it), so the next server is reached in time."""
    frozen = ZooKeeperServer(tls=tls_files).start()
    frozen.pause()
    try:
        opts = Options.from_params("tls", {"OPTIONS": {
            "HOSTS": f"{frozen.secure_hosts},{tls_server.secure_hosts}",
            "TLS": mutual(tls_files), "SESSION_TIMEOUT": 12.0, "CONNECT_TIMEOUT": 9.0}})
        client = new_client(opts)
        client.randomize_hosts = False  # the frozen one first
        start(client, opts)
        assert client.connected
        client.stop()
        client.close()
    finally:
        frozen.resume()
        frozen.close()


def test_an_encrypted_key_needs_its_password_and_paths_may_be_paths(tls_server, tls_files,
                                                                     tmp_path):
    locked = tmp_path / "locked.key"
    subprocess.run(["openssl", "pkey", "-in", str(tls_files.client_key), "-aes256",
                    "-passout", "pass:s3cret", "-out", str(locked)], check=True)
    tls = {"CA": tls_files.ca, "CERTFILE": tls_files.client_cert, "KEYFILE": locked}
    # Without it OpenSSL would ask on the terminal (a worker's start hung there).
    with pytest.raises(ConfigurationError, match="KEYFILE_PASSWORD if the key is encrypted"):
        options(tls_server.secure_hosts, tls)
    connect(options(tls_server.secure_hosts, tls | {"KEYFILE_PASSWORD": "s3cret"}))


def test_the_shell_names_a_refused_client_certificate(settings, tls_server, tls_files,
                                                      zk_root, monkeypatch):
    from django.core.management import CommandError, call_command

    use_zookeeper(settings, monkeypatch, tls_server.secure_hosts, zk_root,
                  TLS={"CA": str(tls_files.ca)}, CONNECT_TIMEOUT=3.0)
    with pytest.raises(CommandError, match="refused this client's certificate"):
        call_command("zktasks", "status")


def test_a_key_that_does_not_match_its_certificate_is_named_at_startup(tls_files):
    with pytest.raises(ConfigurationError, match=r"\['CERTFILE'\] with \['KEYFILE'\] does "
                                                 "not load.*KEY_VALUES_MISMATCH"):
        options("127.0.0.1:2181", {"CERTFILE": str(tls_files.client_cert),
                                   "KEYFILE": str(tls_files.server.with_suffix(".key"))})


def test_a_server_certificate_from_another_ca_is_named(tls_server, tmp_path):
    stranger = make_tls_files(tmp_path / "other")
    with pytest.raises(ZooKeeperUnavailableError, match="not signed by a CA that"):
        connect(options(tls_server.secure_hosts, mutual(stranger) | {
            "CERTFILE": None, "KEYFILE": None}))


def test_a_missing_client_certificate_is_named(tls_server, tls_files):
    with pytest.raises(ZooKeeperUnavailableError, match="refused this client's certificate"):
        connect(options(tls_server.secure_hosts, {"CA": str(tls_files.ca)}))


def test_tls_to_a_plain_port_is_named(tls_server, tls_files):
    with pytest.raises(ZooKeeperUnavailableError, match="secureClientPort"):
        connect(options(tls_server.hosts, mutual(tls_files)))


def test_a_client_certificate_in_one_file_with_its_key(tls_server, tls_files, tmp_path):
    both = tmp_path / "client.pem"
    both.write_bytes(tls_files.client_key.read_bytes() + tls_files.client_cert.read_bytes())
    connect(options(tls_server.secure_hosts, {"CA": str(tls_files.ca),
                                              "CERTFILE": str(both)}))
