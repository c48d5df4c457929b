"""Watches of the objects the operator creates, by label, for their owners' sake.

A consumer's StatefulSet, pods and checkpoint ConfigMap, a Transform's SparkApplications: a change
to one of them is a reason to look at its owner again, and nothing else is. Each kind of child is
watched once per namespace (or once for the cluster) with a **server-side** label selector: kopf
filters labels on the client, so a kopf handler on pods or ConfigMaps would list and keep every pod
or ConfigMap the operator can see (what made the Spark Operator run out of memory until 2.5.1).

Nothing is cached: an event names its owner (the label's value) and is handed on. A watch runs in a
thread of its own, as the API client is synchronous; the API server ends it every
`kubeapi.WATCH_SECONDS` and it is opened again from the last version seen (bookmarks keep that
version fresh), so at rest a watch costs one request per five minutes whatever the number of objects.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fibers import failpoints
from fibers.kube import describe
from fibers.kubeapi import Api, ApiError, Unreachable, path
from fibers.logs import Repeats

log = logging.getLogger("fibers.watches")

LOG_EVERY_SECONDS = 600.0  # an unchanged failure is logged again this often (once when it starts)

REFUSED = (403, 404)  # a right not granted, a kind not installed: answers that will not change by waiting
OnOwner = Callable[[str, str], None]  # (namespace, owner name): called in the event loop's thread


@dataclass(frozen=True)
class Child:
    """A kind of object the operator creates, and the label whose value names its owner. Or, with no label,
    a kind of object resources refer to by name (Secrets): every one is watched, by its metadata only, and
    each event names the object itself; the receiver keeps the names that matter (`fibers.secret_refs`)."""

    api: str  # "v1", "apps/v1", "sparkoperator.k8s.io/v1beta2"
    plural: str
    label: str = ""

    @property
    def by_name(self) -> bool:
        return not self.label

    def __str__(self) -> str:
        return f"{self.plural}.{self.api.split('/')[0] if '/' in self.api else 'core'} ({self.label or 'by name'})"


SECRETS = Child("v1", "secrets")


class Scope:
    """The namespaces the operator serves, as kopf was told (`fibers run -n …`; none: the cluster).

    Plain names get one watch each; with a glob or an exclusion (`!name`) among them, one watch of
    the cluster is filtered here, as kopf does.
    """

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        self.patterns = [p for p in patterns if p]

    @property
    def namespaces(self) -> list[str | None]:
        """What to watch: each namespace, or [None] for the whole cluster."""
        if self.patterns and not any(c in p for p in self.patterns for c in "*?[!"):
            return list(dict.fromkeys(self.patterns))
        return [None]

    def includes(self, namespace: str) -> bool:
        if not self.patterns:
            return True
        allowed = [p for p in self.patterns if not p.startswith("!")]
        denied = [p[1:] for p in self.patterns if p.startswith("!")]
        if any(fnmatch.fnmatchcase(namespace, p) for p in denied):
            return False
        return not allowed or any(fnmatch.fnmatchcase(namespace, p) for p in allowed)


class _Expired(Exception):
    """The version the watch started from is gone (410): list again."""


class ChildWatch:
    """One watch of one kind of child in one namespace (or the cluster), in a daemon thread."""

    def __init__(
        self,
        api: Api,
        child: Child,
        namespace: str | None,
        scope: Scope,
        on_owner: OnOwner,
        loop: asyncio.AbstractEventLoop,
        retry: tuple[float, float],
    ) -> None:
        self.api, self.child, self.namespace, self.scope = api, child, namespace, scope
        self.on_owner, self.loop = on_owner, loop
        # A watch that failed (API server away, CRD missing) is tried again after retry[0] s, doubling up
        # to retry[1]: the reconcile queue's own pace (`Pacing.retry_min`, `retry_max`).
        self.retry_min, self.retry_max = retry
        self._stop = threading.Event()
        # Answered once: listed, or refused for good (a kind not installed, a right not granted, both
        # logged): the operator's Ready waits for this, not for every child kind to exist.
        self.answered = threading.Event()
        self._failures = Repeats(LOG_EVERY_SECONDS)
        self._thread = threading.Thread(target=self._run, name=f"watch-{child.plural}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """The thread ends at its watch's next event or end (it is a daemon: it never holds up an exit)."""
        self._stop.set()

    def _notify(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        owner = meta.get("name") if self.child.by_name else (meta.get("labels") or {}).get(self.child.label)
        namespace = meta.get("namespace")
        if owner and namespace and self.scope.includes(namespace):
            self.loop.call_soon_threadsafe(self.on_owner, namespace, owner)

    @property
    def _selector(self) -> dict[str, str]:
        return {"labelSelector": self.child.label} if self.child.label else {}

    def _run(self) -> None:
        url = path(self.child.api, self.child.plural, self.namespace)
        where = {"watch": str(self.child), "namespace": self.namespace or "*"}
        delay, relist = self.retry_min, False
        while not self._stop.is_set():
            try:
                failpoints.hit("watch.list", Unreachable)
                listing = self.api.list_metadata(url) if self.child.by_name else self.api.get(url, **self._selector)
                version = str(listing["metadata"]["resourceVersion"])
                if relist:  # events may have been missed meanwhile: every owner looks again
                    for item in listing.get("items") or []:
                        self._notify(item)
                if self._failures.ended("watch"):
                    log.info("watch running again", extra=where)
                delay, relist = self.retry_min, True
                self.answered.set()
                while not self._stop.is_set():
                    version = self._follow(url, version)
            except _Expired:
                continue
            except (ApiError, Unreachable) as exc:
                if isinstance(exc, ApiError) and exc.status in REFUSED:
                    self.answered.set()
                message = describe(exc)
                if self._failures.due("watch", message):
                    log.warning("watch failed; retrying", extra={**where, "error": message, "retry_seconds": delay})
                self._stop.wait(delay)
                delay = min(delay * 2, self.retry_max)

    def _follow(self, url: str, version: str) -> str:
        """One watch request, until the server ends it: the last version seen."""
        by_name = self.child.by_name
        for event in self.api.watch(url, resource_version=version, metadata_only=by_name, **self._selector):
            if self._stop.is_set():
                break
            obj = event.get("object") or {}
            if event.get("type") == "ERROR":
                if obj.get("code") == 410:
                    raise _Expired
                raise ApiError(int(obj.get("code") or 500), str(obj.get("reason") or "Error"), str(obj))
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if event.get("type") != "BOOKMARK":
                self._notify(obj)
        return version


class ChildWatches:
    """Every child watch of the operator: started together, stopped together."""

    def __init__(self, api: Api, scope: Scope, retry: tuple[float, float]) -> None:
        self.api, self.scope, self.retry = api, scope, retry
        self.watches: list[ChildWatch] = []

    def add(self, child: Child, on_owner: OnOwner) -> None:
        loop = asyncio.get_running_loop()
        for namespace in self.scope.namespaces:
            watch = ChildWatch(self.api, child, namespace, self.scope, on_owner, loop, self.retry)
            self.watches.append(watch)
            watch.start()

    def stop(self) -> None:
        for watch in self.watches:
            watch.stop()

    def unanswered(self) -> list[str]:
        """For the operator's Ready: the watches whose first listing the API server has not answered."""
        return [
            f"the first listing of {watch.child} in {watch.namespace or 'the cluster'}"
            for watch in self.watches
            if not watch.answered.is_set()
        ]
