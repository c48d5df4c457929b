"""ConnectCluster resources for the stack's Kafka Connect, as a platform team would write them."""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

GROUP, VERSION, PLURAL = "fibers.dev", "v1alpha1", "connectclusters"


def apply(api: client.ApiClient, name: str, url: str, **spec: Any) -> None:
    """Create the ConnectCluster, or replace its spec."""
    custom = client.CustomObjectsApi(api)
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ConnectCluster",
        "metadata": {"name": name},
        "spec": {"url": url, **spec},
    }
    try:
        current = cast(dict[str, Any], custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name))
    except ApiException as exc:
        if exc.status != 404:
            raise
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
        return
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, name, body)


def delete(api: client.ApiClient, name: str) -> None:
    try:
        client.CustomObjectsApi(api).delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    except ApiException as exc:
        if exc.status != 404:
            raise
