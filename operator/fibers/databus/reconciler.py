"""The DatabusConsumer reconciler: a StatefulSet in, checkpoint ConfigMap out.

It keeps the StatefulSet of the consumer's instances matching the spec, carries out seeks, and mirrors
the checkpoints (written by the consumers themselves) into the resource's status, with what the
instances say of themselves (`instances`). A malformed checkpoint is reported, never rewritten.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from fibers import conditions, metrics, pod_trouble, podpolicy, upstream
from fibers.api import object_ref
from fibers.conditions import READY, Condition, format_time, utcnow
from fibers.databus import instances, owners, report, secrets, stats, workload
from fibers.databus.checkpoint import CheckpointError
from fibers.databus.config import ConsumerConfig, sink_name, sink_specs
from fibers.databus.owners import LABEL_CONSUMER
from fibers.databus.policy import SEEK_RECHECK_SECONDS, SEEK_STOP_POLL_SECONDS, SEEK_STOP_WAIT_SECONDS
from fibers.databus.timelines import Checkpoints
from fibers.databus.workload import PLURAL, seek_position
from fibers.kube import Kube, SecretMissing
from fibers.kubeapi import path
from fibers.podpolicy import PodPolicy
from fibers.reconciles import Again
from fibers.registries import PLURAL as REGISTRIES
from fibers.registries import RegistryNotChosen, choose_registry, needs_namespace, parse_registries
from fibers.secret_refs import SecretRefs
from fibers.startfrom import StartFrom, StartFromError

log = logging.getLogger("fibers.databus.operator")


@dataclass
class Pass:
    """One reconcile of one consumer: the resource, and what each step found for the steps after it."""

    body: dict[str, Any]
    status: dict[str, Any]  # as read, with the nonces this reconcile carried out
    existing: dict[str, Any] | None = None  # its StatefulSet (None: none, or another's)
    cm: dict[str, Any] | None = None  # its checkpoint ConfigMap (None: none, or another's)
    conflict: str = ""  # a StatefulSet, ConfigMap or Lease of its names that is another's
    start: StartFrom | None = None  # the position of a seek under way (spec.seek.startFrom, or its older `to`)
    reapply: bool = False  # that seek's MongoDB sinks write again what a document already holds (seek.sinks)
    health: Condition = field(default_factory=lambda: upstream.condition([], ""))  # UpstreamReady
    topics: list[str] = field(default_factory=list)
    waiting: str = ""  # what its sourceRefs still lack
    producers: dict[str, dict[str, str]] = field(default_factory=dict)  # topic → the resource writing it
    problem: str = ""  # why the spec cannot run (InvalidSpec)
    seek_waiting: str = ""  # a seek whose instances have not all stopped yet: its checkpoints are kept
    seek_due: datetime | None = None  # when that seek looks at its instances again
    manifest: dict[str, Any] | None = None  # the StatefulSet wanted
    new_status: dict[str, Any] = field(default_factory=dict)
    trouble_due: datetime | None = None  # when a pod waiting to be placed has waited long enough to say
    look_due: datetime | None = None  # when to ask a running, not-ready instance again why it is not ready

    @property
    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.body["spec"]
        return spec

    @property
    def paused(self) -> bool:
        return conditions.paused(self.body["metadata"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def context(self) -> dict[str, str]:
        return {"namespace": self.namespace, "resource": self.name}


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
        secret_refs: SecretRefs | None = None,
    ) -> None:
        self.kube = kube
        self.secret_refs = secret_refs or SecretRefs()  # the Secrets each consumer names, for their watch
        self._secrets_changed: dict[tuple[str, str], set[str]] = {}  # consumer → Secrets that changed since
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
        """The steps, in order; each reads what the ones before found (`Pass`)."""
        p = Pass(body, dict(body.get("status") or {}))
        for step in (
            self._read_children,  # its StatefulSet and checkpoint ConfigMap, unless another's (Conflict)
            self._seek,  # a new spec.seek: stop every instance, drop the checkpoints
            self._resolve_sources,  # sourceRefs → topics (UpstreamReady); a planted Lease (Conflict)
            self._render,  # the configuration and StatefulSet, checked before anything is touched
            self._secrets,  # a Secret it names changed: the digest of their values, and a rolling restart if it moved
            self._apply_workload,  # create or patch the StatefulSet
            self._observe,  # the status: checkpoints, figures, what the instances say of themselves
            self._publish,  # metrics, the status when it changed, an Event on a phase change
        ):
            await step(p)
        # A missing SchemaRegistry sends no event this operator follows: such a spec is looked at again.
        # Everything else it reads (children, sourceRefs) brings it back when it changes.
        due = min((at.timestamp() for at in (p.trouble_due, p.look_due, p.seek_due) if at), default=math.inf)
        return Again(at=due, waiting=bool(p.problem or p.conflict))

    async def _read_children(self, p: Pass) -> None:
        p.existing = await self.kube.read(path("apps/v1", "statefulsets", p.namespace, p.name))
        p.cm = await self.kube.read(path("v1", "configmaps", p.namespace, workload.checkpoint_config_map(p.body)))
        # A ConfigMap or StatefulSet of those names that is not this consumer's is never read, changed or
        # deleted: nothing starts, and no seek runs, until the name is changed (`owners`).
        p.conflict = owners.foreign_workload(p.existing, p.name) or owners.foreign_checkpoint(p.cm, p.name)
        if p.conflict:
            p.existing, p.cm = None, None  # nothing of them is acted on, or shown as this consumer's

    async def _seek(self, p: Pass) -> None:
        seek = p.spec.get("seek")
        if seek and seek["nonce"] != p.status.get("lastSeekNonce") and not (p.conflict or p.paused):
            try:  # checked before anything stops: a seek that cannot start leaves the consumer running
                to = seek_position(seek).check(int(time.time() * 1000), "spec.seek.startFrom")
            except StartFromError as exc:
                p.problem = str(exc)
                return
            if running := await self._stop_and_drop_checkpoints(p.body, seek["nonce"], to, p.context):
                p.seek_waiting = (
                    f"seek {seek['nonce']}: {running} instance(s) still running {SEEK_STOP_WAIT_SECONDS:g} s after "
                    "they were told to stop; the checkpoints are dropped once every instance has stopped"
                )
                p.seek_due = utcnow() + timedelta(seconds=SEEK_RECHECK_SECONDS)
                p.existing = None  # deleted: nothing is applied or asked until the seek has run
                return
            p.status["lastSeekNonce"] = seek["nonce"]
            await self.kube.replace_status(PLURAL, p.namespace, p.name, p.status, p.body.get("status") or {})
            p.body["status"] = dict(p.status)
            p.existing = p.cm = None
        if seek and seek["nonce"] == p.status.get("lastSeekNonce"):
            p.start, p.reapply = seek_position(seek), seek.get("sinks") == "reapply"

    async def _resolve_sources(self, p: Pass) -> None:
        """What sourceRefs point at, read now: their topics, and whether they are healthy."""
        refs = upstream.refs_in(p.spec.get("sourceRefs") or [], "spec.sourceRefs")
        self.dependents.note((workload.KIND, p.namespace, p.name), refs)
        upstreams = await upstream.resolve(self.kube.get_object, p.namespace, refs)
        p.health = upstream.condition(upstreams, p.namespace)
        if event := upstream.transition(p.status.get("conditions"), p.health):
            self._post(p.body, *event)
        pinned = p.status.get("sources") if upstreams and p.status.get("timelines") else None
        p.topics, p.waiting, moved = workload.consumed_topics(p.spec, upstreams, pinned, p.namespace)
        p.producers = workload.producers(upstreams, p.namespace)
        # A Lease named as one of its partitions that its instances did not make is left alone, and the consumer
        # says so. A stopped one takes no partition: the Leases (one per running partition) are read once it runs.
        if p.topics and not (p.waiting or p.conflict or report.stopped(p.spec)):
            leases = await self.kube.items(path("coordination.k8s.io/v1", "leases", p.namespace))
            p.conflict = owners.foreign_leases(leases, p.name, [owners.lease_prefix(p.name, t) for t in p.topics])
        if moved and (p.namespace, p.name, moved) not in self._told:
            self._told.add((p.namespace, p.name, moved))
            self._post(
                p.body,
                "UpstreamTopicsChanged",
                f"{moved}: its checkpoints are for those; create a new consumer to follow the new topics",
                False,
            )

    async def _render(self, p: Pass) -> None:
        """The configuration is rendered and checked before anything is touched: a spec that cannot run
        creates nothing and stops nothing (a running consumer keeps running), and neither does one whose
        topics are not known yet."""
        try:
            refused = self.policy.problems(
                image=("spec.image", p.spec.get("image")),
                service_account=("spec.serviceAccount", p.spec.get("serviceAccount")),
            )
            if refused:
                raise ValueError("; ".join(refused))
            registry_url = await self._registry_url(p.namespace, p.spec)
            if not p.waiting:
                config = workload.render_config(
                    p.body,
                    topics=p.topics,
                    producers=p.producers,
                    kafka_bootstrap=self.kafka_bootstrap,
                    seek=p.start,
                    reapply=p.reapply,
                    registry_url=registry_url,
                    lineage=self.lineage,
                )
                ConsumerConfig.from_dict(config).check()  # what the pod would refuse, answered here
                p.manifest = workload.statefulset(
                    p.body,
                    config=config,
                    image=self.image,
                    image_pull_policy=self.image_pull_policy,
                    service_account=self.service_account,
                )
        except ValueError as exc:
            p.problem = str(exc)

    def secret_changed(self, namespace: str, name: str, secret: str) -> None:
        """The watch saw a Secret the consumer names change; its next reconcile reads the values again."""
        self._secrets_changed.setdefault((namespace, name), set()).add(secret)

    async def _secrets(self, p: Pass) -> None:
        refs = secrets.referenced(p.spec)
        self.secret_refs.note(workload.KIND, p.namespace, p.name, {name for name, _ in refs})
        if p.manifest is None:
            return
        changed = self._secrets_changed.pop((p.namespace, p.name), set())
        recorded = ((p.existing or {}).get("metadata") or {}).get("annotations", {}).get(secrets.HASH)
        now = None
        if changed or recorded is None:  # the values are read only when they may have moved
            now = secrets.digest({ref: await self._keyed_value(p.namespace, ref) for ref in refs})
        digest, template, restart = secrets.digests(p.existing, now)
        if digest:
            p.manifest["metadata"].setdefault("annotations", {})[secrets.HASH] = digest
        if template:
            p.manifest["spec"]["template"]["metadata"]["annotations"][secrets.HASH] = template
        if restart:
            which = ", ".join(sorted(changed)) or "a Secret it names"
            message = f"Secret {which} changed: the instances are replaced one at a time to take the new value"
            log.info("secret changed: rolling the instances", extra={**p.context, "secrets": which})
            self._post(p.body, "SecretChanged", message, False)

    async def _keyed_value(self, namespace: str, ref: secrets.SecretKey) -> tuple[str, str] | None:
        try:
            return await self.kube.keyed_secret_value(namespace, *ref)
        except SecretMissing:
            return None  # the pod cannot start either; the kubelet says why (CreateContainerConfigError)

    async def _apply_workload(self, p: Pass) -> None:
        if p.paused:  # what runs keeps running as it is; a restartNonce waits for the pause to end
            return
        if p.manifest is not None and not (p.problem or p.conflict or p.seek_waiting):
            await self._apply(p.manifest, p.existing, p.context)
        if p.spec.get("restartNonce"):
            p.status["lastRestartNonce"] = p.spec["restartNonce"]

    async def _publish(self, p: Pass) -> None:
        new_status = p.new_status
        if "lag" in new_status:
            metrics.CONSUMER_LAG.labels(p.namespace, p.name).set(new_status["lag"])
            metrics.CONSUMER_EVENTS.labels(p.namespace, p.name).set(new_status.get("eventsProcessed", 0))
        metrics.consumer_sinks(p.namespace, p.name, new_status.get("sinks") or [])
        if new_status != p.body.get("status"):
            await self.kube.replace_status(PLURAL, p.namespace, p.name, new_status, p.body.get("status") or {})
            self._announce(p.body, p.status, new_status)

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
        digest = (manifest["metadata"].get("annotations") or {}).get(secrets.HASH)
        recorded = ((current.get("metadata") or {}).get("annotations") or {}).get(secrets.HASH)
        if template != wanted or spec.get("replicas") != manifest["spec"]["replicas"] or digest != recorded:
            patch: dict[str, Any] = {
                "spec": {"replicas": manifest["spec"]["replicas"], "template": manifest["spec"]["template"]}
            }
            if digest != recorded:
                patch["metadata"] = {"annotations": {secrets.HASH: digest}}
            # A strategic merge patch, as kubectl's: the pod template's lists merge by name.
            await self.kube.call(
                "PATCH",
                path("apps/v1", "statefulsets", namespace, name),
                body=patch,
                content_type="application/strategic-merge-patch+json",
            )
            log.info("instances updated", extra={**ctx, "replicas": manifest["spec"]["replicas"]})

    async def _stop_and_drop_checkpoints(
        self, body: dict[str, Any], nonce: str, to: StartFrom, ctx: dict[str, Any]
    ) -> int:
        """Stop every instance, then drop the checkpoints so the consumers start again from `to`; returns how many
        instances still run (0: dropped). While one runs they stay: it would write its old positions into the
        ConfigMap its successors make again (fencing tokens start afresh there), and they would resume there."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        await self.kube.delete(path("apps/v1", "statefulsets", namespace, name), propagation="Foreground")
        deadline = time.monotonic() + SEEK_STOP_WAIT_SECONDS
        while pods := await self._pods(namespace, name):
            if time.monotonic() >= deadline:
                log.warning("seek: instances still running", extra={**ctx, "nonce": nonce, "instances": len(pods)})
                return len(pods)
            await asyncio.sleep(SEEK_STOP_POLL_SECONDS)
        await self.delete_checkpoints(body)
        log.warning("seek: checkpoints removed", extra={**ctx, "to": to.to_dict(), "nonce": nonce})
        return 0

    async def _pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return await self.kube.items(path("v1", "pods", namespace), labelSelector=f"{LABEL_CONSUMER}={name}")

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

    async def _observe(self, p: Pass) -> None:
        """The status: the checkpoints, the figures the instances recorded, and the StatefulSet's ready pods
        (as read at the start of this reconcile: the next one sees what this one changed)."""
        spec, status, topics, waiting, cm, sts = p.spec, p.status, p.topics, p.waiting, p.cm, p.existing
        namespace, name = p.namespace, p.name
        generation = int(p.body["metadata"].get("generation", 0))
        cm_name = workload.checkpoint_config_map(p.body)
        new: dict[str, Any] = {k: v for k, v in status.items() if k in ("lastRestartNonce", "lastSeekNonce")}
        new.update(observedGeneration=generation, checkpointConfigMap=cm_name)
        # The Sink column's: spec.sink.type alone left it empty for a consumer with `sinks:`.
        new["sinkTypes"] = ", ".join(sink["type"] for _, sink in sink_specs(spec))
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
                report.mirror_checkpoints(new, checkpoints)
                figures, skipped = stats.instance_stats(annotations, int(spec.get("instances", 1)))
                self._say_skipped(namespace, name, skipped)
                stats.mirror(new, figures, [sink_name(sink) for _, sink in sink_specs(spec)])

        new["readyInstances"] = int(((sts or {}).get("status") or {}).get("readyReplicas") or 0)
        cm_annotations = (cm or {}).get("metadata", {}).get("annotations") or {}
        wanted = int(spec.get("instances", 1))
        stopped_at, stopped = report.stopped_instances(cm_annotations, wanted)
        pods = [] if instances.none_left(sts) else await self._pods(namespace, name)
        exited_at, exited = instances.exit_message(pods)
        failure, failing_at = (stopped, stopped_at) if stopped else (exited, exited_at)
        unready = ""
        if sts and not failure and new["readyInstances"] < int(spec.get("instances", 1)):
            unready = await instances.unready_reasons(pods, sts["metadata"]["uid"])
            # Asked again shortly whatever it said: its reason changes while nothing else brings the consumer
            # back (looking up its relay topics, then the topic missing), and one still starting says nothing.
            p.look_due = instances.look_due(pods, sts["metadata"]["uid"], utcnow())

        trouble = pod_trouble.first(pods, utcnow())
        p.trouble_due = pod_trouble.due(pods, utcnow())
        stuck = (trouble.reason, trouble.describe()) if trouble else None
        conds, phase = report.decide(
            spec,
            new,
            p.problem,
            invalid,
            failure,
            waiting,
            halted=bool(stopped),
            failing=report.which_instance(failing_at, wanted),
            conflict=p.conflict,
            unready=unready,
            stuck=stuck,
            seek_waiting=p.seek_waiting,
            remaining=len(pods),
        )
        conds = [*conditions.with_upstream_note(conds, p.health), p.health]
        if p.paused:
            conds = conditions.with_paused(conds)
        new["phase"] = phase
        new["conditions"] = conditions.merge(status.get("conditions"), conds, generation, format_time(utcnow()))
        p.new_status = new

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
