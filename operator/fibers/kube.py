"""The operator's Kubernetes access beyond what kopf does: Secrets, status writes, annotations.

The official client is synchronous; calls run in worker threads so the event loop stays free.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
import uuid
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
            await asyncio.to_thread(self.core.create_namespaced_event, meta["namespace"], event)
        except ApiException as exc:
            log.warning("could not post event", extra={"reason": reason, "status": exc.status})

    def post_event_soon(self, ref: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        """Post an Event in the background, so a reconcile never waits on it."""
        task = asyncio.create_task(self.post_event(ref, reason, message, warning=warning))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def remove_annotation(self, plural: str, namespace: str, name: str, annotation: str) -> None:
        patch = {"metadata": {"annotations": {annotation: None}}}
        try:
            await asyncio.to_thread(
                self.custom.patch_namespaced_custom_object, GROUP, VERSION, namespace, plural, name, patch
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
