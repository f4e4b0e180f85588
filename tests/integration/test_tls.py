"""TLS to ZooKeeper (OPTIONS['TLS']): jobs run over it, and a handshake that fails says
why instead of reading as a server that is down. A real server with a secureClientPort
and mutual TLS (ssl.clientAuth=need), certificates made by openssl for the test."""

import ssl

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


def test_a_key_that_does_not_match_its_certificate_is_named_at_startup(tls_files):
    with pytest.raises(ConfigurationError, match=r"\['CERTFILE'\] with \['KEYFILE'\] does "
                                                 "not load.*KEY_VALUES_MISMATCH"):
        options("127.0.0.1:2181", {"CERTFILE": str(tls_files.client_cert),
                                   "KEYFILE": str(tls_files.server.with_suffix(".key"))})


def test_a_server_certificate_from_another_ca_is_named(tls_server, tmp_path):
    stranger = make_tls_files(tmp_path / "other")
    with pytest.raises(ZooKeeperUnavailableError, match="not one .*'CA'.* vouches for"):
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
