"""The Connect reconciler: one loop per operator, one listing call per Connect cluster per interval.

kopf passes every watch event on (`observe`); the loop does the rest, deletions included. It reads every
connector of a cluster with ONE `GET /connectors?expand=status` (with `&expand=info`, their configs, at the
pace `config_reads` sets), decides per resource
what to change (see `reconcile.decide`), makes only those calls, and writes a status only when
it changed. While anything is converging it polls at the fast interval; at rest it makes one call
per cluster per interval, whatever the number of connectors.

This module is the loop: it owns the pacing (which cluster is due, how often it is listed) and hands
each resource that needs it to its pieces — `intake` (what each resource wants, from the watch),
`steps` (one reconcile, as named steps; offsets operations in `offset_steps`), `publisher` (status,
Events, lineage) and `deleter` (connectors of resources being deleted).
What the deployment sets is `SyncSettings`; every number tuned in code is `policy.ConnectPolicy`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, defaultdict

import kopf

from fibers import conditions, memory, metrics
from fibers.conditions import READY, utcnow
from fibers.connect import groups as consumer_groups
from fibers.connect import reconcile
from fibers.connect.config_reads import ConfigReads
from fibers.connect.deleter import Deleter
from fibers.connect.intake import Intake
from fibers.connect.lineage import ConnectLineage
from fibers.connect.policy import POLICY, ConnectPolicy
from fibers.connect.publisher import STARTUP_REASONS, Publisher, unreachable_status
from fibers.connect.reconcile import Key, Outcome, Target
from fibers.connect.registry import ClusterUnavailable, ConnectClusters
from fibers.connect.rest import ConnectClient, ConnectError, ConnectorView, ConnectUnreachable
from fibers.connect.settings import SyncSettings
from fibers.connect.spec import KIND
from fibers.connect.steps import Steps
from fibers.connect.tasks_starting import TasksStarting
from fibers.kube import Kube, describe
from fibers.logs import Repeats
from fibers.redact import redact
from fibers.secret_refs import SecretRefs
from fibers.wake import sleep_until_woken

log = logging.getLogger("fibers.connect")


class ConnectSync:
    def __init__(
        self,
        kube: Kube,
        settings: SyncSettings,
        clusters: ConnectClusters,
        policy: ConnectPolicy = POLICY,
        secret_refs: SecretRefs | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.policy = policy
        self.clusters = clusters
        clusters.on_change = self._clusters_changed
        self.intake = Intake(kube, clusters, settings.default_cluster, self.nudge, secret_refs)
        self.targets = self.intake.targets  # every registered resource (one dict: the pieces read it as it is now)
        self.publisher = Publisher(
            kube, ConnectLineage(settings.lineage, settings.kafka_bootstrap), policy, self.targets
        )
        self.steps = Steps(kube, clusters, self.publisher, policy, self.intake.acted_on, settings.kafka_bootstrap)
        self._in_flight: dict[Key, asyncio.Task[None]] = {}  # one reconcile per resource at a time
        self.deleter = Deleter(
            kube,
            clusters,
            self.publisher,
            policy,
            settings=settings,
            targets=self.targets,
            in_flight=self._in_flight.get,
        )
        self._replace_due = False  # a ConnectCluster or a namespace's labels changed: place every resource again
        self._converging: set[str] = set()
        self._nudged: set[str] = set()  # clusters with a changed resource, synced without waiting
        self._last_sync: dict[str, float] = {}
        self._unreachable = Repeats(self.policy.unreachable_log_every)  # clusters that do not answer
        self.config_reads = ConfigReads(settings.interval, policy)  # when a listing carries configs
        self.tasks_starting = TasksStarting(policy)  # Connect still starting our connectors: it is left to it
        self._listed: dict[str, int] = {}  # per cluster, how many connectors its last listing had
        self._in_flight_on: Counter[str] = Counter()  # per cluster, how many reconciles are under way
        self._finished_at: dict[Key, float] = {}  # when each resource's last reconcile ended
        self._unsettled: dict[str, set[Key]] = defaultdict(set)  # per cluster, after their last reconcile
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
            # kopf handles each uid's events apart: the DELETED of one deleted and created again under its
            # name (Argo CD's replace) may come after the new one's first event, and must not drop the new one.
            known = self.targets.get(key)
            if known is None or known.uid == meta.get("uid"):
                self._drop(key)
            return
        await self.intake.observe(body)
        if meta.get("deletionTimestamp"):
            self.targets[key].deleting = True
            self._wake.set()

    async def secret_changed(self, namespace: str, name: str, secret: str) -> None:
        """A Secret the resource names changed: its connector gets the new values (one restart, Kafka
        Connect's own, when its config is written again); an Event names the Secret, never its value."""
        if await self.intake.secret_changed((namespace, name), secret):
            target = self.targets[(namespace, name)]
            message = f"Secret {secret} changed: the connector's configuration is written again"
            self.publisher.event(target, "SecretChanged", message)

    def _drop(self, key: Key) -> None:
        """The resource is gone from Kubernetes: forget it (its metrics too)."""
        metrics.forget_connector(*key)
        self.intake.forget(key)
        self.publisher.forget(key)
        self._finished_at.pop(key, None)
        self.deleter.cancel(key)

    def _clusters_changed(self) -> None:
        self._replace_due = True
        self._wake.set()

    def nudge(self, target: Target) -> None:
        """Sync the target's cluster soon (after a short pause that gathers a burst of changes)."""
        if target.spec and target.placed:
            self._converging.add(target.cluster)
            self._nudged.add(target.cluster)
        self._wake.set()

    def check_groups(self) -> None:
        """Which sink holds each consumer group shared by ConnectClusters on one Kafka (`fibers.connect.groups`):
        a Connect whose answer changed is reconciled again, to act on it and report it."""
        for target in consumer_groups.check(self.targets.values(), self.clusters.kafka_ids()):
            target.quiet_view = target.waiting_view = None
            self.nudge(target)

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
            self._replace_due = False
            await self.intake.replace_all()
        self.check_groups()
        groups = self._by_cluster()
        now = time.monotonic()
        due = [c for c in groups if self._wait(c, now) <= 0]
        if due:
            await asyncio.gather(*(self._sync_cluster(c, groups[c]) for c in due))
        self.deleter.start(self.targets.values())
        await self.intake.resolve_unresolved()
        await self._report_unplaced()
        now = time.monotonic()
        waits = [self._wait(c, now) for c in groups]
        timeout = max(self.policy.tick_floor, min(waits, default=self.settings.interval))
        self._wake.clear()
        if await sleep_until_woken(self._wake, timeout):
            await asyncio.sleep(self.policy.burst_gather)  # coalesce bursts of applies into one sync

    async def _report_unplaced(self) -> None:
        """Resources the loop cannot sync (invalid spec) still get a status saying why."""
        for target in list(self.targets.values()):
            if (target.spec is None or not target.placed) and not target.deleting:
                await self.publisher.publish(target, reconcile.report(target, None, Outcome(), utcnow()))

    async def _sync_cluster(self, cluster: str, targets: list[Target]) -> None:
        now = time.monotonic()
        self._last_sync[cluster] = now
        self._nudged.discard(cluster)
        # Configs are read periodically (`config_reads`), and when an existing connector's config is not
        # known to match its spec (a changed spec); connectors being created or starting need statuses only.
        # The periodic read waits while our creates are under way or our new connectors start: Connect
        # answers it with one request per connector in its herder's queue, between the creates (0.5-2.9 s
        # each, every 10 s, in a wave of 1,000), and the connectors being created hold the configs we wrote.
        # It waits too while Connect's last listing showed ours not started (`tasks_starting`).
        quiet = (
            not self._busy(targets)
            and not any(self._starting(t, now) for t in targets)
            and not self.tasks_starting.holds(cluster, now)
        )
        try:
            client = self.clusters.client(cluster)
            listing, with_configs = await self.config_reads.listing(
                client, cluster, self.config_reads.due(cluster, now, quiet=quiet)
            )
            if (
                not with_configs
                and self.config_reads.may_force(cluster, now)
                and any(
                    t.spec and not t.problem and not t.config_verified and t.spec.connector in listing for t in targets
                )
            ):
                listing, with_configs = await self.config_reads.listing(client, cluster, True, statuses=listing)
        except (ConnectUnreachable, ConnectError, ClusterUnavailable) as exc:
            message = redact(str(exc), ())
            self._note_unreachable(cluster, message)
            for target in targets:
                target.quiet_view = None  # its status now says unreachable: the next listing must be acted on
                await self.publisher.publish(target, unreachable_status(target, message))
            self._converging.discard(cluster)  # asked again every `unreachable_retry` s, not at the fast pace
            return
        self._listed[cluster] = len(listing)
        connect_starting = self._note_tasks_starting(cluster, listing, targets, time.monotonic())
        if self._unreachable.ended(cluster):
            log.info("Kafka Connect reachable again", extra={"cluster": cluster})
        self.clusters.note_listing(cluster, listing)
        # While connectors are converging, learn their topics quickly; at rest, only a few per sync;
        # none while earlier creates are still under way (Connect is busy enough with those) or new
        # connectors are still starting: their Ready comes first, and topic asks and the status writes
        # they bring would queue ahead of it. Nor while Connect is still starting ours (`tasks_starting`).
        if not quiet or connect_starting:
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
            and not self._at_rest(t, listing, asking_topics=refresh_budget[0] > 0)
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

    def _at_rest(self, target: Target, listing: dict[str, ConnectorView], *, asking_topics: bool) -> bool:
        """A resource whose last reconcile left nothing to do, and whose connector has not moved since,
        needs no reconcile now: a sync of 500 quiet connectors then costs little more than its listing.
        Its topics being due counts only when this sync asks for topics."""
        assert target.spec is not None
        quiet, observed = target.quiet_view, listing.get(target.spec.connector)
        if quiet is None or observed is None or not reconcile.at_rest(quiet, observed):
            return False
        topics_due = asking_topics and target.owned and target.topics_due_now()
        return not self.publisher.heartbeat_due(target) and not topics_due

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

    def _note_tasks_starting(
        self, cluster: str, listing: dict[str, ConnectorView], targets: list[Target], now: float
    ) -> bool:
        """Count ours that Connect has not started; whether topic asks and config reads wait for them (logged
        when that changes)."""
        held = self.tasks_starting.holds(cluster, now)
        self.tasks_starting.observe(cluster, listing, (t.spec.connector for t in targets if t.spec), now)
        holds = self.tasks_starting.holds(cluster, now)
        if holds != held:
            log.info(
                "Kafka Connect is starting our connectors: topic asks and config reads wait"
                if not held
                else "topic asks and config reads go on",
                extra={"cluster": cluster, "not_started": self.tasks_starting.count(cluster)},
            )
        return holds

    def _note_unreachable(self, cluster: str, message: str) -> None:
        """Log an outage when it starts or its error changes, then at most every `unreachable_log_every` s:
        a thousand Connects on a cluster that is down make one line per cluster, not one per poll."""
        if self._unreachable.due(cluster, message):
            log.warning("Kafka Connect unreachable", extra={"cluster": cluster, "error": message})

    async def _reconcile(
        self, client: ConnectClient, target: Target, listing: dict[str, ConnectorView], refresh_budget: list[int]
    ) -> bool:
        """One resource's reconcile (`steps.Steps.reconcile`); True when it needs no further attention now."""
        return await self.steps.reconcile(client, target, listing, refresh_budget)

    async def aclose(self) -> None:
        tasks = [*self._in_flight.values(), *self.deleter.tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
