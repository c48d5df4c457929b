"""The ConnectClusters the operator knows: one REST client each, probed at a slow pace.

kopf passes ConnectCluster and Namespace watch events here. Each cluster gets a client with its
credentials and TLS (Secrets read when the cluster is seen, and again while they are missing), and a
probe that writes its status: reachable, Kafka Connect version, the installed connector plugins (the
"installed connects" of DataFibers), and the workers and connectors the Connect sync saw in its
listings. The probe runs when a cluster changes and then every `ClusterSettings.refresh` seconds
(every `ConnectPolicy.probe_retry` while it fails); the Connect sync's listings stay the only
per-interval call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fibers import conditions, credentials
from fibers.conditions import READY, RECONCILING, STALLED, Condition, format_time, utcnow
from fibers.connect.clusters import KIND, PLURAL, ClusterSpec, parse_cluster
from fibers.connect.policy import POLICY, ConnectPolicy
from fibers.connect.rest import ConnectClient, ConnectError, ConnectorView, ConnectUnreachable
from fibers.kube import Kube, describe
from fibers.redact import redact
from fibers.wake import sleep_until_woken

log = logging.getLogger("fibers.connect.clusters")
PROBED = ("version", "commit", "kafkaClusterId", "plugins", "pluginCount", "pluginsReadTime")  # kept while unreachable


@dataclass
class ClusterSettings:
    """What the deployment gives the registry (see `fibers.controller`); the tuned numbers are `ConnectPolicy`'s."""

    refresh: float = 300.0  # seconds between probes of a reachable cluster (version, plugins)
    # The namespaces a ConnectCluster's Secrets may be in (`fibers.credentials`); None: any, for an operator
    # run by hand.
    secret_namespaces: frozenset[str] | None = None


class ClusterUnavailable(Exception):
    """No client for the cluster: it does not exist (any more), or its credentials cannot be read."""


@dataclass
class Known:
    spec: ClusterSpec
    uid: str
    client: ConnectClient | None = None
    problem: str = ""  # why there is no client (a Secret missing), for status and the Connects using it
    secrets: tuple[str, ...] = ()
    status: dict[str, Any] = field(default_factory=dict)  # last written
    probed_at: float = 0.0
    due: float = 0.0  # monotonic time of the next probe
    workers: tuple[str, ...] = ()
    connectors: int | None = None


