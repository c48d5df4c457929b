"""The Transform reconciler: read, plan, act, report — one Transform at a time.

It runs on every Transform change, on every change of one of its SparkApplications or of a
resource its inputs reference, and at the times it names (its next schedule slot, a run's
submission deadline; see `fibers.reconciles`). A run is recorded in status before its
SparkApplication is created, so an operator that dies in between creates that same run again
instead of a second one.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fibers import conditions, failpoints, metrics, pod_trouble, upstream
from fibers.api import SCHEMA_PLURAL, object_ref
from fibers.conditions import Condition, format_time, parse_time, utcnow
from fibers.jobs.spec import LABEL_TRANSFORM
from fibers.kube import Kube, NotOurs, SecretMissing
from fibers.kubeapi import ApiError, path
from fibers.pod_trouble import Trouble
from fibers.reconciles import Again
from fibers.registries import PLURAL as REGISTRIES
from fibers.registries import RegistryNotChosen, choose_registry, leads_to, needs_namespace, parse_registries
from fibers.secret_refs import SecretRefs, digest
from fibers.transform import runs, sparkapp
from fibers.transform.report import last_success, mirror_run, report, resolved_inputs, run_ended
from fibers.transform.runs import TransformView
from fibers.transform.sparkapp import SparkApplications
from fibers.transform.spec import (
    KIND,
    PLURAL,
    WHOLE_SECRET,
    Defaults,
    InputsNotReady,
    avro_refs,
    default_subject,
    problem,
    render_job,
    restarts_on_secret_change,
    secret_keys,
    spec_hash,
)
from fibers.upstream import Upstream

log = logging.getLogger("fibers.transform")


@dataclass
class Pass:
    """One reconcile of one Transform: the Transform, and what each step found for the steps after it."""

    view: TransformView
    now: datetime
    status: dict[str, Any]  # the status being built: the one read, with the schedule slot and rerun taken
    current: dict[str, Any]  # the current run as recorded
    apps: list[dict[str, Any]] = field(default_factory=list)  # its SparkApplications
    paused: bool = False
    invalid: str = ""  # why the spec cannot run
    upstreams: list[Upstream] = field(default_factory=list)
    health: Condition = field(default_factory=lambda: upstream.condition([], ""))  # UpstreamReady
    plan: runs.Plan = field(default_factory=runs.Plan)
    waiting: str = ""  # what the run to start waits for (InputsNotReady)
    conflict: str = ""  # the run's SparkApplication name is taken by one this Transform does not own
    mirrored: dict[str, Any] = field(default_factory=dict)  # the current run as its SparkApplication has it
    trouble: Trouble | None = None  # a pod of the current run that will not start by waiting
    trouble_run: str = ""  # that run
    trouble_due: datetime | None = None  # when a pod of it waiting to be placed has waited long enough to say
    secrets_changed: set[str] = field(default_factory=set)  # Secrets it names that changed since the last look
    secrets_digest: str = ""  # the digest of their values, when read (restartOnSecretChange)

    @property
    def namespace(self) -> str:
        return str(self.view.body["metadata"]["namespace"])

    @property
    def context(self) -> dict[str, str]:
        return {"namespace": self.namespace, "resource": self.view.name}


class TransformReconciler:
    def __init__(
        self,
        kube: Kube,
        defaults: Defaults,
        dependents: upstream.Dependents | None = None,
        secret_refs: SecretRefs | None = None,
    ) -> None:
        self.kube = kube
        self.dependents = dependents or upstream.Dependents()  # what each Transform's inputs reference
        self.defaults = defaults
        self.apps = SparkApplications(kube)
        self.secret_refs = secret_refs or SecretRefs()  # the Secrets each Transform names, for their watch
        self._secrets_changed: dict[tuple[str, str], set[str]] = {}  # (namespace, name) → Secrets changed

    def secret_changed(self, namespace: str, name: str, secret: str) -> None:
        """The watch saw a Secret the Transform names change; its next reconcile says so and, for a streaming
        Transform with restartOnSecretChange, reads the values to tell whether its running query must restart."""
        self._secrets_changed.setdefault((namespace, name), set()).add(secret)

    async def _upstream(self, namespace: str, view: TransformView) -> tuple[list[Upstream], str]:
        """What the inputs reference (connectRef, transformRef), read now; and a transformRef cycle, if any."""
        refs = upstream.refs_in(view.spec.get("inputs") or [], "spec.inputs")
        # A Schema's registration (its status) is news too: an Avro input may wait for its id.
        schemas = [
            upstream.Ref("Schema", str(ref["schemaRef"]["name"]), f"{key}.schemaRef", 0)
            for key, ref in avro_refs(view.spec).items()
            if (ref.get("schemaRef") or {}).get("name")
        ]
        self.dependents.note((KIND, namespace, view.name), [*refs, *schemas])
        get = upstream.read_once(self.kube.get_object)  # the cycle walk and the resolution share their reads
        cycle = await upstream.find_cycle(get, namespace, view.name, refs) if refs else ""
        return await upstream.resolve(get, namespace, refs), cycle

    async def _avro(
        self, namespace: str, spec: dict[str, Any], ref_topics: dict[str, list[str]]
    ) -> dict[str, dict[str, Any]]:
        """Where each Avro input's (and the output's) schemas come from: registry URL, subject, reader schema."""
        refs = avro_refs(spec)
        if not refs:
            return {}
        registries = parse_registries(await self.kube.list_cluster_objects(REGISTRIES))
        labels = (namespace, await self.kube.namespace_labels(namespace)) if needs_namespace(registries) else None
        items = {item["name"]: item for item in spec["inputs"]}
        resolved: dict[str, dict[str, Any]] = {}
        for key, ref in refs.items():
            where = "spec.output.kafka.avro" if key == "output" else f"input {key}"
            found: dict[str, Any] = {}
            if ref.get("schemaRef"):
                schema_name = ref["schemaRef"]["name"]
                schema = await self.kube.get_object(SCHEMA_PLURAL, namespace, schema_name)
                if schema is None:
                    raise InputsNotReady(f"{where}: Schema {schema_name} does not exist in {namespace}")
                registered = schema.get("status") or {}
                if not registered.get("id"):
                    raise InputsNotReady(f"{where}: Schema {schema_name} is not registered yet")
                registry_name, subject = registered.get("registry"), str(registered["subject"])
                found["readerSchema"] = schema["spec"]["schema"]
            else:
                registry_name = ref.get("registry")
                if key == "output":
                    subject = ref.get("subject") or f"{spec['output']['kafka']['topic']}-value"
                else:
                    subject = ref.get("subject") or default_subject(items[key], ref_topics)
            try:
                registry = choose_registry(registry_name, registries, self.defaults.schema_registry, labels)
            except RegistryNotChosen as exc:
                raise InputsNotReady(f"{where}: {exc}") from None
            if ref.get("schemaRef") and not leads_to(registry, registered.get("registryUrl")):
                raise InputsNotReady(  # what the Schema registered is there, not where its registry now leads
                    f"{where}: Schema {schema_name} is registered at {registered['registryUrl']}, where SchemaRegistry "
                    f"{registry.name} no longer leads"
                )
            resolved[key] = {"registryUrl": registry.url, "subject": subject, **found}
        return resolved

    async def reconcile(self, namespace: str, name: str) -> Again | None:
        """Look at one Transform; None when it is gone (or going: its SparkApplications go with it)."""
        # The queue (fibers.reconciles) never runs two reconciles of one resource at once: no lock here.
        body = await self.kube.get_object(PLURAL, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        with metrics.reconciling(KIND):
            return await self._reconcile(TransformView(body))

    async def _reconcile(self, view: TransformView) -> Again:
        """The steps, in order; each reads what the ones before found (`Pass`)."""
        p = Pass(view, now=utcnow(), status=view.status, current=dict(view.current))
        if (unservable := await self._list_runs(p)) is not None:
            return unservable
        for step in (
            self._check,  # the spec and what its inputs reference (InvalidSpec, a cycle, UpstreamReady)
            self._read_pods,  # the current run's pods, while it runs: one that will not start is said at once
            self._read_secrets,  # a Secret it names changed: said, and read when a streaming run restarts for it
            self._plan,  # which runs to start, delete, suspend or fail (`runs.plan`, pure)
            self._drop_runs,  # delete what the plan drops; record suspended and deadline-failed runs
            self._start_run,  # render the job, write the run into status first, then create it
            self._read_result,  # a run whose driver ended: its result or error
            self._report,  # the status (`report`), written when it changed, Events on a phase change
        ):
            await step(p)
        # What changes by itself: the clock (a schedule slot, a deadline) and what waiting inputs wait for.
        due = min((t for t in (runs.next_look(p.view, p.apps, p.now), p.trouble_due) if t), default=None)
        return Again(at=due.timestamp() if due else math.inf, waiting=bool(p.waiting or p.conflict))

    async def _list_runs(self, p: Pass) -> Again | None:
        """Its SparkApplications; without the CRD nothing can run: said, and looked at again now and then
        (a CRD being installed sends no event this operator watches)."""
        try:
            p.apps = await self.apps.list_for(p.namespace, p.view.name, p.view.uid)
        except ApiError as exc:
            if exc.status != 404:
                raise
            message = (
                f"the cluster does not serve {sparkapp.PLURAL}.{sparkapp.GROUP} (no Spark Operator "
                "is installed): install the Kubeflow Spark Operator to run Transforms"
            )
            status = report(p.view, dict(p.view.current), utcnow(), no_spark_operator=message)
            await self._publish(p.view, status, p.context)
            return Again(at=math.inf, waiting=True)
        return None

    async def _check(self, p: Pass) -> None:
        """A spec that cannot run starts nothing and stops nothing: a run already going keeps going."""
        view = p.view
        p.paused = conditions.paused(view.body["metadata"])
        p.invalid = problem(view.spec, name=view.name, namespace=p.namespace, defaults=self.defaults)
        p.upstreams, cycle = await self._upstream(p.namespace, view)
        if cycle and not p.invalid:
            p.invalid = f"spec.inputs: transformRef makes a cycle ({cycle}); a Transform cannot read its own output"
        p.health = upstream.condition(p.upstreams, p.namespace)
        if event := upstream.transition(view.status.get("conditions"), p.health):
            self._event(view, *event[:2], warning=event[2])

    async def _read_pods(self, p: Pass) -> None:
        run = p.current.get("name")
        app = next((a for a in p.apps if a["metadata"]["name"] == run), None)
        if app is None or sparkapp.finished(app):
            return
        selector = f"{LABEL_TRANSFORM}={p.view.name},{sparkapp.APP_LABEL}={run}"
        pods = await self.kube.items(path("v1", "pods", p.namespace), labelSelector=selector)
        p.trouble, p.trouble_run = pod_trouble.first(pods, p.now), str(run)
        p.trouble_due = pod_trouble.due(pods, p.now)

    async def _read_secrets(self, p: Pass) -> None:
        keys = secret_keys(p.view.spec)
        self.secret_refs.note(KIND, p.namespace, p.view.name, {name for name, _ in keys})
        p.secrets_changed = self._secrets_changed.pop((p.namespace, p.view.name), set())
        if not p.secrets_changed:
            return
        which = ", ".join(sorted(p.secrets_changed))
        if restarts_on_secret_change(p.view.spec):
            p.secrets_digest = await self._digest(p.namespace, keys)
            return  # the plan restarts the running query if the values moved; the Event says so then
        taken = (
            "a running query keeps the value it started with (spec.restartOnSecretChange restarts it)"
            if p.view.streaming
            else "the next run takes the new value"
        )
        self._event(p.view, "SecretChanged", f"Secret {which} changed: {taken}")

    async def _digest(self, namespace: str, keys: list[tuple[str, str]]) -> str:
        """A digest of the values (never the values: they stay in this call); a Secret mounted whole counts
        with every key it holds."""
        values: dict[tuple[str, str], tuple[str, str] | None] = {}
        for name, key in keys:
            if key == WHOLE_SECRET:
                secret = await self.kube.read(path("v1", "secrets", namespace, name))
                values[name, key] = None
                if secret is not None:
                    data = json.dumps(dict(secret.get("data") or {}), sort_keys=True)
                    values[name, key] = (str(secret["metadata"].get("uid") or ""), data)
                continue
            try:
                values[name, key] = await self.kube.keyed_secret_value(namespace, name, key)
            except SecretMissing:
                values[name, key] = None
        return digest(values)

    async def _plan(self, p: Pass) -> None:
        trouble = p.trouble.describe() if p.trouble else ""
        if p.paused or p.invalid:
            p.plan = runs.Plan()
            return
        p.plan = runs.plan(p.view, p.apps, p.now, trouble, p.secrets_digest)
        if p.plan.start and p.plan.start[1] == "secret-change":
            which = ", ".join(sorted(p.secrets_changed))
            message = f"Secret {which} changed: streaming run restarted from its checkpoint to take the new value"
            log.info("secret changed: restarting the streaming run", extra={**p.context, "secrets": which})
            self._event(p.view, "SecretChanged", message)

    async def _drop_runs(self, p: Pass) -> None:
        plan, current = p.plan, p.current
        listed = {a["metadata"]["name"]: a["metadata"]["uid"] for a in p.apps}
        for name in plan.delete:
            await self.apps.delete(p.namespace, name, listed.get(name))
            await self.apps.delete_result(p.namespace, p.view.name, name)
            log.info("run deleted", extra={**p.context, "run": name})
        if plan.suspend_current:
            current["applicationState"] = runs.SUSPENDED
        if plan.deadline_failed:
            current.update(
                applicationState=runs.DEADLINE, errorMessage=plan.deadline_failed, finishedAt=format_time(p.now)
            )
            self._event(p.view, runs.DEADLINE, f"run {current.get('name')}: {plan.deadline_failed}", warning=True)
        if plan.schedule_time is not None and not plan.start:  # a slot skipped (Forbid, a run still going)
            p.status["lastScheduleTime"] = format_time(plan.schedule_time)

    async def _start_run(self, p: Pass) -> None:
        if not p.plan.start:
            return
        run, trigger = p.plan.start
        view, namespace = p.view, p.namespace
        # The submission id is also the run's OpenLineage runId (a UUID).
        submission = p.current.get("submissionId") if p.current.get("name") == run else None
        submission = submission or str(uuid.uuid4())
        try:
            if missing := next((u for u in p.upstreams if u.body is None), None):
                raise InputsNotReady(missing.trouble(namespace))
            inputs = view.spec["inputs"]
            topics = {inputs[u.ref.index]["name"]: u.topics() for u in p.upstreams}
            job = render_job(
                view.spec,
                name=view.name,
                namespace=namespace,
                run=run,
                ref_topics=topics,
                defaults=self.defaults,
                avro=await self._avro(namespace, view.spec, topics),
                run_id=submission,
                seek=view.spec.get("seek") if trigger == "seek" else None,
                seek_nonce=p.plan.seek_nonce or p.status.get("lastSeekNonce"),
            )
        except InputsNotReady as exc:
            p.waiting = str(exc)  # the rerun, seek or slot is not recorded: it is carried out once they are there
            return
        # What the run carries out (a rerun, a seek, a schedule slot) is recorded in the run's own write-ahead:
        # recorded before, a start that then waited for its inputs dropped it.
        if p.plan.schedule_time is not None:
            p.status["lastScheduleTime"] = format_time(p.plan.schedule_time)
        if p.plan.rerun_nonce:
            p.status["lastRerunNonce"] = p.plan.rerun_nonce
        if p.plan.seek_nonce:
            p.status["lastSeekNonce"] = p.plan.seek_nonce
        if p.current.get("name") != run:
            p.current = {
                "name": run,
                "submissionId": submission,
                "specHash": spec_hash(view.spec),
                "trigger": trigger,
                "submittedAt": format_time(p.now),
            }
            if restarts_on_secret_change(view.spec):  # what the run starts with, to tell a change from
                p.current["secretsDigest"] = p.secrets_digest or await self._digest(namespace, secret_keys(view.spec))
        # Write-ahead: the run is in status before its SparkApplication exists, reported as
        # the new run it is (Pending), never under the phase and conditions of the last one.
        status = report(view.with_status(p.status), p.current, p.now, upstream=p.health)
        await self.kube.replace_status(PLURAL, namespace, view.name, status, view.status)
        p.view, p.status = view.with_status(status), status
        failpoints.hit("transform.recorded")  # tests stop the operator here: recorded, not yet created
        app = sparkapp.build(p.view.body, run=run, job=job, trigger=trigger, defaults=self.defaults)
        try:
            created = await self.apps.create(app)
        except NotOurs as exc:
            p.conflict = str(exc)
            return
        log.info(
            "run submitted" if created else "run already submitted", extra={**p.context, "run": run, "trigger": trigger}
        )
        if created:
            metrics.transform_submitted(namespace, view.name)
            self._event(view, "RunSubmitted", f"submitted run {run} ({trigger})")
        p.apps = await self.apps.list_for(namespace, view.name, view.uid)

    async def _read_result(self, p: Pass) -> None:
        current = p.current
        app = next((a for a in p.apps if a["metadata"]["name"] == current.get("name")), None)
        if app is not None and current.get("applicationState") in (runs.SUSPENDED, runs.DEADLINE):
            app = None  # being deleted; keep what we recorded
        result: dict[str, Any] = {}
        # The job writes its result, or its error, to a ConfigMap when its driver ends.
        if app is not None and sparkapp.state_of(app) in sparkapp.DRIVER_ENDED:
            result = await self.apps.result(p.namespace, p.view.name, current["name"])
            # No error in the result ConfigMap (the driver died first, or could not reach the API): its last words.
            failed = "error" not in result and sparkapp.state_of(app) in sparkapp.DRIVER_FAILED
            if failed and (message := await self.apps.driver_message(app)):
                result = {**result, "error": message}
        p.mirrored = mirror_run(current, app, result)
        if app is not None and p.mirrored.get("applicationState") == runs.QUEUED:
            p.mirrored["admission"] = await self.apps.admission(app)
        if p.trouble is not None and p.mirrored.get("name") == p.trouble_run:
            p.mirrored["podTrouble"] = {"pod": p.trouble.pod, "reason": p.trouble.reason, "message": p.trouble.message}
        else:
            p.mirrored.pop("podTrouble", None)

    async def _report(self, p: Pass) -> None:
        # What the API server holds (as read, or as `_start_run` wrote it), to compare the new status with: the
        # pass's own status, once a skipped schedule slot had moved lastScheduleTime in it, hid that change.
        saved = p.view.status
        p.view = p.view.with_status(p.status)
        referenced = {u.ref.index: u.topics() for u in p.upstreams if u.body is not None}
        inputs = resolved_inputs(p.view.spec, referenced)
        new_status = report(
            p.view,
            p.mirrored,
            p.now,
            waiting=p.waiting,
            invalid=p.invalid,
            conflict=p.conflict,
            upstream=p.health,
            inputs=inputs,
            paused=p.paused,
        )
        await self._publish(p.view, new_status, p.context, saved)
        p.view = p.view.with_status(new_status)

    async def _publish(
        self, view: TransformView, status: dict[str, Any], ctx: dict[str, Any], saved: dict[str, Any] | None = None
    ) -> None:
        """Write `status` if it differs from what the API server holds (`saved`; default the view's)."""
        before = view.status if saved is None else saved
        namespace = view.body["metadata"]["namespace"]
        metrics.transform_seen(namespace, view.name)
        # Set from status at every reconcile, so they survive an operator restart.
        if success := last_success(status):
            metrics.transform_last_success(namespace, view.name, ended_at=success[0], records=success[1])
        if fired := status.get("lastScheduleTime"):
            metrics.transform_last_schedule(namespace, view.name, parse_time(fired).timestamp())
        if status == before:
            return
        await self.kube.replace_status(PLURAL, namespace, view.name, status, before)
        if end := run_ended(before, status):  # counted once: the status write above succeeded
            metrics.transform_run_ended(namespace, view.name, succeeded=end.succeeded, seconds=end.seconds)
        old_phase, new_phase = before.get("phase"), status.get("phase")
        if old_phase != new_phase:
            ready: dict[str, Any] = next((c for c in status["conditions"] if c["type"] == "Ready"), {})
            log.info("phase %s", new_phase, extra={**ctx, "reason": ready.get("reason")})
            if new_phase in ("Succeeded", "Failed", "Running", "Suspended"):
                self._event(
                    view, str(ready.get("reason")), str(ready.get("message", "")), warning=new_phase == "Failed"
                )

    def _event(self, view: TransformView, reason: str, message: str, *, warning: bool = False) -> None:
        meta = view.body["metadata"]
        ref = object_ref(KIND, meta["namespace"], meta["name"], meta["uid"])
        self.kube.post_event_soon(ref, reason, message, warning=warning)
