"""What TLS costs a submitter: submits per second over plain TCP and over TLS.

    .venv/bin/python bench/tls.py [--jobs N] [--rounds R]

One standalone ZooKeeper on loopback (fsync on) serving both its plain clientPort and a
secureClientPort with mutual TLS (a throw-away CA made by openssl). Each round submits N
no-op jobs (no workers) through a plain `submit()` loop and through `pipelined()`, over
plain TCP and over TLS, alternating, each on a fresh root; then the medians. The server's
connection factory is Netty for both (TLS needs it), so the pair differs only in TLS.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"

import django  # noqa: E402

django.setup()

from django.test.utils import override_settings  # noqa: E402

import zktasks  # noqa: E402
from bench import tasks  # noqa: E402
from zktasks.client import close_clients  # noqa: E402
from zktasks.testing import ZooKeeperServer, make_tls_files  # noqa: E402


def tasks_setting(hosts: str, root: str, tls: dict | None) -> dict:
    options = {"HOSTS": hosts, "ROOT": root, "SESSION_TIMEOUT": 10.0,
               "CONNECT_TIMEOUT": 10.0}
    if tls:
        options["TLS"] = tls
    return {"default": {"BACKEND": "zktasks.backend.ZooKeeperBackend", "OPTIONS": options}}


def submit_rate(jobs: int, pipelined: bool) -> float:
    tasks.noop.submit()  # connects and makes the queue outside the timing
    start = time.perf_counter()
    if pipelined:
        with zktasks.pipelined():
            for _ in range(jobs):
                tasks.noop.submit()
    else:
        for _ in range(jobs):
            tasks.noop.submit()
    return jobs / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="zktasks-tls-bench-") as certs:
        files = make_tls_files(certs)
        tls = {"CA": str(files.ca), "CERTFILE": str(files.client_cert),
               "KEYFILE": str(files.client_key)}
        rates: dict[tuple[str, str], list[float]] = {}
        with ZooKeeperServer(tls=files) as server:
            for round_ in range(args.rounds):
                for link, hosts, tls_setting in (("plain", server.hosts, None),
                                                 ("tls", server.secure_hosts, tls)):
                    for mode in ("loop", "pipelined"):
                        root = f"/tls-bench-{round_}-{link}-{mode}"
                        with override_settings(TASKS=tasks_setting(hosts, root, tls_setting)):
                            rate = submit_rate(args.jobs, mode == "pipelined")
                        close_clients()
                        rates.setdefault((mode, link), []).append(rate)
                        print(f"round {round_ + 1}: {mode:9} {link:5} {rate:7.0f} submits/s",
                              flush=True)
    print(f"\nmedians of {args.rounds} rounds, {args.jobs} jobs each (submits/s):")
    for mode in ("loop", "pipelined"):
        plain = statistics.median(rates[(mode, "plain")])
        over_tls = statistics.median(rates[(mode, "tls")])
        print(f"  {mode:9} plain {plain:7.0f}  tls {over_tls:7.0f}  tls/plain "
              f"{over_tls / plain:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
