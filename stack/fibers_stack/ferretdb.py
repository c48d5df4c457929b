"""FerretDB v1 (SQLite backend): the stack's MongoDB-protocol server.

Real MongoDB cannot be obtained here. FerretDB v1 has no change streams and no transactions,
so nothing in Fibers may rely on them.
"""

from __future__ import annotations

from fibers_stack import fetch
from fibers_stack.launcher import Launcher
from fibers_stack.network import NODE_IP
from fibers_stack.process import free_port, port_open


def start(launcher: Launcher) -> dict[str, str]:
    binary = fetch.ferretdb()
    home = launcher.run_dir / "ferretdb"
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    launcher.spawn(
        "ferretdb",
        [
            str(binary),
            f"--sqlite-url=file:{home}/",
            f"--listen-addr={NODE_IP}:{port}",
        ],
    )
    launcher.wait("ferretdb", lambda: port_open(port), timeout=30)
    return {"mongodb_uri": f"mongodb://{NODE_IP}:{port}/"}
