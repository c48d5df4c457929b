"""Resources let go when the operator is uninstalled (`fibers release`, the chart's post-delete hook).

Connects, DatabusConsumers and Schemas carry the operator's finalizers, so that deleting one first undoes
what it made (a connector, a subject). Once the operator is uninstalled nobody removes them, and a
resource deleted afterwards — or its namespace — would wait for ever. The chart runs this after `helm
uninstall` has removed the operator: it waits until the operator's pods are gone (a running operator puts
the finalizers back), then takes Fibers' finalizers off every resource in the namespaces the release
watched. What the resources made is left as it is, released: connectors keep running on Kafka Connect,
subjects stay in the registry, checkpoints stay in their ConfigMaps; consumer pods and Spark runs belong
to their resource, so Kubernetes removes them with it. Installing the operator again takes every
resource back (the finalizers return, a connector is recognised by its resource's claim).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from fibers.api import CONNECT_FINALIZER, CONNECT_PLURAL, DATABUS_PLURAL, FINALIZER, GROUP, SCHEMA_PLURAL, VERSION
from fibers.kubeapi import Api, ApiError, path

log = logging.getLogger("fibers.release")

# Transforms carry none (see fibers.transform.handlers); ConnectClusters and SchemaRegistries are only watched.
PLURALS = (CONNECT_PLURAL, DATABUS_PLURAL, SCHEMA_PLURAL)
OURS = frozenset({FINALIZER, CONNECT_FINALIZER})


@dataclass(frozen=True)
class ReleaseSettings:
    operator_gone_seconds: float = 120.0  # the operator's graceful stop (kopf finishes its handlers) and then some
    poll_seconds: float = 1.0
    attempts: int = 5  # per resource, when someone else changes its finalizers between our read and our patch


@dataclass
class Released:
    resources: list[str] = field(default_factory=list)  # kind/namespace/name
    deleting: list[str] = field(default_factory=list)  # of those, the ones already being deleted: clean-up left undone


def operator_installed(api: Api, namespace: str, deployment: str) -> bool:
    """Whether the operator's Deployment is still there and not being deleted: then this is no uninstall
    (Argo CD runs post-delete hooks also when an Application is deleted without its resources)."""
    found = api.get_or_none(path("apps/v1", "deployments", namespace, deployment))
    return found is not None and not found["metadata"].get("deletionTimestamp")


def wait_for_operator_gone(api: Api, namespace: str, selector: str, settings: ReleaseSettings) -> None:
    """Until no pod of the operator (`selector` in `namespace`) is left; TimeoutError naming them otherwise."""
    deadline = time.monotonic() + settings.operator_gone_seconds
    while pods := api.items(path("v1", "pods", namespace), labelSelector=selector):
        if time.monotonic() > deadline:
            names = [p["metadata"]["name"] for p in pods]
            waited = settings.operator_gone_seconds
            raise TimeoutError(f"the operator's pods are still running after {waited:.0f} s: {names}")
        time.sleep(settings.poll_seconds)


def release(api: Api, namespaces: list[str], settings: ReleaseSettings = ReleaseSettings()) -> Released:
    """Take Fibers' finalizers off every resource in `namespaces` (every namespace when empty)."""
    done = Released()
    for plural in PLURALS:
        for namespace in namespaces or [""]:
            for item in api.items(path(f"{GROUP}/{VERSION}", plural, namespace or None)):
                if OURS & set(item["metadata"].get("finalizers") or []) and _release(api, plural, item, settings):
                    meta = item["metadata"]
                    name = f"{plural}/{meta['namespace']}/{meta['name']}"
                    done.resources.append(name)
                    if meta.get("deletionTimestamp"):
                        done.deleting.append(name)
                    log.info("released", extra={"resource": name, "deleting": bool(meta.get("deletionTimestamp"))})
    return done


def _release(api: Api, plural: str, item: dict[str, object], settings: ReleaseSettings) -> bool:
    """One resource's finalizers without ours, guarded by a test of the list we read; False if it is gone."""
    meta = item["metadata"]
    assert isinstance(meta, dict)
    url = path(f"{GROUP}/{VERSION}", plural, meta["namespace"], meta["name"])
    for _ in range(settings.attempts):
        finalizers = list(meta.get("finalizers") or [])
        kept = [f for f in finalizers if f not in OURS]
        try:
            api.patch(
                url,
                [
                    {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                    {"op": "replace", "path": "/metadata/finalizers", "value": kept},
                ],
            )
            return True
        except ApiError as exc:
            if exc.status == 404:
                return False
            if exc.status != 422:  # 422: the test failed, the list changed since we read it
                raise
        fresh = api.get_or_none(url)
        if fresh is None:
            return False
        meta = fresh["metadata"]
    raise RuntimeError(f"{url}: its finalizers kept changing under us ({settings.attempts} attempts)")
