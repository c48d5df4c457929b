"""PostgreSQL for the stack: a throwaway cluster with logical decoding on, as a real CDC source.

The server refuses to run as root, so when we are root it runs as the `postgres` user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from fibers_stack.launcher import Launcher
from fibers_stack.network import NODE_IP, POD_CIDR
from fibers_stack.process import StackError, free_port, port_open

PASSWORD_CHECKED = "password_checked"  # a role whose members' passwords PostgreSQL checks (pg_hba.conf)


def _bindir() -> Path:
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parts[-3]))
    if not candidates:
        raise StackError("PostgreSQL server not found under /usr/lib/postgresql (apt-get install postgresql)")
    return candidates[-1].parent


def _as_postgres_user() -> str | None:
    return "postgres" if os.geteuid() == 0 else None


def start(launcher: Launcher) -> dict[str, str]:
    bindir, user = _bindir(), _as_postgres_user()
    home = launcher.run_dir / "postgres"
    data, sockets = home / "data", home / "sockets"
    sockets.mkdir(parents=True, exist_ok=True)
    if user:
        shutil.chown(home, user, user)
        shutil.chown(sockets, user, user)
    subprocess.run(
        [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ],
        check=True,
        capture_output=True,
        user=user,
        group=user,
        extra_groups=[] if user else None,
    )
    # Pods reach PostgreSQL from their own addresses; this machine's processes (Connect, tests) from any of
    # its own (`samehost`): through the `postgres` Service, kube-proxy masquerades a host's connection to the
    # first address of the machine, not the node IP.
    # Members of the role `password_checked` (made by the tests that need it) must give their password; every
    # other role is trusted.
    with open(data / "pg_hba.conf", "a") as hba:
        for source in ("samehost", POD_CIDR):
            for database in ("all", "replication"):
                hba.write(f"host {database} +{PASSWORD_CHECKED} {source} scram-sha-256\n")
            hba.write(f"host all all {source} trust\nhost replication all {source} trust\n")
    port = free_port()
    settings = {
        "listen_addresses": NODE_IP,
        "port": port,
        "unix_socket_directories": sockets,
        "wal_level": "logical",
        "max_wal_senders": 10,
        "max_replication_slots": 10,
        "fsync": "off",  # fast, and commits still behave: synchronous_commit stays on (below)
        # On, as in production: a commit returns once its WAL is written, and the walsender streams it to
        # Debezium at once. Off, WAL waits for the WAL writer (wal_writer_delay, 200 ms), and so does every
        # change Debezium reads: p50 +150 ms, p99 +300 ms PostgreSQL commit → MongoDB (bench.latency).
        "synchronous_commit": "on",
        "full_page_writes": "off",
    }
    argv = [str(bindir / "postgres"), "-D", str(data)]
    for key, value in settings.items():
        argv += ["-c", f"{key}={value}"]
    launcher.spawn("postgres", argv, user=user)
    launcher.wait("postgres", lambda: port_open(port) and _accepts(bindir, port), timeout=60)
    return {
        "postgres_dsn": f"postgresql://postgres@{NODE_IP}:{port}/postgres",
        "postgres_role_checked": PASSWORD_CHECKED,
    }


def _accepts(bindir: Path, port: int) -> bool:
    return (
        subprocess.run([str(bindir / "pg_isready"), "-h", NODE_IP, "-p", str(port)], capture_output=True).returncode
        == 0
    )
