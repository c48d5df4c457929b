"""examples/ carries its own prerequisites: `kubectl apply -f examples/` needs nothing made by hand or by the demo.

The demo applies these files with kubectl on the real stack (tests/e2e/test_demo.py); this checks, without
a server, that what they name exists in them and points where the stack serves it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from fibers_stack import services, spark_operator

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _documents() -> list[dict[str, Any]]:
    return [d for path in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]


def _secret_refs(node: object) -> set[str]:
    """Every Secret a resource names (`secretKeyRef`, `uriSecretRef`, ... `{name, key}`)."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key.endswith(("SecretRef", "secretKeyRef")) and isinstance(value, dict) and "name" in value:
                found.add(value["name"])
            found |= _secret_refs(value)
    elif isinstance(node, list):
        for item in node:
            found |= _secret_refs(item)
    return found


def test_every_secret_cluster_and_registry_the_examples_name_is_in_the_examples() -> None:
    documents = _documents()
    by_kind: dict[str, set[str]] = {}
    for d in documents:
        by_kind.setdefault(d["kind"], set()).add(d["metadata"]["name"])
    named = set().union(*(_secret_refs(d["spec"]) for d in documents if "spec" in d))
    assert named and named <= by_kind["Secret"], named - by_kind["Secret"]
    clusters = {d["spec"]["cluster"] for d in documents if d["kind"] == "Connect" and "cluster" in d["spec"]}
    registries = {d["spec"]["registry"] for d in documents if d["kind"] == "Schema" and "registry" in d["spec"]}
    assert clusters and clusters <= by_kind["ConnectCluster"]
    assert registries and registries <= by_kind["SchemaRegistry"]
    namespaces = {d["metadata"].get("namespace") for d in documents if d["kind"] not in ("Namespace",)} - {None}
    assert namespaces <= by_kind["Namespace"]


def test_the_examples_namespace_may_run_spark_jobs_and_use_the_clusters_it_names() -> None:
    documents = _documents()
    namespace = next(d for d in documents if d["kind"] == "Namespace")
    labels = namespace["metadata"]["labels"]
    assert labels[spark_operator.JOB_NAMESPACE_LABEL] == "enabled"
    for d in documents:
        if d["kind"] in ("ConnectCluster", "SchemaRegistry"):
            assert d["spec"]["namespaceSelector"]["matchLabels"].items() <= labels.items(), d["metadata"]["name"]


def test_the_examples_addresses_are_the_stacks_service_names() -> None:
    """Every host in a Secret, ConnectCluster or SchemaRegistry is one the stack answers (`services`)."""
    served = {(s.host, s.port) for s in services.SERVERS}
    addresses = []
    for d in _documents():
        if d["kind"] == "Secret":
            data = d["stringData"]
            if "host" in data:
                addresses.append((data["host"], int(data["port"])))
            addresses += [(urlsplit(v).hostname, urlsplit(v).port) for k, v in data.items() if k in ("uri", "url")]
        elif d["kind"] in ("ConnectCluster", "SchemaRegistry"):
            url = urlsplit(d["spec"]["url"])
            addresses.append((url.hostname, url.port))
    assert len(addresses) == 5
    assert set(addresses) <= served, set(addresses) - served


def test_a_server_port_is_read_from_the_address_the_stack_records() -> None:
    assert services.node_port("http://172.31.250.1:41234") == 41234
    assert services.node_port("mongodb://172.31.250.1:27999/") == 27999
    assert services.node_port("postgresql://postgres@172.31.250.1:40001/postgres") == 40001
