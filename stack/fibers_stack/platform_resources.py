"""Cluster-scoped resources for the stack's servers, as a platform team would write them:
ConnectClusters for its Kafka Connect, a SchemaRegistry for its Apicurio."""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

GROUP, VERSION = "fibers.dev", "v1beta1"
CONNECT_CLUSTERS, SCHEMA_REGISTRIES = "connectclusters", "schemaregistries"
KINDS = {CONNECT_CLUSTERS: "ConnectCluster", SCHEMA_REGISTRIES: "SchemaRegistry"}


REPLACE_TRIES = 5  # reads and replaces of a resource whose status the operator keeps writing


def apply(api: client.ApiClient, name: str, url: str, *, plural: str = CONNECT_CLUSTERS, **spec: Any) -> None:
    """Create the resource (a ConnectCluster unless `plural` says otherwise), or replace its spec."""
    custom = client.CustomObjectsApi(api)
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KINDS[plural],
        "metadata": {"name": name},
        "spec": {"url": url, **spec},
    }
    for _ in range(REPLACE_TRIES):
        try:
            current = cast(dict[str, Any], custom.get_cluster_custom_object(GROUP, VERSION, plural, name))
        except ApiException as exc:
            if exc.status != 404:
                raise
            custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
            return
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        try:
            custom.replace_cluster_custom_object(GROUP, VERSION, plural, name, body)
            return
        except ApiException as exc:
            if exc.status != 409:  # 409: the operator wrote its status between our read and our write
                raise
    raise RuntimeError(f"{plural}/{name}: still changing after {REPLACE_TRIES} tries to replace its spec")


def delete(api: client.ApiClient, name: str, *, plural: str = CONNECT_CLUSTERS) -> None:
    try:
        client.CustomObjectsApi(api).delete_cluster_custom_object(GROUP, VERSION, plural, name)
    except ApiException as exc:
        if exc.status != 404:
            raise