class ConnectClusters:
    def __init__(self, kube: Kube, settings: ClusterSettings, policy: ConnectPolicy = POLICY) -> None:
        self.kube = kube
        self.settings = settings
        self.policy = policy
        self.known: dict[str, Known] = {}
        self.namespace_labels: dict[str, dict[str, str]] = {}
        self.on_change: Callable[[], None] = lambda: None  # the Connect sync re-places its resources
        self._wake = asyncio.Event()
        self._retiring: set[asyncio.Task[None]] = set()  # old clients closing (held: the loop keeps weak refs)

    # ----- from kopf's watches ---------------------------------------------------------------------

    async def observe(self, event_type: str | None, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        name = meta["name"]
        if event_type == "DELETED":
            # Not the DELETED of an earlier cluster of this name handled after the new one's first event
            # (kopf handles each uid's events apart): the new one stays.
            if (current := self.known.get(name)) and current.uid != meta.get("uid"):
                return
            if gone := self.known.pop(name, None):
                await self._close(gone)
            self.on_change()
            return
        spec = parse_cluster(name, dict(body.get("spec") or {}), int(meta.get("generation", 0)))
        current = self.known.get(name)
        if current and current.uid == meta["uid"] and current.spec == spec:
            return
        if current:
            await self._close(current)
        known = Known(
            spec=spec, uid=meta["uid"], status=dict((current.status if current else body.get("status")) or {})
        )
        await self._connect(known)
        self.known[name] = known
        log.info("ConnectCluster registered", extra={"cluster": name, "url": redact(spec.url, ())})
        self.on_change()
        self._wake.set()

    def namespace_event(self, event_type: str | None, body: dict[str, Any]) -> None:
        """Namespace labels decide which clusters a namespace may use."""
        name = body["metadata"]["name"]
        labels = dict(body["metadata"].get("labels") or {})
        if event_type == "DELETED":
            self.namespace_labels.pop(name, None)
        elif self.namespace_labels.get(name) != labels:
            known = name in self.namespace_labels
            self.namespace_labels[name] = labels
            if known:
                self.on_change()

    async def labels_of(self, namespace: str) -> dict[str, str]:
        """A namespace's labels, from the watch; read directly while the watch has not listed it yet."""
        if namespace not in self.namespace_labels:
            self.namespace_labels[namespace] = await self.kube.namespace_labels(namespace)
        return self.namespace_labels[namespace]

    async def secret_changed(self, namespace: str, secret: str) -> None:
        """A Secret changed (the operator's watch of Secrets): each cluster naming it gets a client with the
        values read now and is probed at once. A rotated password or token reaches the cluster's calls
        without a spec change; the old client is closed once calls already under way on it have ended."""
        for name, known in self.known.items():
            if (namespace, secret) not in credentials.named(known.spec.auth):
                continue
            old = known.client
            known.client = None
            await self._connect(known)
            if old is not None:
                self._retire(old)
            log.info(
                "ConnectCluster credentials read again", extra={"cluster": name, "secret": f"{namespace}/{secret}"}
            )
            known.due = 0.0
            self.on_change()
            self._wake.set()

    def _retire(self, old: ConnectClient) -> None:
        async def close_later() -> None:
            await asyncio.sleep(self.policy.call_timeout)
            await old.aclose()

        task = asyncio.create_task(close_later())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    # ----- clients ---------------------------------------------------------------------------------

    def specs(self) -> dict[str, ClusterSpec]:
        return {name: k.spec for name, k in self.known.items()}

    def client(self, name: str) -> ConnectClient:
        known = self.known.get(name)
        if known is None:
            raise ClusterUnavailable(f"ConnectCluster {name} does not exist")
        if known.client is None:
            raise ClusterUnavailable(f"ConnectCluster {name}: {known.problem}")
        return known.client

    async def gone(self, name: str) -> bool:
        """The ConnectCluster does not exist. Asked of the API server when the watch has not shown it: at
        start-up, Connects may be seen before ConnectClusters (kopf watches the kinds side by side)."""
        if name in self.known:
            return False
        return not name or await self.kube.get_cluster_object(PLURAL, name) is None

    def kafka_bootstrap(self, name: str) -> str:
        """The Kafka the cluster's connectors use, as its spec names it ("" when it does not)."""
        known = self.known.get(name)
        return known.spec.kafka_bootstrap if known else ""

    def kafka_ids(self) -> dict[str, str | None]:
        """Per cluster, the id of the Kafka its Kafka Connect reports ("" if none; None until first probed),
        for `fibers.connect.groups`. A restarted operator has it from the status its predecessor wrote."""
        return {name: k.status.get("kafkaClusterId") for name, k in self.known.items()}

    def plugins(self, name: str) -> list[dict[str, str]]:
        """The cluster's connector plugins as last probed ([] when not known yet)."""
        known = self.known.get(name)
        return list(known.status.get("plugins") or []) if known else []

    async def _connect(self, known: Known) -> None:
        """Build the cluster's client from its Secrets; a Secret that cannot be read is a problem, read again."""
        spec = known.spec
        try:
            found = await credentials.resolve(spec.auth, self.kube, self.settings.secret_namespaces, KIND)
        except Exception as exc:  # reported, and read again
            known.problem = credentials.problem(exc)
            return
        known.problem, known.secrets = "", found.secrets
        known.client = ConnectClient(
            spec.url,
            timeout=self.policy.call_timeout,
            parallel=self.policy.parallel_calls,
            headers=found.headers,
            tls=found.tls,
        )

    @staticmethod
    async def _close(known: Known) -> None:
        if known.client:
            await known.client.aclose()

    async def aclose(self) -> None:
        for known in self.known.values():
            await self._close(known)

    # ----- what the Connect sync saw ---------------------------------------------------------------

    def note_listing(self, name: str, listing: dict[str, ConnectorView]) -> None:
        """Workers running connectors or tasks, and the number of connectors, from a sync's listing."""
        known = self.known.get(name)
        if known is None:
            return
        workers = {v.worker_id for v in listing.values() if v.worker_id}
        workers |= {t.worker_id for v in listing.values() for t in v.tasks if t.worker_id}
        seen = tuple(sorted(workers))
        if (seen, len(listing)) != (known.workers, known.connectors):
            known.workers, known.connectors = seen, len(listing)
            known.due = min(known.due, time.monotonic())  # written with the next probe, now
            self._wake.set()

    # ----- the probe loop --------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            now = time.monotonic()
            due = [k for k in self.known.values() if k.due <= now]
            await asyncio.gather(*(self._probe(k) for k in due), return_exceptions=True)
            waits = [k.due - time.monotonic() for k in self.known.values()]
            timeout = max(self.policy.probe_floor, min(waits, default=self.settings.refresh))
            self._wake.clear()
            await sleep_until_woken(self._wake, timeout)

    async def _probe(self, known: Known) -> None:
        """Ask the cluster what it is and what it has (when the last answer is old), and write the status."""
        if known.client is None:
            await self._connect(known)
        found = {k: v for k, v in known.status.items() if k in PROBED}
        try:
            if known.client is None:
                raise ClusterUnavailable(known.problem)
            if time.monotonic() - known.probed_at >= self.settings.refresh or "plugins" not in found:
                info, plugins = await asyncio.gather(known.client.server_info(), known.client.plugins())
                known.probed_at = time.monotonic()
                plugins.sort(key=lambda p: (p["type"], p["class"]))
                found.update(version=info.get("version", ""), commit=info.get("commit", ""))
                found.update(kafkaClusterId=info.get("kafka_cluster_id", ""), pluginCount=len(plugins))
                if plugins != found.get("plugins"):
                    found.update(plugins=plugins, pluginsReadTime=format_time(utcnow()))
            message = f"Kafka Connect {found['version']} answers at {redact(known.spec.url, ())}"
            conds = [
                Condition(READY, True, "Reachable", message),
                Condition(RECONCILING, False, "Reachable", ""),
                Condition(STALLED, False, "Reachable", ""),
            ]
            known.due = known.probed_at + self.settings.refresh
        except (ConnectUnreachable, ConnectError, ClusterUnavailable) as exc:
            reason = "CredentialsUnavailable" if isinstance(exc, ClusterUnavailable) else "Unreachable"
            conds = [
                Condition(READY, False, reason, redact(str(exc), known.secrets)),
                Condition(RECONCILING, True, reason, f"tried again every {self.policy.probe_retry:.0f} s"),
                Condition(STALLED, False, reason, ""),
            ]
            known.probed_at, known.due = 0.0, time.monotonic() + self.policy.probe_retry
        await self._write(known, found, conds)

    async def _write(self, known: Known, found: dict[str, Any], conds: list[Condition]) -> None:
        name, generation = known.spec.name, known.spec.generation
        status: dict[str, Any] = {"url": redact(known.spec.url, ()), "observedGeneration": generation, **found}
        if known.connectors is None:  # no listing seen by this process yet: what the last one wrote stands
            status.update({k: known.status[k] for k in LISTED if k in known.status})
        else:
            if known.workers:
                status.update(workers=list(known.workers), workerCount=len(known.workers))
            status["connectors"] = known.connectors
        now = format_time(utcnow())
        status["conditions"] = conditions.merge(known.status.get("conditions"), conds, generation, now)
        if _significant(status) == _significant(known.status):
            return
        status["lastProbeTime"] = now
        try:
            await self.kube.replace_cluster_status(PLURAL, name, status, known.status)
        except Exception as exc:
            log.warning("cannot write ConnectCluster status: %s", describe(exc), extra={"cluster": name})
            return
        before = conditions.find(known.status.get("conditions"), READY) or {}
        known.status = status
        after = conditions.find(status["conditions"], READY) or {}
        if before.get("status") != after.get("status"):
            level = logging.INFO if after.get("status") == "True" else logging.WARNING
            log.log(level, "ConnectCluster %s: %s", after.get("reason"), after.get("message"), extra={"cluster": name})


# What a cluster's status says from the Connect sync's listings (`note_listing`), not from its probe. A
# restarted operator wrote them away with its first probe and back with its first listing: two writes of
# every ConnectCluster that had not changed (bench/operator_restart).
LISTED = ("workers", "workerCount", "connectors")


def _significant(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k != "lastProbeTime"}
