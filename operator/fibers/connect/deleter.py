"""Deleting the connector of a Connect being deleted: one task per resource, retried until the connector is
confirmed gone (only one this resource owns, by Kafka Connect's own record) or `deletion.decide` lets the
resource go without it; the finalizer goes last."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from fibers.api import ANNOTATION_DELETION_POLICY, CONNECT_FINALIZER
from fibers.connect import deletion, ownership
from fibers.connect.policy import ConnectPolicy
from fibers.connect.publisher import Publisher
from fibers.connect.reconcile import Key, Target
from fibers.connect.registry import ClusterUnavailable, ConnectClusters
from fibers.connect.rest import ConnectClient, ConnectError, ConnectUnreachable
from fibers.connect.settings import SyncSettings
from fibers.connect.spec import PLURAL
from fibers.kube import Kube, describe
from fibers.redact import redact

log = logging.getLogger("fibers.connect")


class Deleter:
    def __init__(
        self,
        kube: Kube,
        clusters: ConnectClusters,
        publisher: Publisher,
        policy: ConnectPolicy,
        *,
        settings: SyncSettings,
        targets: Mapping[Key, Target],
        in_flight: Callable[[Key], asyncio.Task[None] | None],
    ) -> None:
        self.kube, self.clusters, self.publisher, self.policy = kube, clusters, publisher, policy
        self._settings = settings  # its deletion grace, read at each attempt
        self._targets = targets  # as registered now: an annotation set while a deletion waits counts
        self._in_flight = in_flight  # the reconcile of a resource under way, if any
        self.tasks: dict[Key, asyncio.Task[None]] = {}

    def cancel(self, key: Key) -> None:
        if task := self.tasks.pop(key, None):
            task.cancel()

    def start(self, targets: Iterable[Target]) -> None:
        """Each resource marked for deletion gets one deletion task, which retries until it is done."""
        for target in list(targets):
            if target.deleting and target.key not in self.tasks:
                self.tasks[target.key] = asyncio.create_task(
                    self._delete(target), name=f"connect-delete-{target.namespace}/{target.name}"
                )

    async def _delete(self, target: Target) -> None:
        """Delete the connector this resource created, then release the resource to Kubernetes.

        Until the connector is confirmed gone the finalizer stays: deleting the resource without its
        connector would orphan it. A connector this resource did not create is never deleted. The wait
        ends without deleting it (`deletion.decide`) when the resource asks so (deletion-policy orphan),
        when its ConnectCluster no longer exists, or when its Kafka Connect has not answered for
        `SyncSettings.deletion_grace` seconds, counted from this task's first attempt that found it so.
        """
        ctx = {"namespace": target.namespace, "resource": target.name}
        if in_flight := self._in_flight(target.key):
            await asyncio.wait([in_flight])  # a create under way lands first, so the DELETE cannot precede it
        state, since, reported = deletion.ClusterState.ANSWERS, None, ""
        while True:
            decision = self._decision(target, state, since)
            try:
                mine = target.owned or target.claimed  # what Kafka Connect says is checked just before the DELETE
                if mine and decision.releases:
                    self._let_go(target, decision)
                elif mine and await self._delete_if_ours(self.clusters.client(target.cluster), target):
                    assert target.spec is not None
                    log.info("connector deleted", extra={**ctx, "connector": target.spec.connector})
                    self.publisher.lineage.deleted(target)
                if CONNECT_FINALIZER in target.finalizers:
                    await self.kube.remove_finalizer(PLURAL, target.namespace, target.name, CONNECT_FINALIZER)
                return
            except Exception as exc:
                releasing = decision.releases  # the release itself failed (its patch): tried again after the wait
                state = await self._cluster_state(target.cluster, exc)
                unreachable = state is deletion.ClusterState.UNREACHABLE
                since = (since or time.monotonic()) if unreachable else None
                decision = self._decision(target, state, since)
                if decision.releases and not releasing:
                    continue  # let go now, not after another wait
                message = redact(describe(exc), target.secrets)
                log.warning("cannot delete the connector yet: %s", message, extra={**ctx, "cluster": target.cluster})
                if message != reported:
                    then = decision.message or f"or annotate {ANNOTATION_DELETION_POLICY}={deletion.ORPHAN} to leave it"
                    self.publisher.event(
                        target,
                        "DeleteFailed",
                        f"cannot delete the connector, retrying: {message}; {then}",
                        warning=True,
                    )
                    reported = message
                await asyncio.sleep(self.policy.delete_retry)

    def _decision(self, target: Target, state: deletion.ClusterState, since: float | None) -> deletion.Decision:
        """`deletion.decide` for the resource as it is now: a deletion-policy annotation set while the
        deletion waits counts at its next attempt."""
        current = self._targets.get(target.key)
        meta = current.meta if current and current.uid == target.uid else target.meta
        return deletion.decide(
            connector=target.spec.connector if target.spec else target.name,
            cluster=target.cluster,
            state=state,
            unreachable_since=since,
            now=time.monotonic(),
            grace=self._settings.deletion_grace,
            orphan=deletion.orphans(meta.get("annotations") or {}),
        )

    async def _cluster_state(self, cluster: str, exc: Exception) -> deletion.ClusterState:
        """What a failed attempt to delete a connector says of its cluster."""
        if isinstance(exc, ConnectUnreachable):
            return deletion.ClusterState.UNREACHABLE
        if not isinstance(exc, ClusterUnavailable):
            return deletion.ClusterState.ANSWERS  # Connect (or the API server) answered: the error is retried
        try:
            gone = await self.clusters.gone(cluster)
        except Exception:  # the API server did not say: not known to be gone, and no client either
            gone = False
        return deletion.ClusterState.MISSING if gone else deletion.ClusterState.UNREACHABLE

    def _let_go(self, target: Target, decision: deletion.Decision) -> None:
        """The resource goes without its connector being deleted: say so, where its user looks."""
        warning = decision.verdict is deletion.Verdict.RELEASE
        assert target.spec is not None
        extra = {"namespace": target.namespace, "resource": target.name, "cluster": target.cluster}
        # Logged too: in a namespace being deleted the API server refuses new Events.
        log.log(
            logging.WARNING if warning else logging.INFO,
            "released without deleting the connector: %s",
            decision.message,
            extra={**extra, "connector": target.spec.connector, "reason": decision.reason},
        )
        self.publisher.event(target, decision.reason, decision.message, warning=warning)

    async def _delete_if_ours(self, client: ConnectClient, target: Target) -> bool:
        """Delete the connector if Kafka Connect says it is this resource's (`fibers.connect.ownership`),
        read just before: a claim annotation, which the resource's editor can write, never deletes
        another's connector. False when it was left (someone else's: an Event says whose) or is gone."""
        assert target.spec is not None
        connector = target.spec.connector
        try:
            config = await client.config(connector)
        except ConnectError as exc:
            if exc.status_code == 404:
                return False  # gone already: nothing to delete
            raise
        owner = ownership.owner_of(config, us=target.owner, claimed=target.claimed, desired=target.config)
        if owner != target.owner:
            message = f"connector {connector} is {ownership.described(owner)}: left on ConnectCluster {target.cluster}"
            log.warning("not deleting a connector that is not ours", extra={**target.context, "connector": connector})
            self.publisher.event(target, "ConnectorNotOwned", message, warning=True)
            return False
        await self._delete_connector(client, connector)
        return True

    async def _delete_connector(self, client: ConnectClient, connector: str) -> None:
        await client.delete(connector)
        wait = self.policy.delete_confirm
        deadline = time.monotonic() + wait
        while await client.exists(connector):  # DELETE answers before the herder has removed it
            if time.monotonic() > deadline:
                raise ConnectError(409, f"connector {connector} still present {wait:g} s after DELETE")
            await asyncio.sleep(self.policy.delete_confirm_poll)
