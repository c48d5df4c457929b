"""Kafka for the stack: one KRaft broker and a Kafka Connect worker in distributed mode.

Connect finds the FileStream connectors on its class path, and Debezium and Apicurio's Avro converter
in its plugin path (each in a plugin directory of its own).
"""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import uuid
from functools import partial
from pathlib import Path

import httpx

from fibers_stack import fetch, services
from fibers_stack.launcher import Launcher
from fibers_stack.network import NODE_IP
from fibers_stack.process import StackError, free_port, new_ca, openssl, port_open, signed_cert

KEYSTORE_PASSWORD = "fibers-stack"  # of a throwaway keystore for the REST API's https listener

REQUIRED_PLUGINS = (
    "org.apache.kafka.connect.file.FileStreamSourceConnector",
    "org.apache.kafka.connect.file.FileStreamSinkConnector",
    "io.debezium.connector.postgresql.PostgresConnector",
)
# Not connectors: GET /connector-plugins lists them only with ?connectorsOnly=false (KIP-769).
REQUIRED_CONVERTERS = ("io.apicurio.registry.utils.converter.AvroConverter",)

LOG4J2 = """status = warn
appender.c.type = Console
appender.c.name = C
appender.c.target = SYSTEM_ERR
appender.c.layout.type = PatternLayout
appender.c.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.c.ref = C
logger.connect.name = org.apache.kafka.connect.runtime.WorkerSourceTask
logger.connect.level = WARN
"""


# The Connect worker's heap. 1 GiB holds the tests and connect_scale to N=1,000; it is full at ~2,200
# FileStreamSource connectors (each task keeps a producer), so a larger run sets FIBERS_CONNECT_HEAP (e.g. 3g).
CONNECT_HEAP = "1g"
# Workers in the stack's Connect cluster (one group). One holds the tests; a process may keep at most 20,000
# files open here (a hard limit), and each running FileStreamSource task keeps ~4 (its producer's selector
# and sockets), so connect_scale at N=5,000 sets FIBERS_CONNECT_WORKERS=2 and each worker runs half the tasks.
CONNECT_WORKERS = 1
MAX_CONNECT_WORKERS = 4


