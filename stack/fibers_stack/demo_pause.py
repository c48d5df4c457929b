"""The demo's pipeline held still while the tests run on the same stack, and let go again after.

`make demo` leaves its pipeline running (a streaming Spark job, three consumer pods, two connectors): on
a two-core machine that slowed a `make test` right after it from ~42 to 70 minutes. The test session
suspends it first — every resource to its own idle state, through its spec as a user would — and puts
back what it changed at the end. A session that is killed leaves it suspended; `make demo` starts it
afresh anyway.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fibers_stack.demo import NAMESPACE

log = logging.getLogger("fibers_stack.demo")

# Each kind's idle state (spec.state): a connector's tasks paused, a streaming job stopped and no new run,
# no consumer pod; checkpoints and offsets stay, so nothing is replayed or lost when they run again.
IDLE = {"connects": "paused", "transforms": "suspended", "databusconsumers": "stopped"}

Suspended = list[tuple[str, str, str]]  # (plural, name, the state it had)


def suspend(api: client.ApiClient) -> Suspended:
    """Idle every running resource of the demo's namespace; what was changed, to resume."""
    custom = client.CustomObjectsApi(api)
    changed: Suspended = []
    for plural, idle in IDLE.items():
        try:
            listing = cast(
                dict[str, Any], custom.list_namespaced_custom_object("fibers.dev", "v1beta1", NAMESPACE, plural)
            )
        except ApiException as exc:
            if exc.status == 404:  # the CRDs are not installed yet: no demo
                return changed
            raise
        for item in listing["items"]:
            state = (item.get("spec") or {}).get("state") or "running"
            if state != "running" or item["metadata"].get("deletionTimestamp"):
                continue
            name = item["metadata"]["name"]
            custom.patch_namespaced_custom_object(
                "fibers.dev", "v1beta1", NAMESPACE, plural, name, {"spec": {"state": idle}}
            )
            changed.append((plural, name, state))
    return changed


def resume(api: client.ApiClient, changed: Suspended) -> None:
    """Put back the states `suspend` changed (a resource deleted since, by the demo's test, is skipped)."""
    custom = client.CustomObjectsApi(api)
    for plural, name, state in changed:
        try:
            current = cast(
                dict[str, Any], custom.get_namespaced_custom_object("fibers.dev", "v1beta1", NAMESPACE, plural, name)
            )
            if (current.get("spec") or {}).get("state") == IDLE[plural]:
                patch = {"spec": {"state": state}}
                custom.patch_namespaced_custom_object("fibers.dev", "v1beta1", NAMESPACE, plural, name, patch)
        except ApiException as exc:
            if exc.status != 404:
                raise
