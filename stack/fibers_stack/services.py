"""Cluster names for the stack's servers, so manifests name them as a platform team's cluster would.

The servers run on the node, on ports chosen at each start. `examples/` (and the README's commands)
name them the way manifests name in-cluster services, `postgres.fibers-stack.svc.cluster.local:5432`,
so `kubectl apply -f examples/` works on the stack unchanged and reads the same as on a real cluster.

Each name is a Service with no selector, on the server's usual port, whose EndpointSlice points at the
server on the node. Pods resolve it through CoreDNS. Kafka Connect runs on the host and is the one
server that connects to others by names users give it (Debezium to PostgreSQL, the Avro converter to
the registry); its JVM resolves them from a hosts file of its own (`jdk.net.hosts.file`, written before
it starts), so each Service has a fixed cluster IP, which kube-proxy forwards for the host as for pods.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fibers_stack.network import CLUSTER_DOMAIN, NODE_IP

NAMESPACE = "fibers-stack"
Body = TypeVar("Body")


@dataclass(frozen=True)
class Server:
    name: str  # the Service's name
    port: int  # the Service's port: the server's usual one
    # In the service range's static band (its lowest 16 addresses, which dynamic allocation leaves
    # alone), so the hosts file can be written before the cluster exists.
    cluster_ip: str
    url_field: str  # the StackInfo field whose URL gives the server's port on the node

    @property
    def host(self) -> str:
        return f"{self.name}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


SERVERS = (
    Server("postgres", 5432, "10.0.0.11", "postgres_dsn"),
    Server("mongodb", 27017, "10.0.0.12", "mongodb_uri"),
    Server("kafka-connect", 8083, "10.0.0.13", "connect_url"),
    Server("schema-registry", 8080, "10.0.0.14", "registry_url"),
)


def node_port(url: str) -> int:
    """The port of a server's URL as the stack records it (`postgresql://…`, `mongodb://…`, `http://…`)."""
    port = urlsplit(url).port
    if port is None:
        raise ValueError(f"no port in {url!r}")
    return port


def hosts_file(path: Path) -> Path:
    """The hosts file of Kafka Connect's JVM: the Services' names, and this machine's own (a JVM with a
    hosts file resolves nothing else, and Java asks for the local host's name)."""
    lines = [f"127.0.0.1 localhost {socket.gethostname()}", f"{NODE_IP} {NODE_IP}"]
    lines += [f"{s.cluster_ip} {s.host} {s.name}.{NAMESPACE}.svc" for s in SERVERS]
    path.write_text("\n".join(lines) + "\n")
    return path


def install(api: client.ApiClient, ports: dict[str, int]) -> dict[str, str]:
    """A Service and an EndpointSlice per server (`ports`: the server's port on the node, by name);
    returns the cluster address of each."""
    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    except ApiException as exc:
        if exc.status != 409:
            raise
    for server in SERVERS:
        service = client.V1Service(
            metadata=client.V1ObjectMeta(name=server.name),
            spec=client.V1ServiceSpec(
                cluster_ip=server.cluster_ip,
                ports=[client.V1ServicePort(name="main", port=server.port, target_port=ports[server.name])],
            ),
        )
        endpoints = client.V1EndpointSlice(
            metadata=client.V1ObjectMeta(name=server.name, labels={"kubernetes.io/service-name": server.name}),
            address_type="IPv4",
            endpoints=[client.V1Endpoint(addresses=[NODE_IP], conditions=client.V1EndpointConditions(ready=True))],
            ports=[client.DiscoveryV1EndpointPort(name="main", port=ports[server.name], protocol="TCP")],
        )
        _create(core.create_namespaced_service, service)
        _create(discovery.create_namespaced_endpoint_slice, endpoints)
    return {server.name: server.address for server in SERVERS}


def _create(create: Callable[[str, Body], object], body: Body) -> None:
    try:
        create(NAMESPACE, body)
    except ApiException as exc:
        if exc.status != 409:  # already there: a stack's cluster is fresh at each start, so it is ours
            raise
