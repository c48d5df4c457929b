"""The operator's Kubernetes access beyond what kopf does: Secrets, status writes, annotations.

The official client is synchronous; calls run in worker threads so the event loop stays free.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from fibers.api import GROUP, VERSION

log = logging.getLogger("fibers.kube")


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """An RFC 7386 merge patch turning `old` into `new` (None deletes a key; lists are replaced)."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            patch[key] = merge_patch(old[key], value)
        else:
            patch[key] = value
    return patch


def describe(exc: BaseException) -> str:
    """A one-line account of an error; for API errors, the API server's own message."""
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message") or exc.reason
        except ValueError:
            message = exc.reason
        return f"{exc.status} {exc.reason}: {message}"
    return f"{type(exc).__name__}: {exc}"


def _pointer(key: str) -> str:
    """A map key as a JSON pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def additions(meta: dict[str, Any], finalizer: str, annotations: dict[str, str]) -> list[dict[str, Any]]:
    """JSON patch operations adding a finalizer and annotations to an object whose metadata was `meta`.

    An existing list or map is added to in place; an absent one is created only while it is still
    absent (a test for null), so nothing another client added meanwhile is overwritten.
    """
    ops: list[dict[str, Any]] = []
    if meta.get("finalizers"):
        if finalizer not in meta["finalizers"]:
            ops.append({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer})
    else:
        ops += [
            {"op": "test", "path": "/metadata/finalizers", "value": None},
            {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
        ]
    if meta.get("annotations"):
        ops += [
            {"op": "add", "path": f"/metadata/annotations/{_pointer(k)}", "value": v} for k, v in annotations.items()
        ]
    elif annotations:
        ops += [
            {"op": "test", "path": "/metadata/annotations", "value": None},
            {"op": "add", "path": "/metadata/annotations", "value": dict(annotations)},
        ]
    return ops


class SecretMissing(LookupError):
    """A referenced Secret or key does not exist (the message never carries a value)."""


def load_client() -> client.ApiClient:
    """In-cluster credentials when running in a pod, otherwise the kubeconfig (KUBECONFIG)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self._background: set[asyncio.Task[None]] = set()
        # Events get their own threads: a burst of them (one per connector created) must not queue
        # ahead of the claims and status writes that the next creates and Ready reports wait on.
        self._event_threads = ThreadPoolExecutor(2, thread_name_prefix="kube-events")

    async def secret_value(self, namespace: str, name: str, key: str) -> str:
        try:
            secret = await asyncio.to_thread(self.core.read_namespaced_secret, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise SecretMissing(f"Secret {namespace}/{name} not found") from None
            raise
        data = secret.data or {}
        if key not in data:
            raise SecretMissing(f"Secret {namespace}/{name} has no key {key!r}")
        return base64.b64decode(data[key]).decode()

    async def get_object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A fibers.dev object, or None when it does not exist."""
        try:
            body = await asyncio.to_thread(
                self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], body)

    async def list_cluster_objects(self, plural: str) -> list[dict[str, Any]]:
        """Every cluster-scoped fibers.dev object of a kind (SchemaRegistries, ConnectClusters)."""
        found = await asyncio.to_thread(self.custom.list_cluster_custom_object, GROUP, VERSION, plural)
        return list(cast(dict[str, Any], found).get("items") or [])

    async def replace_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], previous: dict[str, Any] | None = None
    ) -> None:
        """Write status as a merge patch; fields in `previous` but not in `status` are removed."""
        patch = {"status": merge_patch(previous or {}, status)}
        try:
            await asyncio.to_thread(
                self.custom.patch_namespaced_custom_object_status, GROUP, VERSION, namespace, plural, name, patch
            )
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile: nothing to report on
                raise

    async def replace_cluster_status(
        self, plural: str, name: str, status: dict[str, Any], previous: dict[str, Any] | None = None
    ) -> None:
        """`replace_status` for a cluster-scoped fibers.dev object."""
        patch = {"status": merge_patch(previous or {}, status)}
        try:
            await asyncio.to_thread(self.custom.patch_cluster_custom_object_status, GROUP, VERSION, plural, name, patch)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def namespace_labels(self, name: str) -> dict[str, str]:
        """A namespace's labels ({} when it does not exist)."""
        try:
            found = await asyncio.to_thread(self.core.read_namespace, name)
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return dict((found.metadata and found.metadata.labels) or {})

    async def post_event(self, ref: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        """A Kubernetes Event on the resource; failing to post one is logged, never raised."""
        meta = ref["metadata"]
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{meta['name']}.{uuid.uuid4().hex[:12]}", namespace=meta["namespace"]),
            involved_object=client.V1ObjectReference(
                api_version=ref["apiVersion"],
                kind=ref["kind"],
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta["uid"],
            ),
            reason=reason,
            message=message[:1024],
            type="Warning" if warning else "Normal",
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=client.V1EventSource(component="fibers-operator"),
            reporting_component="fibers.dev/operator",
            reporting_instance=socket.gethostname(),
        )
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._event_threads, self.core.create_namespaced_event, meta["namespace"], event
            )
        except ApiException as exc:
            log.warning("could not post event", extra={"reason": reason, "status": exc.status})

    def post_event_soon(self, ref: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        """Post an Event in the background, so a reconcile never waits on it."""
        task = asyncio.create_task(self.post_event(ref, reason, message, warning=warning))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def patch_object(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any] | list[dict[str, Any]]
    ) -> bool:
        """Patch a fibers.dev object (not its status): a dict is a merge patch, a list a JSON patch.

        False when the object is gone.
        """
        content_type = "application/json-patch+json" if isinstance(patch, list) else "application/merge-patch+json"
        try:
            await asyncio.to_thread(
                functools.partial(self.custom.patch_namespaced_custom_object, _content_type=content_type),
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                patch,
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def remove_finalizer(self, plural: str, namespace: str, name: str, finalizer: str) -> None:
        """Remove one finalizer, by position and only if it is still there, so no other is touched."""
        for _ in range(5):
            body = await self.get_object(plural, namespace, name)
            finalizers = (body or {}).get("metadata", {}).get("finalizers") or []
            if finalizer not in finalizers:
                return
            index = finalizers.index(finalizer)
            path = f"/metadata/finalizers/{index}"
            try:
                await self.patch_object(
                    plural,
                    namespace,
                    name,
                    [{"op": "test", "path": path, "value": finalizer}, {"op": "remove", "path": path}],
                )
                return
            except ApiException as exc:
                if exc.status not in (409, 422):  # the list changed under us: read it again
                    raise
        raise RuntimeError(f"finalizers of {plural}/{namespace}/{name} keep changing")

    async def remove_annotation(self, plural: str, namespace: str, name: str, *annotations: str) -> None:
        await self.patch_object(plural, namespace, name, {"metadata": {"annotations": dict.fromkeys(annotations)}})

    async def configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's data, or None when it does not exist."""
        try:
            found = await asyncio.to_thread(self.core.read_namespaced_config_map, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(found.data or {})

    async def put_configmap(
        self, namespace: str, name: str, data: dict[str, str], *, owner: dict[str, Any], annotations: dict[str, str]
    ) -> None:
        """Create the ConfigMap, or replace its data and annotations; owned by `owner` (deleted with it)."""
        meta = owner["metadata"]
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(
                name=name,
                namespace=namespace,
                annotations=annotations,
                owner_references=[
                    client.V1OwnerReference(
                        api_version=owner["apiVersion"], kind=owner["kind"], name=meta["name"], uid=meta["uid"]
                    )
                ],
            ),
            data=data,
        )
        try:
            await asyncio.to_thread(self.core.create_namespaced_config_map, namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            await asyncio.to_thread(self.core.replace_namespaced_config_map, name, namespace, body)
