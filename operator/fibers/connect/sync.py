"""The Connect reconciler: one loop per operator, one listing call per Connect cluster per interval.

kopf passes every watch event on (`observe`); the loop does the rest, deletions included. It reads every
connector of a cluster with ONE `GET /connectors?expand=status&expand=info`, decides per resource
what to change (see `reconcile.decide`), makes only those calls, and writes a status only when
it changed. While anything is converging it polls at the fast interval; at rest it makes one call
per cluster per interval, whatever the number of connectors.

A resource is first placed on a ConnectCluster (`clusters.place`; the clients live in `registry`).
Before a create or a config change, Kafka Connect validates the config (`validation`); offsets are
listed, reset and altered on request (`offsets`). The order of the steps is `reconcile.decide`'s.
What the deployment sets is `SyncSettings`; every number tuned in code is `policy.ConnectPolicy`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import kopf

from fibers import conditions, memory, metrics
from fibers.api import (
    ANNOTATION_CONNECT_CLUSTER,
    ANNOTATION_DELETION_POLICY,
    ANNOTATION_OFFSETS,
    ANNOTATION_OFFSETS_FROM,
    ANNOTATION_OWNED_CONNECTOR,
    ANNOTATION_PAUSED,
    ANNOTATION_RESTART,
    CONNECT_FINALIZER,
    FINALIZER,
    object_ref,
)
from fibers.conditions import READY, Condition, format_time, utcnow
from fibers.connect import clusters, deletion, offsets, ownership, reconcile, validation
from fibers.connect.lineage import ConnectLineage
from fibers.connect.policy import POLICY, ConnectPolicy
from fibers.connect.reconcile import OFFSET_STEPS, Outcome, Step, Target
from fibers.connect.registry import ClusterUnavailable, ConnectClusters
from fibers.connect.rest import ConnectClient, ConnectError, ConnectorView, ConnectUnreachable
from fibers.connect.spec import KIND, PLURAL, SpecError, parse
from fibers.kube import Kube, NotOurs, SecretMissing, additions, describe
from fibers.kubeapi import ApiError
from fibers.logs import Repeats
from fibers.redact import redact, truncate
from fibers.wake import sleep_until_woken

log = logging.getLogger("fibers.connect")
# Ready reasons of a new resource's progress, whose status writes are spaced (`ConnectPolicy.startup_status_every`).
STARTUP_REASONS = frozenset({"Creating", "Starting"})

# Ready=False reasons worth a Warning event (the others are progress: Creating, Starting, …).
FAILURE_REASONS = frozenset(
    {
        "ConnectUnreachable",
        "ConnectRejected",
        "ConnectorNotOwned",
        "ConnectorFailed",
        "TasksFailed",
        "TasksUnassigned",
        "AutoRestartExhausted",
        "InvalidSpec",
        "SecretNotFound",
        "SecretUnreadable",
        "ClaimFailed",
        "InvalidConfig",
        "ClusterNotFound",
        "ClusterNotAllowed",
        "NoConnectCluster",
        "AmbiguousDefaultCluster",
    }
)
SECRET_REASONS = frozenset({"SecretNotFound", "SecretUnreadable"})  # re-read while they last


class InvalidConfig(Exception):
    """Kafka Connect's validation found errors: nothing is created or changed until the spec changes."""


class ClaimFailed(Exception):
    """The claim could not be written to the resource (e.g. no permission): nothing is created."""


def _ctx(target: Target) -> dict[str, str]:
    return {"namespace": target.namespace, "resource": target.name}


def _kept(meta: dict[str, Any]) -> dict[str, Any]:
    """The metadata a Target keeps: all but managedFields, which grows with every writer and is never read
    (about 5 KiB a resource: a few MiB of RSS at a thousand resources)."""
    return {k: v for k, v in meta.items() if k != "managedFields"}


def _fingerprint(meta: dict[str, Any]) -> tuple[Any, ...]:
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


@dataclass
class SyncSettings:
    """What the deployment gives the sync (environment, chart, command line; see `fibers.controller`).
    The numbers tuned in code are `ConnectPolicy`'s."""

    interval: float = 10.0  # at rest: one listing per cluster per interval
    # While some connector converges: a status-only listing is cheap. It is the shortest pace; a cluster with
    # many connectors is listed less often (`ConnectPolicy.listing_spacing_per_connector`). Each listing is a
    # request in the herder's queue, between the creates of a wave.
    fast_interval: float = 0.25
    default_cluster: str | None = None  # the ConnectCluster of Connects without spec.cluster (chart value)
    lineage: dict[str, str] | None = None  # {topic, bootstrapServers, namespace} of OpenLineage events; None: off
    kafka_bootstrap: str | None = None  # the connectors' Kafka, to name their topics in lineage events
    # A Connect being deleted whose Kafka Connect has not answered for this long is released without its
    # connector being deleted (`fibers.connect.deletion`): an outage of a few minutes (a rolling restart)
    # is waited out, a cluster gone for good does not hold the resource and its namespace for ever.
    deletion_grace: float = 600.0


