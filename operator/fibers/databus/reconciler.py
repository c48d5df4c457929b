"""The DatabusConsumer reconciler: a StatefulSet in, checkpoint ConfigMap out.

It keeps the StatefulSet of the consumer's instances matching the spec, carries out seeks, and mirrors
the checkpoints (written by the consumers themselves) into the resource's status, with what the
instances say of themselves (`instances`). A malformed checkpoint is reported, never rewritten.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fibers import conditions, metrics, podpolicy, upstream
from fibers.api import object_ref
from fibers.conditions import READY, Condition, format_time, utcnow
from fibers.databus import instances, owners, stats, workload
from fibers.databus.checkpoint import CheckpointError
from fibers.databus.config import ConsumerConfig, sink_name, sink_specs
from fibers.databus.owners import LABEL_CONSUMER
from fibers.databus.policy import SEEK_STOP_POLL_SECONDS, SEEK_STOP_WAIT_SECONDS
from fibers.databus.timelines import STOPPED_ANNOTATION, Checkpoints, progressed
from fibers.databus.workload import PLURAL
from fibers.kube import Kube
from fibers.kubeapi import path
from fibers.podpolicy import PodPolicy
from fibers.reconciles import Again
from fibers.redact import redact, truncate
from fibers.registries import PLURAL as REGISTRIES
from fibers.registries import RegistryNotChosen, choose_registry, needs_namespace, parse_registries

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
        dependents: upstream.Dependents | None = None,
        policy: PodPolicy = podpolicy.OPEN,
    ) -> None:
        self.kube = kube
        self.policy = policy  # what a spec may ask of its pods (images, ServiceAccounts)
        self.dependents = dependents or upstream.Dependents()  # what each consumer's sourceRefs name
        self.schema_registry = schema_registry  # the operator's default SchemaRegistry (spec.relay.avro)
        self.lineage = lineage  # {topic, bootstrapServers, namespace} of OpenLineage events, or None
        self.kafka_bootstrap, self.image, self.service_account = kafka_bootstrap, image, service_account
        self.image_pull_policy = image_pull_policy
        self._told: set[tuple[str, str, str]] = set()  # topic changes upstream already announced (an Event each)
        self._skipped: set[tuple[str, str, str]] = set()  # instance figures already said to be ignored

    async def reconcile(self, namespace: str, name: str) -> Again | None:
        """Look at one consumer; None when it is gone (or going: its delete handler has the rest)."""
        # The queue (fibers.reconciles) never runs two reconciles of one resource at once: no lock here.
        body = await self.kube.get_object(PLURAL, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        with metrics.reconciling(workload.KIND):
            return await self._reconcile(body)

    async def _registry_url(self, namespace: str, spec: dict[str, Any]) -> str | None:
        """The schema registry of spec.relay.avro (None: JSON values); ValueError names what is missing."""
        avro = (spec.get("relay") or {}).get("avro")
        if avro is None:
            return None
        registries = parse_registries(await self.kube.list_cluster_objects(REGISTRIES))
        labels = (namespace, await self.kube.namespace_labels(namespace)) if needs_namespace(registries) else None
        try:
            return choose_registry(avro.get("registry"), registries, self.schema_registry, labels).url
        except RegistryNotChosen as exc:
            raise ValueError(f"spec.relay.avro: {exc}") from None

    async def _reconcile(self, body: dict[str, Any]) -> Again:
        meta, spec = body["metadata"], body["spec"]
        namespace, name = meta["namespace"], meta["name"]
        status = dict(body.get("status") or {})
        ctx = {"namespace": namespace, "resource": name}
        sts_url = path("apps/v1", "statefulsets", namespace, name)
        existing = await self.kube.read(sts_url)
        cm = await self.kube.read(path("v1", "configmaps", namespace, workload.checkpoint_config_map(body)))
        # A ConfigMap or StatefulSet of those names that is not this consumer's is never read, changed or
        # deleted: nothing starts, and no seek runs, until the name is changed (`owners`).
        conflict = owners.foreign_workload(existing, name) or owners.foreign_checkpoint(cm, name)
        if conflict:
            existing, cm = None, None  # nothing of them is acted on, or shown as this consumer's

        seek = spec.get("seek")
        if seek and seek["nonce"] != status.get("lastSeekNonce") and not conflict:
            await self._seek(body, seek, ctx)
            status["lastSeekNonce"] = seek["nonce"]
            await self.kube.replace_status(PLURAL, namespace, name, status, body.get("status") or {})
            body["status"] = dict(status)
            existing = cm = None
        start = seek["to"] if seek and seek["nonce"] == status.get("lastSeekNonce") else None

        # What sourceRefs point at, read now: their topics, and whether they are healthy.
        refs = upstream.refs_in(spec.get("sourceRefs") or [], "spec.sourceRefs")
        self.dependents.note((workload.KIND, namespace, name), refs)
        upstreams = await upstream.resolve(self.kube.get_object, namespace, refs)
        health = upstream.condition(upstreams, namespace)
        if event := upstream.transition(status.get("conditions"), health):
            self._post(body, *event)
        pinned = status.get("sources") if upstreams and status.get("timelines") else None
        topics, waiting, moved = workload.consumed_topics(spec, upstreams, pinned, namespace)
        producers = workload.producers(upstreams, namespace)
        if topics and not (waiting or conflict):
            conflict = await self._foreign_lease(namespace, name, topics)
        if moved and (namespace, name, moved) not in self._told:
            self._told.add((namespace, name, moved))
            self._post(
                body,
                "UpstreamTopicsChanged",
                f"{moved}: its checkpoints are for those; create a new consumer to follow the new topics",
                False,
            )

        # The configuration is rendered and checked before anything is touched: a spec that cannot
        # run creates nothing and stops nothing (a running consumer keeps running), and neither does
        # one whose topics are not known yet.
        problem = ""
        manifest: dict[str, Any] | None = None
        try:
            refused = self.policy.problems(
                image=("spec.image", spec.get("image")),
                service_account=("spec.serviceAccount", spec.get("serviceAccount")),
            )
            if refused:
                raise ValueError("; ".join(refused))
            registry_url = await self._registry_url(namespace, spec)
            if not waiting:
                config = workload.render_config(
                    body,
                    topics=topics,
                    producers=producers,
                    kafka_bootstrap=self.kafka_bootstrap,
                    start_position=start,
                    registry_url=registry_url,
                    lineage=self.lineage,
                )
                ConsumerConfig.from_dict(config).check()  # what the pod would refuse, answered here
                manifest = workload.statefulset(
                    body,
                    config=config,
                    image=self.image,
                    image_pull_policy=self.image_pull_policy,
                    service_account=self.service_account,
                )
        except ValueError as exc:
            problem = str(exc)
        if manifest is not None and not (problem or conflict):
            await self._apply(manifest, existing, ctx)
        if spec.get("restartNonce"):
            status["lastRestartNonce"] = spec["restartNonce"]

        new_status = await self._observe(body, status, problem, waiting, topics, health, existing, cm, conflict)
        if "lag" in new_status:
            metrics.CONSUMER_LAG.labels(namespace, name).set(new_status["lag"])
            metrics.CONSUMER_EVENTS.labels(namespace, name).set(new_status.get("eventsProcessed", 0))
        metrics.consumer_sinks(namespace, name, new_status.get("sinks") or [])
        if new_status != body.get("status"):
            await self.kube.replace_status(PLURAL, namespace, name, new_status, body.get("status") or {})
            self._announce(body, status, new_status)
        # A missing SchemaRegistry sends no event this operator follows: such a spec is looked at again.
        # Everything else it reads (children, sourceRefs) brings it back when it changes.
        return Again(waiting=bool(problem or conflict))

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
        ref = object_ref(workload.KIND, meta["namespace"], meta["name"], meta["uid"])
        self.kube.post_event_soon(ref, reason, message, warning=warning)

    async def _apply(self, manifest: dict[str, Any], current: dict[str, Any] | None, ctx: dict[str, Any]) -> None:
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        if current is None:
            await self.kube.call("POST", path("apps/v1", "statefulsets", namespace), body=manifest)
            log.info("instances created", extra={**ctx, "replicas": manifest["spec"]["replicas"]})
            return
        spec = current.get("spec") or {}
        template = (spec.get("template") or {}).get("metadata", {}).get("annotations") or {}
        wanted = manifest["spec"]["template"]["metadata"]["annotations"]
        if template != wanted or spec.get("replicas") != manifest["spec"]["replicas"]:
            patch = {"spec": {"replicas": manifest["spec"]["replicas"], "template": manifest["spec"]["template"]}}
            # A strategic merge patch, as kubectl's: the pod template's lists merge by name.
            await self.kube.call(
                "PATCH",
                path("apps/v1", "statefulsets", namespace, name),
                body=patch,
                content_type="application/strategic-merge-patch+json",
            )
            log.info("instances updated", extra={**ctx, "replicas": manifest["spec"]["replicas"]})

    async def _seek(self, body: dict[str, Any], seek: dict[str, Any], ctx: dict[str, Any]) -> None:
        """Stop every instance, drop the checkpoints, and let the consumers start again from `to`."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        await self.kube.delete(path("apps/v1", "statefulsets", namespace, name), propagation="Foreground")
        selector = f"{LABEL_CONSUMER}={body['metadata']['name']}"
        deadline = time.monotonic() + SEEK_STOP_WAIT_SECONDS
        while time.monotonic() < deadline and await self.kube.items(
            path("v1", "pods", namespace), labelSelector=selector
        ):
            await asyncio.sleep(SEEK_STOP_POLL_SECONDS)
        await self.delete_checkpoints(body)
        log.warning("seek: checkpoints removed", extra={**ctx, "to": seek["to"], "nonce": seek["nonce"]})

    async def _foreign_lease(self, namespace: str, name: str, topics: list[str]) -> str:
        """A Lease named as one of the consumer's partitions that its instances did not make: they leave it
        (and its partition) alone, and the consumer says so."""
        leases = await self.kube.items(path("coordination.k8s.io/v1", "leases", namespace))
        return owners.foreign_leases(leases, name, [owners.lease_prefix(name, topic) for topic in topics])

    async def delete_checkpoints(self, body: dict[str, Any]) -> None:
        """Delete the consumer's checkpoint ConfigMap (a seek, or `retention: Delete`), if it is the consumer's:
        one of that name it did not create is left (`owners`), and the delete is for the object
        read (its uid), not for one made under that name since."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        url = path("v1", "configmaps", namespace, workload.checkpoint_config_map(body))
        cm = await self.kube.read(url)
        if cm is None or owners.foreign_checkpoint(cm, name):
            return
        await self.kube.delete(url, uid=cm["metadata"]["uid"])

    async def _observe(
        self,
        body: dict[str, Any],
        status: dict[str, Any],
        problem: str,
        waiting: str,
        topics: list[str],
        health: Condition,
        sts: dict[str, Any] | None,
        cm: dict[str, Any] | None,
        conflict: str,
    ) -> dict[str, Any]:
        """The status: the checkpoints, the figures the instances recorded, and the StatefulSet's ready pods
        (as read at the start of this reconcile: the next one sees what this one changed)."""
        meta, spec = body["metadata"], body["spec"]
        namespace, name = meta["namespace"], meta["name"]
        generation = int(meta.get("generation", 0))
        cm_name = workload.checkpoint_config_map(body)
        new: dict[str, Any] = {k: v for k, v in status.items() if k in ("lastRestartNonce", "lastSeekNonce")}
        new.update(observedGeneration=generation, checkpointConfigMap=cm_name)
        if topics and not waiting:
            new["sources"] = topics
        elif status.get("sources"):
            new["sources"] = status["sources"]

        invalid = ""
        if cm is not None and new.get("sources"):  # sources not resolved yet: nothing to read them against
            try:
                checkpoints = Checkpoints.from_configmap_data(cm.get("data") or {}, list(new["sources"]))
            except CheckpointError as exc:
                invalid = f"checkpoint ConfigMap {cm_name} cannot be used: {exc}"
            else:
                annotations = cm["metadata"].get("annotations") or {}
                _mirror_checkpoints(new, checkpoints)
                figures, skipped = stats.instance_stats(annotations, int(spec.get("instances", 1)))
                self._say_skipped(namespace, name, skipped)
                stats.mirror(new, figures, [sink_name(sink) for _, sink in sink_specs(spec)])

        new["readyInstances"] = int(((sts or {}).get("status") or {}).get("readyReplicas") or 0)
        cm_annotations = (cm or {}).get("metadata", {}).get("annotations") or {}
        stopped = stopped_instances(cm_annotations, int(spec.get("instances", 1)))
        pods = await self.kube.items(path("v1", "pods", namespace), labelSelector=f"{LABEL_CONSUMER}={name}")
        failure = stopped or instances.exit_message(pods)
        unready = ""
        if sts and not failure and new["readyInstances"] < int(spec.get("instances", 1)):
            unready = await instances.unready_reasons(pods, sts["metadata"]["uid"])

        conds, phase = _conditions(
            spec, new, problem, invalid, failure, waiting, halted=bool(stopped), conflict=conflict, unready=unready
        )
        conds = [*conditions.with_upstream_note(conds, health), health]
        new["phase"] = phase
        new["conditions"] = conditions.merge(status.get("conditions"), conds, generation, format_time(utcnow()))
        return new

    def forget(self, namespace: str, name: str) -> None:
        """A deleted consumer: what was said about it once may be said again of a new one of its name."""
        self._skipped = {said for said in self._skipped if said[:2] != (namespace, name)}
        self._told = {told for told in self._told if told[:2] != (namespace, name)}

    def _say_skipped(self, namespace: str, name: str, skipped: list[str]) -> None:
        """Figures a pod wrote that are not read (`stats`): said once each, not at every reconcile."""
        for what in skipped:
            if (namespace, name, what) not in self._skipped:
                self._skipped.add((namespace, name, what))
                log.warning("instance figures ignored: %s", what, extra={"namespace": namespace, "resource": name})


def _mirror_checkpoints(status: dict[str, Any], checkpoints: Checkpoints) -> None:
    progress = progressed(checkpoints.values())
    if progress:  # INIT alone: nothing consumed yet
        status["consumptionMode"] = min((cp.consumption_mode.value for cp in progress), key=MODE_ORDER.index)
        status["windowScn"] = min(cp.window_scn for cp in progress)
        status["prevScn"] = min(cp.prev_scn for cp in progress)
    if len(checkpoints):
        status["timelines"] = len(checkpoints)


def stopped_instances(annotations: dict[str, str], instances: int) -> str:
    """Why an instance stopped for good and waits to be replaced (the first current one), or "".

    A consumer pod that cannot go on says so on its checkpoint ConfigMap and waits, rather than exit and
    be restarted into the same failure (a crash loop); the pods that replace it clear it when they start.
    """
    for key, value in sorted(annotations.items()):
        ordinal = key.removeprefix(STOPPED_ANNOTATION)
        if key.startswith(STOPPED_ANNOTATION) and ordinal.isdigit() and int(ordinal) < instances and value:
            return truncate(redact(value, ()))
    return ""


def _conditions(
    spec: dict[str, Any],
    status: dict[str, Any],
    problem: str,
    invalid: str,
    failure: str,
    waiting: str,
    *,
    halted: bool = False,
    conflict: str = "",
    unready: str = "",
) -> tuple[list[Condition], str]:
    if problem:
        return conditions.stalled("InvalidSpec", problem), "Failed"
    if conflict:
        return conditions.stalled("Conflict", conflict), "Failed"
    if invalid:
        return conditions.stalled("CheckpointInvalid", invalid), "Failed"
    if waiting:
        return conditions.waiting("SourcesNotResolved", f"waiting for its sourceRefs: {waiting}"), "Pending"
    if spec.get("state") == "stopped":
        return conditions.ready("Stopped", "no instance runs; checkpoints are kept"), "Stopped"
    if failure:
        reason = failure.split(":", 1)[0] if failure.split(":", 1)[0].isalnum() else "ConsumerFailing"
        verb = "stopped and waits to be replaced" if halted else "exited"
        return conditions.waiting(reason, f"an instance {verb}: {failure}"), "Failed"
    wanted = int(spec.get("instances", 1))
    if unready:  # running, but held up (the API server does not take its checkpoints): it says why
        return conditions.waiting(
            "InstancesWaiting", f"{status['readyInstances']}/{wanted} instances ready; {unready}"
        ), "Pending"
    mode = status.get("consumptionMode", "INIT")
    if mode.startswith("BOOTSTRAP"):
        return conditions.waiting("Bootstrapping", f"bootstrapping ({mode})"), "Bootstrapping"
    if status["readyInstances"] < wanted:
        return conditions.waiting("Starting", f"{status['readyInstances']}/{wanted} instances ready"), "Pending"
    if "consumptionMode" not in status:  # nothing consumed yet (a quiet source), or not checkpointed yet
        return conditions.ready("Consuming", f"{wanted} instance(s) running; no checkpoint yet"), "Running"
    return conditions.ready("Consuming", f"{wanted} instance(s) consuming online"), "Running"
