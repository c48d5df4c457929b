"""Apicurio Registry for the stack: the schema registry behind the DataFibers schema operations.

The operator talks to it through its Confluent-compatible API (base URL + /apis/ccompat/v7), so the
same client works against a Confluent Schema Registry. Storage is in memory (the default): every start
is an empty registry. Kafka Connect's Apicurio Avro converter (see `kafka`) reaches the same server.
"""

from __future__ import annotations

import httpx

from fibers_stack import fetch
from fibers_stack.launcher import Launcher
from fibers_stack.network import NODE_IP
from fibers_stack.process import free_port

CCOMPAT = "/apis/ccompat/v7"


def _ready(base: str) -> bool:
    return httpx.get(f"{base}{CCOMPAT}/subjects", timeout=2).status_code == 200


def start(launcher: Launcher) -> dict[str, str]:
    runner = fetch.apicurio_runner(fetch.apicurio())
    tmp = launcher.run_dir / "apicurio" / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://{NODE_IP}:{port}"
    env = {
        "QUARKUS_HTTP_HOST": NODE_IP,
        "QUARKUS_HTTP_PORT": str(port),
        # Quiet: Apicurio's own category is INFO unless set apart from the root level.
        "QUARKUS_LOG_LEVEL": "WARN",
        "QUARKUS_LOG_CATEGORY__IO_APICURIO__LEVEL": "WARN",
        "QUARKUS_BANNER_ENABLED": "false",
        "ENABLE_SENTRY": "false",  # error reporting to Sentry: off by default, kept off explicitly
        # Match schemas as Confluent does (canonical form), not byte for byte: a reformatted schema is the same one.
        "ENABLE_CCOMPAT_CANONICAL_HASH_MODE": "true",
    }
    # Its temporary files go under the run directory, which also marks the process as this stack's (`_orphans`).
    argv = ["java", "-Xms64m", "-Xmx256m", "-XX:+UseG1GC", f"-Djava.io.tmpdir={tmp}", "-jar", str(runner)]
    launcher.spawn("apicurio", argv, env=env)
    launcher.wait("apicurio", lambda: _ready(base), timeout=90)
    return {"registry_url": base}