class ConnectSync:
    def __init__(
        self, kube: Kube, settings: SyncSettings, clusters: ConnectClusters, policy: ConnectPolicy = POLICY
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.policy = policy
        self.clusters = clusters
        self.lineage = ConnectLineage(settings.lineage, settings.kafka_bootstrap)
        clusters.on_change = self._clusters_changed
        self.targets: dict[tuple[str, str], Target] = {}
        self._replace_due = False  # a ConnectCluster or a namespace's labels changed: place every resource again
        self._converging: set[str] = set()
        self._nudged: set[str] = set()  # clusters with a changed resource, synced without waiting
        self._last_sync: dict[str, float] = {}
        self._unreachable = Repeats(self.policy.unreachable_log_every)  # clusters that do not answer
        self._configs_read: dict[str, float] = {}  # per cluster, when a listing last included configs
        self._listed: dict[str, int] = {}  # per cluster, how many connectors its last listing had
        self._written: dict[tuple[str, str], float] = {}
        self._in_flight: dict[tuple[str, str], asyncio.Task[None]] = {}  # one reconcile per resource at a time
        self._in_flight_on: Counter[str] = Counter()  # per cluster, how many of those
        self._finished_at: dict[tuple[str, str], float] = {}  # when each resource's last reconcile ended
        self._unsettled: dict[str, set[tuple[str, str]]] = defaultdict(set)  # per cluster, after their last reconcile
        self._seen: dict[tuple[str, str], tuple[Any, ...]] = {}  # what of each resource's metadata we acted on
        self._deletions: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._wake = asyncio.Event()

    # ----- registration, from kopf's watch ---------------------------------------------------------

    async def observe(self, event_type: str | None, body: kopf.Body) -> None:
        """Every watch event of a Connect resource (kopf.on.event): register, re-read, or delete.

        kopf's change-detecting handlers would cost two API writes per new resource (its finalizer,
        then its diff-base annotation) and an event round trip before the first call to Connect.
        The sync loop is level-triggered, so the generation and a few annotations say enough.
        """
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if event_type == "DELETED":
            self._drop(key)
            return
        previous = self.targets.get(key)
        if previous and self._seen.get(key) == _fingerprint(meta):  # the fingerprint carries the uid
            previous.meta = _kept(meta)  # finalizers and annotations as they are now, for the claim's patch
        else:
            await self.apply(body)
        if meta.get("deletionTimestamp"):
            self.targets[key].deleting = True
            self._wake.set()

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
            meta=_kept(meta),
            first_seen=previous.first_seen if previous else time.monotonic(),
        )
        try:
            target.offsets_request = offsets.request_from(annotations, name)
        except offsets.OffsetsInputError as exc:
            target.offsets_problem = str(exc)
        try:
            target.spec = parse(dict(body.get("spec") or {}), name)
        except SpecError as exc:
            target.problem = Condition(READY, False, "InvalidSpec", str(exc))
        else:
            await self._place(target)
            if target.placed:
                await self._resolve_secrets(target)
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
        self._seen[target.key] = _fingerprint(meta)
        log.debug(
            "resource registered",
            extra={"namespace": namespace, "resource": name, "generation": target.generation, "owned": target.owned},
        )
        self.nudge(target)

    async def _place(self, target: Target) -> None:
        """Choose the resource's ConnectCluster, or say why it cannot have one (see `clusters.place`)."""
        assert target.spec is not None
        placement = clusters.place(
            requested=target.spec.cluster,
            bound=(target.meta.get("annotations") or {}).get(ANNOTATION_CONNECT_CLUSTER),
            namespace=target.namespace,
            labels=await self.clusters.labels_of(target.namespace),
            clusters=self.clusters.specs(),
            operator_default=self.settings.default_cluster,
        )
        target.cluster, target.placed, target.problem = placement.cluster, placement.placed, placement.problem

    def _clusters_changed(self) -> None:
        self._replace_due = True
        self._wake.set()

    async def _replace_all(self) -> None:
        """Place every resource again; one whose cluster changed (or became usable) is synced at once."""
        self._replace_due = False
        for target in list(self.targets.values()):
            if target.spec is None or target.deleting:
                continue
            before = (target.cluster, target.placed, target.problem)
            if target.problem is None or target.problem.reason in clusters.PLACEMENT_REASONS:
                await self._place(target)
            if (target.cluster, target.placed, target.problem) == before:
                continue
            if target.placed:
                await self._resolve_secrets(target)
            target.quiet_view = None
            self.nudge(target)

    async def _resolve_secrets(self, target: Target) -> None:
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
        target.problem = None
        target.secrets = tuple(values.values())
        target.config = target.spec.full_config(values, target.owner)

    def _drop(self, key: tuple[str, str]) -> None:
        """The resource is gone from Kubernetes: forget it (its metrics too)."""
        metrics.forget_connector(*key)
        self.targets.pop(key, None)
        self._seen.pop(key, None)
        self._written.pop(key, None)
        self._finished_at.pop(key, None)
        if deletion := self._deletions.pop(key, None):
            deletion.cancel()

    async def _delete(self, target: Target) -> None:
        """Delete the connector this resource created, then release the resource to Kubernetes.

        Until the connector is confirmed gone the finalizer stays: deleting the resource without its
        connector would orphan it. A connector this resource did not create is never deleted. The wait
        ends without deleting it (`deletion.decide`) when the resource asks so (deletion-policy orphan),
        when its ConnectCluster no longer exists, or when its Kafka Connect has not answered for
        `SyncSettings.deletion_grace` seconds, counted from this task's first attempt that found it so.
        """
        ctx = {"namespace": target.namespace, "resource": target.name}
        if in_flight := self._in_flight.get(target.key):
            await asyncio.wait([in_flight])  # a create under way lands first, so the DELETE cannot precede it
        state, since, reported = deletion.ClusterState.ANSWERS, None, ""
        while True:
            decision = self._deletion(target, state, since)
            try:
                mine = target.owned or target.claimed  # what Kafka Connect says is checked just before the DELETE
                if mine and decision.releases:
                    self._let_go(target, decision)
                elif mine and await self._delete_if_ours(self.clusters.client(target.cluster), target):
                    assert target.spec is not None
                    log.info("connector deleted", extra={**ctx, "connector": target.spec.connector})
                    self.lineage.deleted(target)
                if CONNECT_FINALIZER in target.finalizers:
                    await self.kube.remove_finalizer(PLURAL, target.namespace, target.name, CONNECT_FINALIZER)
                return
            except Exception as exc:
                releasing = decision.releases  # the release itself failed (its patch): tried again after the wait
                state = await self._cluster_state(target.cluster, exc)
                unreachable = state is deletion.ClusterState.UNREACHABLE
                since = (since or time.monotonic()) if unreachable else None
                decision = self._deletion(target, state, since)
                if decision.releases and not releasing:
                    continue  # let go now, not after another wait
                message = redact(describe(exc), target.secrets)
                log.warning("cannot delete the connector yet: %s", message, extra={**ctx, "cluster": target.cluster})
                if message != reported:
                    then = decision.message or f"or annotate {ANNOTATION_DELETION_POLICY}={deletion.ORPHAN} to leave it"
                    self._event(
                        target,
                        "DeleteFailed",
                        f"cannot delete the connector, retrying: {message}; {then}",
                        warning=True,
                    )
                    reported = message
                await asyncio.sleep(self.policy.delete_retry)

    def _deletion(self, target: Target, state: deletion.ClusterState, since: float | None) -> deletion.Decision:
        """`deletion.decide` for the resource as it is now: a deletion-policy annotation set while the
        deletion waits counts at its next attempt."""
        current = self.targets.get(target.key)
        meta = current.meta if current and current.uid == target.uid else target.meta
        return deletion.decide(
            connector=target.spec.connector if target.spec else target.name,
            cluster=target.cluster,
            state=state,
            unreachable_since=since,
            now=time.monotonic(),
            grace=self.settings.deletion_grace,
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
        self._event(target, decision.reason, decision.message, warning=warning)

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
            log.warning("not deleting a connector that is not ours", extra={**_ctx(target), "connector": connector})
            self._event(target, "ConnectorNotOwned", message, warning=True)
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

    def nudge(self, target: Target) -> None:
        """Sync the target's cluster soon (after a short pause that gathers a burst of changes)."""
        if target.spec and target.placed:
            self._converging.add(target.cluster)
            self._nudged.add(target.cluster)
        self._wake.set()

    # ----- the loop ------------------------------------------------------------------------------

    def _by_cluster(self) -> dict[str, list[Target]]:
        groups: dict[str, list[Target]] = defaultdict(list)
        for target in self.targets.values():
            if target.spec and target.placed and not target.deleting:
                groups[target.cluster].append(target)
        return groups

    def _interval(self, cluster: str) -> float:
        if cluster in self._unreachable:
            return min(self.policy.unreachable_retry, self.settings.interval)
        if cluster not in self._converging:
            return self.settings.interval
        return max(self.settings.fast_interval, self._spacing(cluster))

    def _spacing(self, cluster: str) -> float:
        """The least time between two listings of a cluster, changes or not: a listing's cost grows with the
        connectors it lists (`ConnectPolicy.listing_spacing_per_connector`), and while the cluster is
        saturated with our reconciles a listing only reports Ready sooner (`saturated_listing_spacing`)."""
        spacing = self.policy.listing_spacing_per_connector * self._listed.get(cluster, 0)
        if self._saturated(cluster):
            return max(spacing, self.policy.saturated_listing_spacing)
        return spacing

    def _saturated(self, cluster: str) -> bool:
        return self._in_flight_on[cluster] > self.policy.parallel_calls

    def _wait(self, cluster: str, now: float) -> float:
        """Seconds until the cluster is due: at once when nudged (after its listing spacing), else its interval."""
        last = self._last_sync.get(cluster, 0.0)
        if cluster in self._nudged:
            return last + self._spacing(cluster) - now
        return last + self._interval(cluster) - now

    async def run(self) -> None:
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("Connect sync failed; retrying")
                await asyncio.sleep(self.settings.fast_interval)

    async def _tick(self) -> None:
        """Sync the clusters that are due, then sleep until the next is due or something changes."""
        if self._replace_due:
            await self._replace_all()
        groups = self._by_cluster()
        now = time.monotonic()
        due = [c for c in groups if self._wait(c, now) <= 0]
        if due:
            await asyncio.gather(*(self._sync_cluster(c, groups[c]) for c in due))
        self._start_deletions()
        await self._resolve_unresolved()
        await self._report_unplaced()
        now = time.monotonic()
        waits = [self._wait(c, now) for c in groups]
        timeout = max(self.policy.tick_floor, min(waits, default=self.settings.interval))
        self._wake.clear()
        if await sleep_until_woken(self._wake, timeout):
            await asyncio.sleep(self.policy.burst_gather)  # coalesce bursts of applies into one sync

    def _start_deletions(self) -> None:
        """Each resource marked for deletion gets one deletion task, which retries until it is done."""
        for target in list(self.targets.values()):
            if target.deleting and target.key not in self._deletions:
                self._deletions[target.key] = asyncio.create_task(
                    self._delete(target), name=f"connect-delete-{target.namespace}/{target.name}"
                )

    async def _resolve_unresolved(self) -> None:
        """Secrets are re-read while missing, so creating the Secret later is enough."""
        for target in list(self.targets.values()):
            if target.spec and target.problem and target.problem.reason in SECRET_REASONS and not target.deleting:
                await self._resolve_secrets(target)
                if not target.problem:
                    self.nudge(target)

    async def _report_unplaced(self) -> None:
        """Resources the loop cannot sync (invalid spec) still get a status saying why."""
        for target in list(self.targets.values()):
            if (target.spec is None or not target.placed) and not target.deleting:
                await self._publish(target, reconcile.report(target, None, Outcome(), utcnow()))

    async def _sync_cluster(self, cluster: str, targets: list[Target]) -> None:
        now = time.monotonic()
        self._last_sync[cluster] = now
        self._nudged.discard(cluster)
        # Configs are read once per interval, and when an existing connector's config is not known
        # to match its spec (a changed spec); connectors being created or starting need statuses only.
        # The periodic read waits while our creates are under way: Connect answers it with one request
        # per connector in its herder's queue, between the creates (0.5-2.9 s each, every 10 s, in a wave
        # of 1,000), and the connectors being created hold the configs we wrote.
        with_configs = now - self._configs_read.get(cluster, 0) >= self.settings.interval and not self._busy(targets)
        try:
            client = self.clusters.client(cluster)
            listing = await client.list_expanded(configs=with_configs)
            if not with_configs and any(
                t.spec and not t.problem and not t.config_verified and t.spec.connector in listing for t in targets
            ):
                with_configs = True
                listing = await client.list_expanded(configs=True)
        except (ConnectUnreachable, ConnectError, ClusterUnavailable) as exc:
            message = redact(str(exc), ())
            self._note_unreachable(cluster, message)
            for target in targets:
                target.quiet_view = None  # its status now says unreachable: the next listing must be acted on
                await self._publish(target, self._unreachable_status(target, message))
            self._converging.discard(cluster)  # asked again every `unreachable_retry` s, not at the fast pace
            return
        self._listed[cluster] = len(listing)
        if self._unreachable.ended(cluster):
            log.info("Kafka Connect reachable again", extra={"cluster": cluster})
        self.clusters.note_listing(cluster, listing)
        if with_configs:
            self._configs_read[cluster] = now
        # While connectors are converging, learn their topics quickly; at rest, only a few per sync;
        # none while earlier creates are still under way (Connect is busy enough with those) or new
        # connectors are still starting: their Ready comes first, and topic asks and the status writes
        # they bring would queue ahead of it.
        if self._busy(targets) or any(self._starting(t, now) for t in targets):
            refresh_budget = [0]
        elif cluster in self._converging:
            refresh_budget = [self.policy.topic_refreshes_converging]
        else:
            refresh_budget = [self.policy.topic_refreshes]

        # All resources at once: the client bounds the calls to Connect, so status writes of some
        # resources overlap with Connect calls of others. A resource still being reconciled from an
        # earlier sync (a create waiting its turn in Connect's queue) is left to that reconcile.
        # A resource whose reconcile ended while the listing was under way (a create that just
        # landed) waits for the next listing: this one may not show what that reconcile did.
        started = [
            self._start_reconcile(client, cluster, t, listing, refresh_budget)
            for t in targets
            if self.targets.get(t.key) is t
            and t.key not in self._in_flight
            and self._finished_at.get(t.key, 0.0) < now  # `now`: just before the listing was asked for
            and not self._at_rest(t, listing)
            and not self._unmoved(t, listing, asking_topics=refresh_budget[0] > 0)
        ]
        # Waiting for slow creates would hold back the next listing, and with it the Ready status
        # of connectors that already run: wait a little, and let the rest finish in the background.
        if started:
            await asyncio.wait(started, timeout=self.settings.fast_interval)
        keys = {t.key for t in targets}
        self._unsettled[cluster] &= keys  # deleted resources, or ones moved to another cluster, are not waited for
        if not self._unsettled[cluster] and not keys & self._in_flight.keys():
            if cluster in self._converging:
                memory.release_free_memory()  # a burst is over: give its pages back
            self._converging.discard(cluster)
        else:
            self._converging.add(cluster)

    def _busy(self, targets: list[Target]) -> bool:
        """Some of these resources are still being reconciled from an earlier sync (creates waiting their
        turn in Connect's queue)."""
        return any(t.key in self._in_flight for t in targets)

    def _starting(self, target: Target, now: float) -> bool:
        """Created by us moments ago (`ConnectPolicy.topics_wait_for_starting`) and still starting: not
        Ready yet, and not failed either (a failure is reported as soon as it is seen)."""
        if now - target.created_at >= self.policy.topics_wait_for_starting:
            return False
        ready = conditions.find(target.status.get("conditions"), READY) or {}
        return ready.get("reason", "Creating") in STARTUP_REASONS

    def _at_rest(self, target: Target, listing: dict[str, ConnectorView]) -> bool:
        """A resource whose last reconcile left nothing to do, and whose connector has not moved since,
        needs no reconcile now: a sync of 500 quiet connectors then costs little more than its listing."""
        assert target.spec is not None
        quiet, observed = target.quiet_view, listing.get(target.spec.connector)
        if quiet is None or observed is None or not reconcile.at_rest(quiet, observed):
            return False
        return not self._heartbeat_due(target) and not (target.owned and target.topics_due_now())

    def _unmoved(self, target: Target, listing: dict[str, ConnectorView], *, asking_topics: bool) -> bool:
        """A converging resource whose last reconcile had nothing to do, and whose connector looks as it
        did then (not listed yet, or the same states), waits for it to move, up to
        `ConnectPolicy.converging_recheck`: a wave of creates is then not reconciled at every listing.
        Its topics being due counts only when this sync asks for topics (none while creates are under way)."""
        assert target.spec is not None
        if target.waiting_view is None:
            return False
        before, at = target.waiting_view
        if time.monotonic() - at >= self.policy.converging_recheck:
            return False
        if asking_topics and target.owned and target.topics_due_now():
            return False
        observed = listing.get(target.spec.connector)
        if before is None or observed is None:
            return before is None and observed is None
        return reconcile.at_rest(before, observed)

    def _heartbeat_due(self, target: Target) -> bool:
        return time.monotonic() - self._written.get(target.key, 0) > self.policy.status_heartbeat

    def _start_reconcile(
        self,
        client: ConnectClient,
        cluster: str,
        target: Target,
        listing: dict[str, ConnectorView],
        refresh_budget: list[int],
    ) -> asyncio.Task[None]:
        async def reconcile_one() -> None:
            try:
                with metrics.reconciling(KIND):
                    settled = await self._reconcile(client, target, listing, refresh_budget)
            except Exception as exc:  # one resource's failure (e.g. a forbidden status write) spares the rest
                log.warning(
                    "reconcile failed: %s",
                    redact(describe(exc), target.secrets),
                    extra={"namespace": target.namespace, "resource": target.name},
                )
                settled = False
            finally:
                self._in_flight.pop(target.key, None)
                self._finished_at[target.key] = time.monotonic()
                self._in_flight_on[cluster] -= 1
                if self._in_flight_on[cluster] == self.policy.parallel_calls:
                    self._wake.set()  # no longer saturated: listed at the usual spacing again
            if settled:
                self._unsettled[cluster].discard(target.key)
            else:
                self._unsettled[cluster].add(target.key)
                self._converging.add(cluster)

        task = asyncio.create_task(reconcile_one(), name=f"connect-reconcile-{target.namespace}/{target.name}")
        self._in_flight[target.key] = task
        self._in_flight_on[cluster] += 1
        return task

    def _note_unreachable(self, cluster: str, message: str) -> None:
        """Log an outage when it starts or its error changes, then at most every `unreachable_log_every` s:
        a thousand Connects on a cluster that is down make one line per cluster, not one per poll."""
        if self._unreachable.due(cluster, message):
            log.warning("Kafka Connect unreachable", extra={"cluster": cluster, "error": message})

    def _unreachable_status(self, target: Target, message: str) -> dict[str, Any]:
        now = utcnow()
        conds = [
            Condition(READY, False, "ConnectUnreachable", message),
            Condition(conditions.RECONCILING, True, "ConnectUnreachable", "retrying"),
            Condition(conditions.STALLED, False, "ConnectUnreachable", ""),
        ]
        status = dict(target.status)
        status.update(
            observedGeneration=target.generation,
            phase="Unknown",
            conditions=conditions.merge(
                target.status.get("conditions"), conds, target.generation, conditions.format_time(now)
            ),
            lastSyncTime=conditions.format_time(now),
        )
        return status

    async def _reconcile(
        self, client: ConnectClient, target: Target, listing: dict[str, ConnectorView], refresh_budget: list[int]
    ) -> bool:
        """Act on one resource; True when it needs no further attention now.

        The steps, in order (the first four are `reconcile.decide`'s, in Strimzi's order; the first that
        fails ends them):
        1. create the connector when Connect lists none (after our claim; Connect validates the config,
           and a refused one is named field by field);
        2. verify its config: the listing's against the spec's, written again when they differ;
        3. move its state (a reset or alter of its offsets stops it first, and holds the rest until done);
        4. restart it, on request or when it failed (auto-restart);
        5. report: its topics (while unknown, within the sync's budget), the status, and the request
           annotations done with.
        """
        assert target.spec is not None
        target.quiet_view = target.waiting_view = None  # until this reconcile ends with nothing to do
        observed = listing.get(target.spec.connector)
        target.observe_owner(observed)
        if target.owned and (CONNECT_FINALIZER not in target.finalizers or not target.claimed):
            await self._claim(target)  # ours, by Kafka Connect's record, but the resource lost its claim
        if observed is not None and observed.config is not None:
            target.config_verified = observed.config == target.config
        now = utcnow()
        steps = self._steps(target, observed, now)
        outcome = Outcome()
        for step in steps:
            try:
                await self._execute(client, target, step, outcome)
            except ConnectError as exc:
                outcome.failed, outcome.error = step, exc.message
                outcome.rejected = 400 <= exc.status_code < 500 and not exc.rebalancing and exc.status_code != 404
                break
            except ConnectUnreachable as exc:
                outcome.failed, outcome.error = step, str(exc)
                break
            except ClaimFailed as exc:
                outcome.failed, outcome.error, outcome.reason = step, str(exc), "ClaimFailed"
                break
            except InvalidConfig as exc:
                target.problem = Condition(READY, False, "InvalidConfig", str(exc))
                log.warning("config rejected by validation", extra={**_ctx(target), "error": str(exc)})
                break
            outcome.done.append(step)
        if observed and target.owned and (steps or target.topics_due_now()) and refresh_budget[0] > 0:
            refresh_budget[0] -= 1
            outcome.topics = await self._topics(client, target)
        status = reconcile.report(target, observed, outcome, now)
        metrics.connector_state(target.namespace, target.name, status.get("connectorState"), status.get("runningTasks"))
        await self._publish(target, status)
        if outcome.offsets is not None:
            await self.kube.remove_annotation(
                PLURAL, target.namespace, target.name, ANNOTATION_OFFSETS, ANNOTATION_OFFSETS_FROM
            )
        if Step.RESTART in outcome.done and target.restart_requested:
            target.restart_requested = False
            await self.kube.remove_annotation(PLURAL, target.namespace, target.name, ANNOTATION_RESTART)
        settled = self._settled(target, observed, steps, status)
        if not settled and not steps and not target.problem:
            target.waiting_view = (observed, time.monotonic())
        return settled

    def _steps(self, target: Target, observed: ConnectorView | None, now: datetime) -> list[Step]:
        """`reconcile.decide`'s steps, but no create moments after ours: Connect lists a connector once
        its herder has caught up (`ConnectPolicy.create_settle`)."""
        steps = reconcile.decide(target, observed, now)
        if Step.CREATE in steps and time.monotonic() - target.created_at < self.policy.create_settle:
            return []
        return steps

    async def _topics(self, client: ConnectClient, target: Target) -> list[str] | None:
        """The connector's topics (None when Connect does not answer). An empty answer is asked again
        later, sooner at first, then less often up to a cap (`ConnectPolicy.topic_ask_base`, `topic_ask_max`)."""
        assert target.spec is not None
        target.topic_checks += 1
        target.topics_due = time.monotonic() + min(
            self.policy.topic_ask_base**target.topic_checks, self.policy.topic_ask_max
        )
        try:
            return await client.topics(target.spec.connector)
        except (ConnectError, ConnectUnreachable):
            return None

    def _settled(
        self, target: Target, observed: ConnectorView | None, steps: list[Step], status: dict[str, Any]
    ) -> bool:
        """Settled: nothing was done and nothing is in flight. A connector waiting out its restart
        backoff is settled too; the normal interval is precise enough for that. A new connector's
        topics are learnt at the fast pace for its first few asks (`ConnectPolicy.topic_fast_asks`), so
        the quiet interval does not spend its calls on them; a connector that writes nothing does not
        hold the fast pace."""
        reconciling = conditions.find(status["conditions"], conditions.RECONCILING) or {}
        learning_topics = (
            observed is not None
            and target.owned
            and not status.get("topics")
            and target.topic_checks < self.policy.topic_fast_asks
        )
        settled = (
            not steps
            and not learning_topics
            and (reconciling.get("status") != "True" or reconciling.get("reason") == "AutoRestarting")
        )
        if settled and not target.problem:
            target.quiet_view = observed
        return settled

    def _check_class(self, target: Target) -> None:
        """A class the cluster's plugin list (from its probe) does not have is refused without a call."""
        assert target.spec is not None
        if unknown := validation.unknown_class(
            target.spec.connector_class, self.clusters.plugins(target.cluster), target.cluster
        ):
            raise InvalidConfig(unknown)

    async def _checked(self, client: ConnectClient, target: Target, change: Awaitable[None]) -> None:
        """A create or a config update, validated by Kafka Connect itself.

        Connect validates every config it is given and refuses an invalid one with a 400, changing
        nothing: validation before apply costs no call of its own. Only a refused config is sent to
        the validation endpoint, whose answer names each field (InvalidConfig); a wave of 100 creates
        spared 100 validation calls this way (bench/connect_scale.py).
        """
        try:
            await change
        except ConnectError as exc:
            if exc.status_code != 400:
                raise
            await self._validate(client, target)
            raise  # the validation found nothing to name: Connect's own message stands

    async def _validate(self, client: ConnectClient, target: Target) -> None:
        """Kafka Connect's validation of the spec's config (its class was checked before the change);
        errors raise InvalidConfig naming fields."""
        assert target.spec is not None
        spec = target.spec
        try:
            result = await client.validate(spec.connector_class, target.config)
        except ConnectError as exc:
            if exc.rebalancing or (exc.status_code >= 500 and "find any class" not in exc.message):
                raise
            if "find any class" in exc.message:  # Connect lists every plugin in full: say it shorter
                installed = await client.plugins()
                raise InvalidConfig(
                    validation.unknown_class(spec.connector_class, installed, target.cluster) or exc.message
                ) from None
            raise InvalidConfig(f"spec.class: {redact(exc.message, target.secrets)}") from None
        if problems := validation.errors(result, spec):
            raise InvalidConfig(validation.describe(problems, target.secrets))

    async def _offsets_step(self, client: ConnectClient, target: Target, step: Step, outcome: Outcome) -> None:
        """One step of an offsets operation. Connect refusing it ends the operation as Failed (the
        connector then returns to its desired state); a rebalance (409) or no answer is retried."""
        assert target.spec is not None and target.offsets_request is not None
        connector, request = target.spec.connector, target.offsets_request
        ctx = {"namespace": target.namespace, "resource": target.name, "connector": connector}
        source = f"ConfigMap {target.namespace}/{request.configmap}"
        try:
            if step is Step.STOP_FOR_OFFSETS:
                if request.operation == "alter":
                    await self._offsets_to_apply(target, source)  # bad input fails before the connector stops
                await client.set_state(connector, "STOPPED")
                log.info("connector stopped to change its offsets", extra={**ctx, "operation": request.operation})
                return
            if step is Step.LIST_OFFSETS:
                listed = await client.offsets(connector)
                name = offsets.configmap_name(target.name)
                read_at = format_time(utcnow())
                await self.kube.put_configmap(
                    target.namespace,
                    name,
                    {offsets.CONFIGMAP_KEY: offsets.render(listed)},
                    owner=object_ref(KIND, target.namespace, target.name, target.uid),
                    annotations={"fibers.dev/offsets-read-at": read_at, "fibers.dev/connector": connector},
                )
                count = len(listed.get("offsets") or [])
                message = f"{count} partition(s) written to ConfigMap {name} at {read_at}"
                await self._offsets_done(target, outcome, True, message, configMap=name, listedAt=read_at)
            elif step is Step.RESET_OFFSETS:
                message = await client.reset_offsets(connector)
                await self._offsets_done(target, outcome, True, message or "offsets reset")
            elif step is Step.ALTER_OFFSETS:
                message = await client.alter_offsets(connector, await self._offsets_to_apply(target, source))
                await self._offsets_done(target, outcome, True, message or f"offsets from {source} applied")
        except (offsets.OffsetsInputError, NotOurs) as exc:
            await self._offsets_done(target, outcome, False, str(exc))
        except ConnectError as exc:
            if exc.rebalancing:
                raise
            await self._offsets_done(target, outcome, False, f"Kafka Connect refused: {exc.message}")

    async def _offsets_to_apply(self, target: Target, source: str) -> dict[str, Any]:
        assert target.offsets_request is not None
        data = await self.kube.configmap_data(target.namespace, target.offsets_request.configmap)
        if data is None:
            raise offsets.OffsetsInputError(f"{source} not found")
        return offsets.parse(data.get(offsets.CONFIGMAP_KEY), source)

    async def _offsets_done(self, target: Target, outcome: Outcome, ok: bool, message: str, **listed: str) -> None:
        """End the operation: the result into status (with Event), the annotations removed."""
        assert target.offsets_request is not None
        operation = target.offsets_request.operation
        message = truncate(redact(message, target.secrets), 1024)
        previous = dict(target.status.get("offsets") or {})
        outcome.offsets = {
            **previous,
            **listed,
            "lastOperation": {
                "operation": operation,
                "result": "Succeeded" if ok else "Failed",
                "message": message,
                "time": format_time(utcnow()),
            },
        }
        target.offsets_request = None  # the annotations go once the status says how it ended
        log.log(
            logging.INFO if ok else logging.WARNING,
            "offsets %s: %s",
            operation,
            message,
            extra={"namespace": target.namespace, "resource": target.name},
        )
        reason = {"list": "OffsetsListed", "reset": "OffsetsReset", "alter": "OffsetsAltered"}[operation]
        self._event(target, reason if ok else "OffsetsFailed", f"{operation}: {message}", warning=not ok)

    async def _write_ahead(self, target: Target, annotations: dict[str, str]) -> None:
        """Annotations the resource must carry before Connect is changed (they outlive an operator restart)."""
        try:
            found = await self.kube.patch_object(
                PLURAL, target.namespace, target.name, {"metadata": {"annotations": annotations}}
            )
        except ApiError as exc:
            raise ClaimFailed(f"cannot annotate the resource: {describe(exc)}") from None
        if not found:
            raise LookupError("the resource was deleted")
        target.meta = {**target.meta, "annotations": {**(target.meta.get("annotations") or {}), **annotations}}
        self._note_offsets_request(target)

    def _note_offsets_request(self, target: Target) -> None:
        annotations = target.meta.get("annotations") or {}
        target.offsets_request = offsets.request_from(annotations, target.name)
        self._seen[target.key] = _fingerprint(target.meta)  # our own patch needs no new look at the spec

    async def _claim(self, target: Target, *, reset_offsets: bool = False) -> None:
        """Write-ahead: claim the connector name, with our finalizer, before creating the connector.

        One patch carries both, so a crash between it and the create leaves a claim we recognise
        rather than a connector we would refuse to touch, and the resource cannot be deleted
        without its connector. The patch only adds: it never drops a finalizer someone else set.
        """
        assert target.spec is not None
        claim = {ANNOTATION_OWNED_CONNECTOR: target.spec.connector, ANNOTATION_CONNECT_CLUSTER: target.cluster}
        if reset_offsets:
            claim[ANNOTATION_OFFSETS] = "reset"
        ops = additions(target.meta, CONNECT_FINALIZER, claim)
        try:
            patched = await self.kube.patch_object(PLURAL, target.namespace, target.name, ops)
        except ApiError as exc:
            raise ClaimFailed(f"cannot claim the connector name on the resource: {describe(exc)}") from None
        if not patched:
            raise LookupError("the resource was deleted")
        target.claimed, target.disowned = True, ""
        target.meta = {
            **target.meta,
            "finalizers": [*target.finalizers, CONNECT_FINALIZER],
            "annotations": {**(target.meta.get("annotations") or {}), **claim},
        }
        if reset_offsets:
            self._note_offsets_request(target)

    async def _taken(self, client: ConnectClient, target: Target) -> None:
        """Our create found the name taken: the listing we decided on did not show the connector yet.

        With exactly the config we would have created it is ours (an earlier create whose answer was
        lost, or one from before a restart). Otherwise it is someone else's, created between that
        listing and our create: the claim written ahead of the create is withdrawn (the annotations and
        our finalizer), so this resource never updates, stops or deletes it — it reports
        ConnectorNotOwned from the next listing on.
        """
        assert target.spec is not None
        ctx = {"namespace": target.namespace, "resource": target.name, "connector": target.spec.connector}
        if await client.config(target.spec.connector) == target.config:  # the owner key included
            target.config_verified = True
            target.connector_owner = target.owner
            log.info("connector already exists with this spec's config: taken as ours", extra=ctx)
            return
        ours = [ANNOTATION_OWNED_CONNECTOR, ANNOTATION_CONNECT_CLUSTER]
        if target.spec.offsets_on_create == "reset":
            ours.append(ANNOTATION_OFFSETS)  # written with the claim
        await self.kube.remove_annotation(PLURAL, target.namespace, target.name, *ours)
        if CONNECT_FINALIZER in target.finalizers:
            await self.kube.remove_finalizer(PLURAL, target.namespace, target.name, CONNECT_FINALIZER)
        annotations = {k: v for k, v in (target.meta.get("annotations") or {}).items() if k not in ours}
        finalizers = [f for f in target.finalizers if f != CONNECT_FINALIZER]
        target.meta = {**target.meta, "annotations": annotations, "finalizers": finalizers}
        target.claimed, target.disowned, target.offsets_request = False, target.spec.connector, None
        log.warning("connector created by someone else meanwhile: claim withdrawn, left untouched", extra=ctx)

    async def _execute(self, client: ConnectClient, target: Target, step: Step, outcome: Outcome) -> None:
        spec = target.spec
        assert spec is not None
        ctx = {"namespace": target.namespace, "resource": target.name, "connector": spec.connector}
        if step in OFFSET_STEPS:
            await self._offsets_step(client, target, step, outcome)
            return
        if step in (Step.CREATE, Step.UPDATE_CONFIG):
            self._check_class(target)
        if step is Step.CREATE:
            reset = spec.offsets_on_create == "reset"
            if not target.claimed:  # a claimed one without our finalizer was claimed again in `_reconcile`
                await self._claim(target, reset_offsets=reset)
            elif reset:
                await self._write_ahead(target, {ANNOTATION_OFFSETS: "reset"})
            # With onCreate: reset the connector is created STOPPED and its offsets reset before it runs:
            # the `reset` annotation written ahead carries that through an operator restart.
            state = "STOPPED" if reset else spec.connect_state
            try:
                await self._checked(client, target, client.create(spec.connector, target.config, state))
            except ConnectError as exc:
                if not exc.already_exists:
                    raise
                await self._taken(client, target)  # created meanwhile, by us or by someone else
                return
            target.config_verified = True
            target.connector_owner = target.owner  # created with our owner key
            target.created_at = time.monotonic()
            target.topics_due = target.created_at + self.policy.topics_after_create
            # No Event here: the Ready (or failure) Event follows within seconds, and a wave of creates
            # would otherwise put one more write per connector on the API server while Connect is busiest.
            log.info("connector created", extra={**ctx, "state": spec.connect_state})
        elif step is Step.UPDATE_CONFIG:
            await self._checked(client, target, client.put_config(spec.connector, target.config))
            target.config_verified = True
            log.info("connector config updated", extra=ctx)
            self._event(target, "ConfigUpdated", "connector configuration updated to match the spec")
        elif step is Step.SET_STATE:
            await client.set_state(spec.connector, spec.connect_state)
            log.info("connector state requested", extra={**ctx, "state": spec.connect_state})
        elif step is Step.RESTART:
            await client.restart(spec.connector, only_failed=False)
            log.info("connector restarted on request", extra=ctx)
            self._event(target, "Restarted", "connector and tasks restarted on request")
        elif step is Step.RESTART_FAILED:
            await client.restart(spec.connector, only_failed=True)
            log.warning("failed connector or tasks restarted", extra={**ctx, "restarts": target.restarts + 1})
            self._event(target, "AutoRestarted", f"automatic restart #{target.restarts + 1}", warning=True)

    def _event(self, target: Target, reason: str, message: str, *, warning: bool = False) -> None:
        """Post an Event without holding up the sync."""
        ref = object_ref(KIND, target.namespace, target.name, target.uid)
        self.kube.post_event_soon(ref, reason, redact(message, target.secrets), warning=warning)

    async def _publish(self, target: Target, status: dict[str, Any]) -> None:
        """Write the status if it changed (or the heartbeat is due), and post an Event on Ready flips."""
        offsets_changed = status.get("offsets") != target.status.get("offsets")
        current = self.targets.get(target.key)
        if current is not target:
            if not (offsets_changed and current and current.uid == target.uid):
                return  # forgotten (deleted) or replaced meanwhile
            # An ended offsets operation is reported even so: its annotation goes next, and with it the request.
            current.status = {**current.status, "offsets": status["offsets"]}
        unchanged = reconcile.significant(status) == reconcile.significant(target.status)
        if unchanged and not self._heartbeat_due(target):
            return
        before = conditions.find(target.status.get("conditions"), READY) or {}
        after = conditions.find(status.get("conditions"), READY) or {}
        if (
            before.get("reason", "Creating") in STARTUP_REASONS  # a new resource has no Ready condition yet
            and after.get("reason") in STARTUP_REASONS
            and time.monotonic() - self._written.get(target.key, target.first_seen) < self.policy.startup_status_every
            and not offsets_changed
        ):
            return  # the resource is still converging, so a later sync writes what this one skipped
        await self.kube.replace_status(PLURAL, target.namespace, target.name, status, target.status)
        target.status = status
        self._written[target.key] = time.monotonic()
        if (before.get("status"), before.get("reason")) != (after.get("status"), after.get("reason")):
            self.lineage.ready_changed(target, before, after)
            ctx = {"namespace": target.namespace, "resource": target.name, "reason": after.get("reason")}
            if after.get("status") == "True":
                log.info("ready", extra=ctx)
                self._event(target, "Ready", after.get("message", ""))
            elif after.get("reason") in FAILURE_REASONS:
                log.warning("not ready: %s", after.get("message", ""), extra=ctx)
                self._event(target, after.get("reason", "NotReady"), after.get("message", ""), warning=True)

    async def aclose(self) -> None:
        tasks = [*self._in_flight.values(), *self._deletions.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
