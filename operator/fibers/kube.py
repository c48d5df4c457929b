"""The operator's Kubernetes access beyond what kopf does: Secrets, status writes, annotations.

The calls go through `fibers.kubeapi` (synchronous) in worker threads, so the event loop stays free.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from fibers.api import API_VERSION
from fibers.kubeapi import Api, ApiError, Unreachable, path

log = logging.getLogger("fibers.kube")
# A finalizer is removed by its position, tested first: a concurrent change to the list fails the test,
# and the removal is tried again on the list as it is now, this many times in all.
FINALIZER_PATCH_TRIES = 5


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
    if isinstance(exc, ApiError):
        return f"{exc.status} {exc.reason}: {exc.message}"
    if isinstance(exc, Unreachable):
        return f"no answer: {exc}"
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


def load_client() -> Api:
    """In-cluster credentials when running in a pod, otherwise the kubeconfig (KUBECONFIG)."""
    return Api()


def custom(plural: str, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
    """The URL path of fibers.dev objects."""
    return path(API_VERSION, plural, namespace, name, sub)


def adopt(child: dict[str, Any], owner: dict[str, Any], *, controller: bool = True) -> None:
    """Add `owner` (a resource as the API server returns it) to `child`'s owner references, through kopf's
    helper: Kubernetes deletes the child with its owner. A controller also blocks the owner's deletion
    until the child is gone."""
    kopf.append_owner_reference(
        child, owner=kopf.Body(cast(kopf.RawBody, owner)), controller=controller, block_owner_deletion=controller
    )


class NotOurs(Exception):
    """An object the operator would write exists under that name, and the operator did not write it for
    this owner: it is never overwritten (or, through an owner reference, deleted with ours)."""


class Kube:
    def __init__(self, api: Api) -> None:
        self.api = api
        self._background: set[asyncio.Task[None]] = set()
        # Events get their own threads: a burst of them (one per connector created) must not queue
        # ahead of the claims and status writes that the next creates and Ready reports wait on.
        self._event_threads = ThreadPoolExecutor(2, thread_name_prefix="kube-events")

    async def call(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        """One API call in a worker thread (`kubeapi.Api.request`'s arguments)."""
        return await asyncio.to_thread(self.api.request, method, url, **kwargs)

    async def read(self, url: str) -> dict[str, Any] | None:
        """An object, or None when it does not exist."""
        return await asyncio.to_thread(self.api.get_or_none, url)

    async def items(self, url: str, **params: Any) -> list[dict[str, Any]]:
        """A list's items (`labelSelector=…` as a keyword)."""
        return await asyncio.to_thread(self.api.items, url, **params)

    async def delete(self, url: str, *, propagation: str | None = None, uid: str | None = None) -> None:
        """Delete an object; one already gone is not an error. With `uid`, only that object: one made again
        under its name since it was read is not (409, raised)."""
        await asyncio.to_thread(lambda: self.api.delete(url, propagation=propagation, uid=uid))

    async def secret_value(self, namespace: str, name: str, key: str) -> str:
        return (await self.keyed_secret_value(namespace, name, key))[1]

    async def keyed_secret_value(self, namespace: str, name: str, key: str) -> tuple[str, str]:
        """(the Secret's uid, the key's value): what `secret_refs.digest` takes."""
        secret = await self.read(path("v1", "secrets", namespace, name))
        if secret is None:
            raise SecretMissing(f"Secret {namespace}/{name} not found")
        data = secret.get("data") or {}
        if key not in data:
            raise SecretMissing(f"Secret {namespace}/{name} has no key {key!r}")
        return str(secret["metadata"].get("uid") or ""), base64.b64decode(data[key]).decode()

    async def get_object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A fibers.dev object, or None when it does not exist."""
        return await self.read(custom(plural, namespace, name))

    async def get_cluster_object(self, plural: str, name: str) -> dict[str, Any] | None:
        """A cluster-scoped fibers.dev object, or None when it does not exist."""
        return await self.read(custom(plural, None, name))

    async def list_cluster_objects(self, plural: str) -> list[dict[str, Any]]:
        """Every cluster-scoped fibers.dev object of a kind (SchemaRegistries, ConnectClusters)."""
        return await self.items(custom(plural))

    async def replace_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], previous: dict[str, Any] | None = None
    ) -> None:
        """Write status as a merge patch; fields in `previous` but not in `status` are removed."""
        await self._patch_status(custom(plural, namespace, name, "status"), status, previous)

    async def replace_cluster_status(
        self, plural: str, name: str, status: dict[str, Any], previous: dict[str, Any] | None = None
    ) -> None:
        """`replace_status` for a cluster-scoped fibers.dev object."""
        await self._patch_status(custom(plural, None, name, "status"), status, previous)

    async def _patch_status(self, url: str, status: dict[str, Any], previous: dict[str, Any] | None) -> None:
        try:
            await asyncio.to_thread(self.api.patch, url, {"status": merge_patch(previous or {}, status)})
        except ApiError as exc:
            if exc.status != 404:  # deleted meanwhile: nothing to report on
                raise

    async def namespace_labels(self, name: str) -> dict[str, str]:
        """A namespace's labels ({} when it does not exist)."""
        found = await self.read(path("v1", "namespaces", None, name))
        return dict(((found or {}).get("metadata") or {}).get("labels") or {})

    async def post_event(self, ref: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        """A Kubernetes Event on the resource; failing to post one is logged, never raised."""
        meta = ref["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": ref["apiVersion"],
                "kind": ref["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": "fibers-operator"},
            "reportingComponent": "fibers.dev/operator",
            "reportingInstance": socket.gethostname(),
        }
        url = path("v1", "events", meta["namespace"])
        try:
            await asyncio.get_running_loop().run_in_executor(self._event_threads, self.api.create, url, event)
        except (ApiError, Unreachable) as exc:
            log.warning("could not post event", extra={"reason": reason, "error": describe(exc)})

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
        try:
            await asyncio.to_thread(self.api.patch, custom(plural, namespace, name), patch)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def remove_finalizer(self, plural: str, namespace: str, name: str, finalizer: str) -> None:
        """Remove one finalizer, by position and only if it is still there, so no other is touched."""
        for _ in range(FINALIZER_PATCH_TRIES):
            body = await self.get_object(plural, namespace, name)
            finalizers = (body or {}).get("metadata", {}).get("finalizers") or []
            if finalizer not in finalizers:
                return
            index = finalizers.index(finalizer)
            at = f"/metadata/finalizers/{index}"
            try:
                await self.patch_object(
                    plural,
                    namespace,
                    name,
                    [{"op": "test", "path": at, "value": finalizer}, {"op": "remove", "path": at}],
                )
                return
            except ApiError as exc:
                if exc.status not in (409, 422):  # the list changed under us: read it again
                    raise
        raise RuntimeError(f"finalizers of {plural}/{namespace}/{name} keep changing")

    async def remove_annotation(self, plural: str, namespace: str, name: str, *annotations: str) -> None:
        await self.patch_object(plural, namespace, name, {"metadata": {"annotations": dict.fromkeys(annotations)}})

    async def configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's data, or None when it does not exist."""
        found = await self.read(path("v1", "configmaps", namespace, name))
        return None if found is None else dict(found.get("data") or {})

    async def put_configmap(
        self, namespace: str, name: str, data: dict[str, str], *, owner: dict[str, Any], annotations: dict[str, str]
    ) -> None:
        """Create the ConfigMap, or replace its data and annotations; owned by `owner` (deleted with it)."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": annotations}
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
        adopt(body, owner, controller=False)
        try:
            await asyncio.to_thread(self.api.create, path("v1", "configmaps", namespace), body)
            return
        except ApiError as exc:
            if exc.status != 409:
                raise
        found = await self.read(path("v1", "configmaps", namespace, name)) or {}
        refs = (found.get("metadata") or {}).get("ownerReferences") or []
        if not any(ref.get("uid") == owner["metadata"]["uid"] for ref in refs):
            raise NotOurs(f"ConfigMap {namespace}/{name} exists and was not written by this resource: left as it is")
        # resourceVersion from the read: a compare-and-swap, so what changed it since is not overwritten.
        meta["resourceVersion"] = found["metadata"]["resourceVersion"]
        await asyncio.to_thread(self.api.replace, path("v1", "configmaps", namespace, name), body)
