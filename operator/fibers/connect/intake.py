"""Intake, from kopf's watch: what each Connect resource wants, kept as a `Target` between syncs — its
spec parsed, placed on a ConnectCluster, its Secrets resolved, its claim on a connector remembered.
No call to Kafka Connect here; the loop (`sync`) acts on what is registered."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import kopf

from fibers.api import (
    ANNOTATION_CONNECT_CLUSTER,
    ANNOTATION_OFFSETS,
    ANNOTATION_OFFSETS_FROM,
    ANNOTATION_OWNED_CONNECTOR,
    ANNOTATION_PAUSED,
    ANNOTATION_RESTART,
    FINALIZER,
)
from fibers.conditions import READY, Condition
from fibers.connect import clusters, offsets
from fibers.connect.reconcile import Key, Target
from fibers.connect.registry import ConnectClusters
from fibers.connect.spec import KIND, SpecError, parse
from fibers.kube import Kube, SecretMissing, describe
from fibers.secret_refs import SecretRefs

log = logging.getLogger("fibers.connect")
SECRET_REASONS = frozenset({"SecretNotFound", "SecretUnreadable"})  # re-read while they last


def kept(meta: dict[str, Any]) -> dict[str, Any]:
    """The metadata a Target keeps: all but managedFields, which grows with every writer and is never read
    (about 5 KiB a resource: a few MiB of RSS at a thousand resources)."""
    return {k: v for k, v in meta.items() if k != "managedFields"}


def fingerprint(meta: dict[str, Any]) -> tuple[Any, ...]:
    """What of a resource's metadata the sync acts on; any other change (our own status writes and
    claims, labels) needs no new look at the spec. A claim, once known, is kept (see `apply`)."""
    annotations = meta.get("annotations") or {}
    return (
        meta["uid"],
        meta.get("generation"),
        annotations.get(ANNOTATION_PAUSED),
        ANNOTATION_RESTART in annotations,
        annotations.get(ANNOTATION_OFFSETS),
        annotations.get(ANNOTATION_OFFSETS_FROM),
        bool(meta.get("deletionTimestamp")),
    )


class Intake:
    def __init__(
        self,
        kube: Kube,
        clusters: ConnectClusters,
        default_cluster: str | None,
        nudge: Callable[[Target], None],
        secret_refs: SecretRefs | None = None,
    ) -> None:
        self.kube, self.clusters, self._default_cluster, self._nudge = kube, clusters, default_cluster, nudge
        self.secret_refs = secret_refs or SecretRefs()  # the Secrets each resource names, for their watch
        self.targets: dict[Key, Target] = {}
        self.seen: dict[Key, tuple[Any, ...]] = {}  # what of each resource's metadata we acted on

    async def observe(self, body: kopf.Body) -> None:
        """A watch event of a resource still there: registered anew only when what the sync acts on changed."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        previous = self.targets.get(key)
        if previous and self.seen.get(key) == fingerprint(meta):  # the fingerprint carries the uid
            previous.meta = kept(meta)  # finalizers and annotations as they are now, for the claim's patch
        else:
            await self.apply(body)

    def acted_on(self, target: Target) -> None:
        """Our own patch of the resource (a claim, a request annotation) needs no new look at its spec."""
        self.seen[target.key] = fingerprint(target.meta)

    def forget(self, key: Key) -> None:
        self.secret_refs.forget(KIND, *key)
        self.targets.pop(key, None)
        self.seen.pop(key, None)

    async def apply(self, body: kopf.Body) -> None:
        """Record what one resource wants and wake the loop; no call to Connect here."""
        meta, namespace, name = body["metadata"], body["metadata"]["namespace"], body["metadata"]["name"]
        annotations = meta.get("annotations") or {}
        previous = self.targets.get((namespace, name))
        if previous and previous.uid != meta["uid"]:
            previous = None  # deleted and created again while we were not watching
        status = previous.status if previous else dict(body.get("status") or {})
        target = Target(
            namespace=namespace,
            name=name,
            uid=meta["uid"],
            generation=int(meta.get("generation", 0)),
            spec=None,
            status=status,
            paused=annotations.get(ANNOTATION_PAUSED) == "true",
            restart_requested=ANNOTATION_RESTART in annotations,
            unassigned_since=previous.unassigned_since if previous else None,
            created_at=previous.created_at if previous else 0.0,
            meta=kept(meta),
            first_seen=previous.first_seen if previous else time.monotonic(),
        )
        try:
            target.spec = parse(dict(body.get("spec") or {}), name)
        except SpecError as exc:
            target.problem = Condition(READY, False, "InvalidSpec", str(exc))
        try:
            target.offsets_request = offsets.request_for(annotations, name, target.spec, status.get("lastSeekNonce"))
        except offsets.OffsetsInputError as exc:
            target.offsets_problem = str(exc)
        if target.spec:
            self.secret_refs.note(KIND, namespace, name, {ref.name for ref in target.spec.secret_refs.values()})
            await self.place(target)
            if target.placed:
                await self.resolve_secrets(target)
        if target.spec:
            # Ours: the claim we wrote (a watch event may predate it, so what we know counts too), or
            # one from before the operator kept its own finalizer (kopf's, with the name in status).
            legacy = FINALIZER in target.finalizers and status.get("connectorName") == target.spec.connector
            claim = annotations.get(ANNOTATION_OWNED_CONNECTOR)
            target.disowned = previous.disowned if previous and claim == previous.disowned else ""
            target.claimed = not target.disowned and bool(
                (previous and previous.claimed) or claim == target.spec.connector or legacy
            )
            same = (
                previous
                and previous.spec
                and (previous.spec.connector, previous.cluster)
                == (
                    target.spec.connector,
                    target.cluster,
                )
            )
            target.connector_owner = previous.connector_owner if previous and same else None
        target.config_verified = bool(previous and previous.config_verified and previous.config == target.config)
        self.targets[target.key] = target
        self.seen[target.key] = fingerprint(meta)
        log.debug(
            "resource registered",
            extra={"namespace": namespace, "resource": name, "generation": target.generation, "owned": target.owned},
        )
        self._nudge(target)

    async def place(self, target: Target) -> None:
        """Choose the resource's ConnectCluster, or say why it cannot have one (see `clusters.place`)."""
        assert target.spec is not None
        placement = clusters.place(
            requested=target.spec.cluster,
            bound=(target.meta.get("annotations") or {}).get(ANNOTATION_CONNECT_CLUSTER),
            namespace=target.namespace,
            labels=await self.clusters.labels_of(target.namespace),
            clusters=self.clusters.specs(),
            operator_default=self._default_cluster,
        )
        target.cluster, target.placed, target.problem = placement.cluster, placement.placed, placement.problem

    async def replace_all(self) -> None:
        """Place every resource again; one whose cluster changed (or became usable) is synced at once."""
        for target in list(self.targets.values()):
            if target.spec is None or target.deleting:
                continue
            before = (target.cluster, target.placed, target.problem)
            if target.problem is None or target.problem.reason in clusters.PLACEMENT_REASONS:
                await self.place(target)
            if (target.cluster, target.placed, target.problem) == before:
                continue
            if target.placed:
                await self.resolve_secrets(target)
            target.quiet_view = None
            self._nudge(target)

    async def resolve_secrets(self, target: Target) -> None:
        assert target.spec is not None
        values: dict[str, str] = {}
        try:
            for key, ref in target.spec.secret_refs.items():
                values[key] = await self.kube.secret_value(target.namespace, ref.name, ref.key)
        except SecretMissing as exc:
            target.problem = Condition(READY, False, "SecretNotFound", f"{exc}; create it and the connector follows")
            return
        except Exception as exc:  # e.g. forbidden, or the API server busy: reported, and read again
            target.problem = Condition(READY, False, "SecretUnreadable", f"cannot read a Secret: {describe(exc)}")
            return
        try:
            config = target.spec.full_config(values, target.owner)
        except SpecError as exc:  # a value asking a config provider (a Secret's is not quoted)
            target.problem = Condition(READY, False, "InvalidSpec", str(exc))
            return
        target.problem = None
        target.secrets = tuple(values.values())
        target.config = config

    async def secret_changed(self, key: Key, secret: str) -> bool:
        """A Secret the resource names changed (or went): its values read again; whether the config changed
        (the sync then writes it to Kafka Connect, which restarts the connector once)."""
        target = self.targets.get(key)
        if target is None or target.spec is None or target.deleting or not target.placed:
            return False
        before = (target.config, target.problem)
        await self.resolve_secrets(target)
        if (target.config, target.problem) == before:
            return False
        log.info("a Secret the connector uses changed", extra={**target.context, "secret": secret})
        self._nudge(target)
        return True

    async def resolve_unresolved(self) -> None:
        """Secrets are re-read while missing, so creating the Secret later is enough."""
        for target in list(self.targets.values()):
            if target.spec and target.problem and target.problem.reason in SECRET_REASONS and not target.deleting:
                await self.resolve_secrets(target)
                if not target.problem:
                    self._nudge(target)
