"""The DatabusConsumer reconciler: Deployments in, checkpoint ConfigMap out.

It keeps one Deployment per instance matching the spec, carries out seeks, and mirrors the
checkpoints (written by the consumers themselves) into the resource's status. A malformed
checkpoint is reported, never rewritten.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from typing import Any

from fibers import conditions, metrics, upstream
from fibers.api import object_ref
from fibers.conditions import READY, RECONCILING, STALLED, Condition, format_time, utcnow
from fibers.databus import deployments
from fibers.databus.checkpoint import CheckpointError, Checkpoints
from fibers.databus.checkpoint_store import STATS_ANNOTATION
from fibers.databus.config import ConsumerConfig
from fibers.databus.deployments import LABEL_CONSUMER, PLURAL
from fibers.kube import Kube
from fibers.kubeapi import path
from fibers.redact import redact, truncate
from fibers.registries import PLURAL as REGISTRIES
from fibers.registries import RegistryNotChosen, choose_registry, parse_registries

log = logging.getLogger("fibers.databus.operator")
MODE_ORDER = ["INIT", "BOOTSTRAP_SNAPSHOT", "BOOTSTRAP_CATCHUP", "ONLINE_CONSUMPTION"]


class DatabusReconciler:
    def __init__(
        self,
        kube: Kube,
        *,
        kafka_bootstrap: str | None,
        image: str,
        service_account: str | None,
        image_pull_policy: str = "IfNotPresent",
        schema_registry: str | None = None,
        lineage: dict[str, str] | None = None,
    ) -> None:
        self.kube = kube
        self.schema_registry = schema_registry  # the operator's default SchemaRegistry (spec.relay.avro)
        self.lineage = lineage  # {topic, bootstrapServers, namespace} of OpenLineage events, or None
        self.kafka_bootstrap, self.image, self.service_account = kafka_bootstrap, image, service_account
        self.image_pull_policy = image_pull_policy
        self._locks: dict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self._told: set[tuple[str, str, str]] = set()  # topic changes upstream already announced (an Event each)

    async def reconcile(self, namespace: str, name: str) -> None:
        async with self._locks[(namespace, name)]:
            body = await self.kube.get_object(PLURAL, namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                return
            with metrics.reconciling(deployments.KIND):
                await self._reconcile(body)

    async def _deployments(self, namespace: str, name: str) -> dict[str, dict[str, Any]]:
        found = await self.kube.items(
            path("apps/v1", "deployments", namespace), labelSelector=f"{LABEL_CONSUMER}={name}"
        )
        return {str(d["metadata"]["name"]): d for d in found}

    async def _registry_url(self, spec: dict[str, Any]) -> str | None:
        """The schema registry of spec.relay.avro (None: JSON values); ValueError names what is missing."""
        avro = (spec.get("relay") or {}).get("avro")
        if avro is None:
            return None
        registries = parse_registries(await self.kube.list_cluster_objects(REGISTRIES))
        try:
            return choose_registry(avro.get("registry"), registries, self.schema_registry).url
        except RegistryNotChosen as exc:
            raise ValueError(f"spec.relay.avro: {exc}") from None

    async def _reconcile(self, body: dict[str, Any]) -> None:
        meta, spec = body["metadata"], body["spec"]
        namespace, name = meta["namespace"], meta["name"]
        status = dict(body.get("status") or {})
        ctx = {"namespace": namespace, "resource": name}
        existing = await self._deployments(namespace, name)

        seek = spec.get("seek")
        if seek and seek["nonce"] != status.get("lastSeekNonce"):
            await self._seek(body, existing, seek, ctx)
            status["lastSeekNonce"] = seek["nonce"]
            await self.kube.replace_status(PLURAL, namespace, name, status, body.get("status") or {})
            body["status"] = dict(status)
            existing = {}
        start = seek["to"] if seek and seek["nonce"] == status.get("lastSeekNonce") else None

        # What sourceRefs point at, read now: their topics, and whether they are healthy.
        upstreams = await upstream.resolve(
            self.kube.get_object, namespace, upstream.refs_in(spec.get("sourceRefs") or [], "spec.sourceRefs")
        )
        health = upstream.condition(upstreams, namespace)
        if event := upstream.transition(status.get("conditions"), health):
            self._post(body, *event)
        pinned = status.get("sources") if upstreams and status.get("timelines") else None
        topics, waiting, moved = deployments.consumed_topics(spec, upstreams, pinned, namespace)
        producers = deployments.producers(upstreams, namespace)
        if moved and (namespace, name, moved) not in self._told:
            self._told.add((namespace, name, moved))
            self._post(
                body,
                "UpstreamTopicsChanged",
                f"{moved}: its checkpoints are for those; create a new consumer to follow the new topics",
                False,
            )

        # Every instance's configuration is rendered and checked before any is touched: a spec that
        # cannot run creates nothing and stops nothing (a running consumer keeps running), and neither
        # does one whose topics are not known yet.
        problem = ""
        manifests: list[dict[str, Any]] = []
        try:
            registry_url = await self._registry_url(spec)
            for instance in range(int(spec.get("instances", 1)) if not waiting else 0):
                config = deployments.render_config(
                    body,
                    instance=instance,
                    topics=topics,
                    producers=producers,
                    kafka_bootstrap=self.kafka_bootstrap,
                    start_position=start,
                    registry_url=registry_url,
                    lineage=self.lineage,
                )
                ConsumerConfig.from_dict(config).check()  # what the pod would refuse, answered here
                manifests.append(
                    deployments.deployment(
                        body,
                        instance=instance,
                        config=config,
                        image=self.image,
                        image_pull_policy=self.image_pull_policy,
                        service_account=self.service_account,
                    )
                )
        except ValueError as exc:
            problem = str(exc)
        if not problem and not waiting:
            for manifest in manifests:
                await self._apply(manifest, existing.get(manifest["metadata"]["name"]), ctx)
            wanted = {m["metadata"]["name"] for m in manifests}
            for extra in set(existing) - wanted:
                await self.kube.delete(path("apps/v1", "deployments", namespace, extra))
                log.info("instance removed", extra={**ctx, "deployment": extra})
        if spec.get("restartNonce"):
            status["lastRestartNonce"] = spec["restartNonce"]

        new_status = await self._observe(body, status, problem, waiting, topics, health)
        if "lag" in new_status:
            metrics.CONSUMER_LAG.labels(namespace, name).set(new_status["lag"])
            metrics.CONSUMER_EVENTS.labels(namespace, name).set(new_status.get("eventsProcessed", 0))
        if new_status != body.get("status"):
            await self.kube.replace_status(PLURAL, namespace, name, new_status, body.get("status") or {})
            self._announce(body, status, new_status)

    def _announce(self, body: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> None:
        """An Event and a log line when the phase changes (Running, Bootstrapping, Failed, …)."""
        if before.get("phase") == after.get("phase"):
            return
        meta = body["metadata"]
        ready: dict[str, Any] = conditions.find(after.get("conditions"), READY) or {}
        failed = after.get("phase") == "Failed"
        log.log(
            logging.WARNING if failed else logging.INFO,
            "phase %s: %s",
            after.get("phase"),
            ready.get("message"),
            extra={"namespace": meta["namespace"], "resource": meta["name"], "reason": ready.get("reason")},
        )
        self._post(body, str(ready.get("reason", after.get("phase"))), str(ready.get("message", "")), failed)

    def _post(self, body: dict[str, Any], reason: str, message: str, warning: bool) -> None:
        meta = body["metadata"]
        ref = object_ref(deployments.KIND, meta["namespace"], meta["name"], meta["uid"])
        self.kube.post_event_soon(ref, reason, message, warning=warning)

    async def _apply(self, manifest: dict[str, Any], current: dict[str, Any] | None, ctx: dict[str, Any]) -> None:
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        if current is None:
            await self.kube.call("POST", path("apps/v1", "deployments", namespace), body=manifest)
            log.info("instance created", extra={**ctx, "deployment": name})
            return
        spec = current.get("spec") or {}
        template = (spec.get("template") or {}).get("metadata", {}).get("annotations") or {}
        wanted = manifest["spec"]["template"]["metadata"]["annotations"]
        if template != wanted or spec.get("replicas") != manifest["spec"]["replicas"]:
            patch = {"spec": {"replicas": manifest["spec"]["replicas"], "template": manifest["spec"]["template"]}}
            # A strategic merge patch, as kubectl's: the pod template's lists merge by name.
            await self.kube.call(
                "PATCH",
                path("apps/v1", "deployments", namespace, name),
                body=patch,
                content_type="application/strategic-merge-patch+json",
            )
            log.info("instance updated", extra={**ctx, "deployment": name, "replicas": manifest["spec"]["replicas"]})

    async def _seek(
        self, body: dict[str, Any], existing: dict[str, Any], seek: dict[str, Any], ctx: dict[str, Any]
    ) -> None:
        """Stop every instance, drop the checkpoints, and let the consumers start again from `to`."""
        namespace = body["metadata"]["namespace"]
        for name in existing:
            await self.kube.delete(path("apps/v1", "deployments", namespace, name), propagation="Foreground")
        selector = f"{LABEL_CONSUMER}={body['metadata']['name']}"
        for _ in range(120):
            if not await self.kube.items(path("v1", "pods", namespace), labelSelector=selector):
                break
            await asyncio.sleep(0.5)
        await self.kube.delete(path("v1", "configmaps", namespace, deployments.checkpoint_config_map(body)))
        log.warning("seek: checkpoints removed", extra={**ctx, "to": seek["to"], "nonce": seek["nonce"]})

    async def _observe(
        self,
        body: dict[str, Any],
        status: dict[str, Any],
        problem: str,
        waiting: str,
        topics: list[str],
        health: Condition,
    ) -> dict[str, Any]:
        meta, spec = body["metadata"], body["spec"]
        namespace, name = meta["namespace"], meta["name"]
        generation = int(meta.get("generation", 0))
        cm_name = deployments.checkpoint_config_map(body)
        new: dict[str, Any] = {k: v for k, v in status.items() if k in ("lastRestartNonce", "lastSeekNonce")}
        new.update(observedGeneration=generation, checkpointConfigMap=cm_name)
        if topics and not waiting:
            new["sources"] = topics
        elif status.get("sources"):
            new["sources"] = status["sources"]

        cm = await self.kube.read(path("v1", "configmaps", namespace, cm_name))
        invalid = ""
        if cm is not None and new.get("sources"):  # sources not resolved yet: nothing to read them against
            try:
                checkpoints = Checkpoints.from_configmap_data(cm.get("data") or {}, list(new["sources"]))
            except CheckpointError as exc:
                invalid = f"checkpoint ConfigMap {cm_name} cannot be used: {exc}"
            else:
                _mirror_checkpoints(new, checkpoints, cm["metadata"].get("annotations") or {})

        deps = await self._deployments(namespace, name)
        new["readyInstances"] = sum(int((d.get("status") or {}).get("readyReplicas") or 0) for d in deps.values())
        failure = await self._pod_failure(namespace, name)

        conds, phase = _conditions(spec, new, problem, invalid, failure, waiting)
        conds = [*conditions.with_upstream_note(conds, health), health]
        new["phase"] = phase
        new["conditions"] = conditions.merge(status.get("conditions"), conds, generation, format_time(utcnow()))
        return new

    async def _pod_failure(self, namespace: str, name: str) -> str:
        """The last error an instance exited with, while it is not running again."""
        pods = await self.kube.items(path("v1", "pods", namespace), labelSelector=f"{LABEL_CONSUMER}={name}")
        for pod in pods:
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                if cs.get("ready"):
                    continue
                terminated = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
                if terminated and terminated.get("exitCode"):
                    # The consumer's termination message (or, with FallbackToLogsOnError, its log's tail).
                    message = (terminated.get("message") or "").strip() or f"exited with code {terminated['exitCode']}"
                    return truncate(redact(message, ()), 1024)
        return ""


def _mirror_checkpoints(status: dict[str, Any], checkpoints: Checkpoints, annotations: dict[str, str]) -> None:
    if len(checkpoints):
        modes = [cp.consumption_mode.value for cp in checkpoints.values()]
        status["consumptionMode"] = min(modes, key=MODE_ORDER.index)
        status["windowScn"] = min(cp.window_scn for cp in checkpoints.values())
        status["prevScn"] = min(cp.prev_scn for cp in checkpoints.values())
        status["timelines"] = len(checkpoints)
    stats = [json.loads(v) for k, v in annotations.items() if k.startswith(STATS_ANNOTATION)]
    if stats:
        status["lag"] = sum(int(s.get("lag") or 0) for s in stats)
        status["eventsProcessed"] = sum(int(s.get("eventsProcessed") or 0) for s in stats)
        status["lastCheckpointTime"] = max(str(s.get("lastCheckpointTime", "")) for s in stats)
        if sinks := _sink_figures(stats):
            status["sinks"] = sinks


def _sink_figures(stats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each sink's figures summed over the instances (the slowest last batch), in the order first seen."""
    figures: dict[str, dict[str, Any]] = {}
    for instance in stats:
        for own in instance.get("sinks") or []:
            name = str(own.get("name"))
            total = figures.setdefault(name, {"name": name, "windows": 0, "errors": 0, "timeouts": 0})
            for key in ("windows", "errors", "timeouts"):
                total[key] += int(own.get(key) or 0)
            total["lastBatchSeconds"] = max(total.get("lastBatchSeconds", 0.0), float(own.get("lastBatchSeconds") or 0))
    return list(figures.values())