def _properties(path: Path, values: dict[str, object]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def worker_name(n: int) -> str:
    """The process name of the Connect cluster's n-th worker (the first is "kafka-connect")."""
    return "kafka-connect" if n == 1 else f"kafka-connect-{n}"


def extra_workers(count: int) -> set[str]:
    """The process names of workers 2..count, those beyond the first."""
    return {worker_name(n) for n in range(2, count + 1)}


def connect_workers() -> int:
    """How many workers the stack's Connect cluster runs (FIBERS_CONNECT_WORKERS, 1 to MAX_CONNECT_WORKERS)."""
    wanted = int(os.environ.get("FIBERS_CONNECT_WORKERS", CONNECT_WORKERS))
    if not 1 <= wanted <= MAX_CONNECT_WORKERS:
        raise StackError(f"FIBERS_CONNECT_WORKERS={wanted}: 1 to {MAX_CONNECT_WORKERS} workers")
    return wanted


def _java(lib: Path, home: Path, heap: str, main: str, *args: str, options: tuple[str, ...] = ()) -> list[str]:
    return [
        "java",
        "-Xms128m",
        f"-Xmx{heap}",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={home / 'log4j2.properties'}",
        *options,
        "-cp",
        f"{lib}/*",
        main,
        *args,
    ]


def _connect_ready(url: str) -> bool:
    if httpx.get(f"{url}/connectors", timeout=2).status_code != 200:
        return False
    listed = httpx.get(f"{url}/connector-plugins", params={"connectorsOnly": "false"}, timeout=5).json()
    plugins = {p["class"] for p in listed}
    return all(p in plugins for p in (*REQUIRED_PLUGINS, *REQUIRED_CONVERTERS))


def _rest_tls(home: Path) -> tuple[Path, Path]:
    """A CA of its own and a certificate for the node IP, as a PKCS12 keystore for Connect's https listener."""
    tls = home / "tls"
    tls.mkdir(exist_ok=True)
    ca_key, ca = new_ca(tls, "/CN=fibers-connect-ca")
    key, cert = signed_cert(tls, "tls", "/CN=kafka-connect", (ca_key, ca), san=f"IP:{NODE_IP}")
    keystore = tls / "connect.p12"
    openssl(
        "pkcs12",
        "-export",
        "-in",
        str(cert),
        "-inkey",
        str(key),
        "-out",
        str(keystore),
        "-passout",
        f"pass:{KEYSTORE_PASSWORD}",
    )
    return keystore, ca


def _tls_ready(url: str, ca: Path) -> bool:
    return httpx.get(f"{url}/", timeout=2, verify=ssl.create_default_context(cafile=str(ca))).status_code == 200


def start(launcher: Launcher) -> dict[str, str]:
    lib, plugins, converters = fetch.kafka(), fetch.connect_plugins(), fetch.connect_converters()
    home = launcher.run_dir / "kafka"
    home.mkdir(parents=True, exist_ok=True)
    (home / "log4j2.properties").write_text(LOG4J2)
    broker_port, controller_port, rest_port = free_port(), free_port("127.0.0.1"), free_port()
    bootstrap = f"{NODE_IP}:{broker_port}"

    server = _properties(
        home / "server.properties",
        {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://{bootstrap},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{bootstrap}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": home / "data",
            "num.partitions": 1,
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 3,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            "auto.create.topics.enable": "true",
            # Short retention checks let tests age records out of the log (relay fall-off).
            "log.retention.check.interval.ms": 2000,
            "log.segment.delete.delay.ms": 1000,
        },
    )
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    storage = _java(lib, home, "256m", "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(server))
    formatted = subprocess.run(storage, capture_output=True, text=True)
    if formatted.returncode != 0:
        raise StackError(f"kafka storage format failed: {formatted.stdout}{formatted.stderr}")
    launcher.spawn("kafka", _java(lib, home, "768m", "kafka.Kafka", str(server)))
    launcher.wait("kafka", lambda: port_open(broker_port), timeout=60)

    connect_url = f"http://{NODE_IP}:{rest_port}"
    # A second REST listener over TLS (its own CA), for ConnectClusters with spec.tls; workers talk over http.
    keystore, ca = _rest_tls(home)
    connect_tls_url = f"https://{NODE_IP}:{free_port()}"
    settings: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "group.id": "fibers-connect",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "config.storage.topic": "connect-configs",
        "config.storage.replication.factor": 1,
        "offset.storage.topic": "connect-offsets",
        "offset.storage.replication.factor": 1,
        "offset.storage.partitions": 1,
        "status.storage.topic": "connect-status",
        "status.storage.replication.factor": 1,
        "status.storage.partitions": 1,
        "offset.flush.interval.ms": 1000,
        "listeners": f"{connect_url},{connect_tls_url}",
        "rest.advertised.listener": "http",
        "listeners.https.ssl.keystore.type": "PKCS12",
        "listeners.https.ssl.keystore.location": keystore,
        "listeners.https.ssl.keystore.password": KEYSTORE_PASSWORD,
        "listeners.https.ssl.key.password": KEYSTORE_PASSWORD,
        "listeners.https.ssl.client.auth": "none",
        "rest.advertised.host.name": NODE_IP,
        "rest.advertised.port": rest_port,
        "plugin.path": f"{plugins},{converters}",
        "scheduled.rebalance.max.delay.ms": 0,
    }
    worker = _properties(home / "connect-distributed.properties", settings)
    # Connectors reach servers by the cluster names users give them (`services`), as an in-cluster worker would.
    hosts = services.hosts_file(home / "hosts")
    main, options = "org.apache.kafka.connect.cli.ConnectDistributed", (f"-Djdk.net.hosts.file={hosts}",)
    heap = os.environ.get("FIBERS_CONNECT_HEAP", CONNECT_HEAP)
    launcher.spawn("kafka-connect", _java(lib, home, heap, main, str(worker), options=options))
    launcher.wait("kafka-connect", lambda: _connect_ready(connect_url), timeout=180)
    for n in range(2, connect_workers() + 1):  # more workers of the same group: http only, found by the first
        url = f"http://{NODE_IP}:{free_port()}"
        more = {k: v for k, v in settings.items() if not k.startswith("listeners.https.")}
        more.update({"listeners": url, "rest.advertised.port": url.rsplit(":", 1)[1]})
        conf = _properties(home / f"connect-distributed-{n}.properties", more)
        launcher.spawn(worker_name(n), _java(lib, home, heap, main, str(conf), options=options))
        launcher.wait(worker_name(n), partial(_connect_ready, url), timeout=180)
    launcher.wait("kafka-connect", lambda: _tls_ready(connect_tls_url, ca), timeout=30)
    return {
        "kafka_bootstrap": bootstrap,
        "connect_url": connect_url,
        "connect_tls_url": connect_tls_url,
        "connect_tls_ca": str(ca),
    }
