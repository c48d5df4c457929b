"""Which watch events of a resource change what its reconcile acts on (DatabusConsumer, Transform).

These kinds reach the reconcile queue from kopf's watch events (`kopf.on.event`), not from its
change-detecting handlers (`on.resume`, `on.create`, `on.update`). Those run each resource's handler
through kopf's progress bookkeeping (its state read, stored and purged in a patch) and log two lines
per run: at a restart beside a thousand resources of each kind, the new process spent twice the CPU
it spends now (`bench/operator_restart`). The queue is level-triggered (a reconcile reads the resource
afresh), so all it needs from an event is whether to look now: at a resource it has not seen, or whose
spec (its generation), labels or annotations changed. Our own status writes, and kopf's annotations,
change none of these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Key = tuple[str, str, str]  # (kind, namespace, name)
Essence = tuple[Any, ...]

# Annotations that say nothing a reconcile acts on: kopf's bookkeeping (the consumer's finalizer
# handler) and kubectl's copy of the spec, which changes with the generation anyway.
IGNORED_PREFIXES = ("kopf.zalando.org/", "kopf.fibers.dev/", "kubectl.kubernetes.io/last-applied-configuration")


def essence(meta: Mapping[str, Any]) -> Essence:
    """What of a resource's metadata its reconcile acts on; the uid tells a resource created again."""
    annotations = meta.get("annotations") or {}
    kept = tuple(sorted((k, v) for k, v in annotations.items() if not k.startswith(IGNORED_PREFIXES)))
    return (
        meta.get("uid"),
        meta.get("generation"),
        tuple(sorted((meta.get("labels") or {}).items())),
        kept,
    )


class Changes:
    """The essence of each resource last handed to the queue."""

    def __init__(self) -> None:
        self._seen: dict[Key, Essence] = {}

    def changed(self, kind: str, meta: Mapping[str, Any]) -> bool:
        """True (and remembered) when the resource is new to this process or its essence changed."""
        key = (kind, meta["namespace"], meta["name"])
        now = essence(meta)
        if self._seen.get(key) == now:
            return False
        self._seen[key] = now
        return True

    def gone(self, kind: str, meta: Mapping[str, Any]) -> bool:
        """A DELETED event: forgotten, and True, unless another resource of that name (another uid) has been
        seen since. kopf handles each uid's events apart, so a resource deleted and created again may have
        its new one's first event handled before the old one's DELETED, which must not end the new one."""
        key = (kind, meta["namespace"], meta["name"])
        seen = self._seen.get(key)
        if seen is not None and seen[0] != meta.get("uid"):  # an essence begins with its uid
            return False
        self._seen.pop(key, None)
        return True