def _conditions(
    spec: dict[str, Any], status: dict[str, Any], problem: str, invalid: str, failure: str, waiting: str
) -> tuple[list[Condition], str]:
    def cond(ready: bool, reconciling: bool, stalled: bool, reason: str, message: str) -> list[Condition]:
        return [
            Condition(READY, ready, reason, message),
            Condition(RECONCILING, reconciling, reason, message),
            Condition(STALLED, stalled, reason, message),
        ]

    if problem:
        return cond(False, False, True, "InvalidSpec", problem), "Failed"
    if invalid:
        return cond(False, False, True, "CheckpointInvalid", invalid), "Failed"
    if waiting:
        return cond(False, True, False, "SourcesNotResolved", f"waiting for its sourceRefs: {waiting}"), "Pending"
    if spec.get("state") == "stopped":
        return cond(True, False, False, "Stopped", "no instance runs; checkpoints are kept"), "Stopped"
    if failure:
        reason = failure.split(":", 1)[0] if failure.split(":", 1)[0].isalnum() else "ConsumerFailing"
        return cond(False, True, False, reason, f"an instance exited: {failure}"), "Failed"
    instances = int(spec.get("instances", 1))
    mode = status.get("consumptionMode", "INIT")
    if mode.startswith("BOOTSTRAP"):
        return cond(False, True, False, "Bootstrapping", f"bootstrapping ({mode})"), "Bootstrapping"
    if status["readyInstances"] < instances:
        return cond(
            False, True, False, "Starting", f"{status['readyInstances']}/{instances} instances ready"
        ), "Pending"
    if "consumptionMode" not in status:  # nothing consumed yet (a quiet source), or not checkpointed yet
        return cond(True, False, False, "Consuming", f"{instances} instance(s) running; no checkpoint yet"), "Running"
    return cond(True, False, False, "Consuming", f"{instances} instance(s) consuming online"), "Running"
