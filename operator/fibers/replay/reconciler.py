"""The Replay reconciler: named steps over one Replay, each a small piece of I/O around `plan`.

It plans the steps once (the pipeline's resources upstream first, as `fibers pipeline` orders them),
then at each look tells the next step to seek and reads how it stands; the decisions are `plan.decide`'s.
A Replay is looked at again every few seconds while it runs (`policy`), and never once it has finished.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fibers import conditions, lineage, pipeline
from fibers.api import LABEL_PIPELINE, object_ref
from fibers.conditions import format_time, utcnow
from fibers.kafka_positions import PositionsError, lookup, same_kafka, total
from fibers.kube import Kube, custom
from fibers.reconciles import Again
from fibers.replay import plan
from fibers.replay.plan import KIND, PLURAL, ReplaySpec, ReplaySpecError
from fibers.replay.policy import POLL_SECONDS

log = logging.getLogger("fibers.replay")


@dataclass
class Pass:
    body: dict[str, Any]
    status: dict[str, Any]
    spec: ReplaySpec | None = None
    failure: tuple[str, str] | None = None  # (reason, message): the Replay cannot run at all
    targets: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    decision: plan.Decision | None = None

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])


class ReplayReconciler:
    def __init__(
        self, kube: Kube, kafka_bootstrap: str | None = None, lineage_base: dict[str, str] | None = None
    ) -> None:
        self.kube = kube
        self.kafka_bootstrap = kafka_bootstrap  # the operator's Kafka: where steps without their own read
        self.lineage_base = lineage_base  # {topic, bootstrapServers, namespace} of OpenLineage events; None: off
        self._sent: set[asyncio.Future[Any]] = set()

    async def reconcile(self, namespace: str, name: str) -> Again | None:
        body = await self.kube.get_object(PLURAL, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        p = Pass(body, dict(body.get("status") or {}))
        if p.status.get("phase") in plan.FINISHED:
            return Again()  # one-shot: a finished Replay is a record, nothing more is done
        for step in (
            self._read_spec,  # the spec, checked: a time to come, nothing to replay
            self._plan_steps,  # once: the steps upstream first, each marked Waiting or Skipped
            self._check_overlap,  # an older Replay still running on one of the steps: this one gives way
            self._read_targets,  # the steps as they are now
            self._decide,  # the next move (`plan.decide`)
            self._count,  # the records the step told to seek reads again (a sink connector counts its own)
            self._seek,  # the seek written on the step it names
            self._publish,  # status, conditions, an Event per step that moved
            self._report_lineage,  # an OpenLineage event per step repositioned, naming the Replay
        ):
            await step(p)
        finished = (p.decision.status if p.decision else p.status).get("phase") in plan.FINISHED or p.failure
        return Again() if finished else Again(at=time.time() + POLL_SECONDS)

    async def _read_spec(self, p: Pass) -> None:
        try:
            p.spec = ReplaySpec.parse(p.body.get("spec") or {}, int(time.time() * 1000))
        except ReplaySpecError as exc:
            p.failure = ("InvalidSpec", str(exc))

    async def _plan_steps(self, p: Pass) -> None:
        if p.failure or p.status.get("steps") or p.spec is None:
            return
        if p.spec.pipeline:
            selector = f"{LABEL_PIPELINE}={p.spec.pipeline}"
            bodies = {
                kind: await self.kube.items(custom(plural, p.namespace), labelSelector=selector)
                for kind, plural in pipeline.KINDS.items()
            }
            ordered = [(s.kind, s.body) for s in pipeline.order(bodies)]
        else:  # read as they are, so each is judged by its spec (a source connector skipped under `keep`)
            ordered = [
                (kind, await self.kube.get_object(pipeline.KINDS[kind], p.namespace, name) or _absent(name))
                for kind, name in p.spec.resources
            ]
        sources = p.spec.sources
        planned = [(kind, str(body["metadata"]["name"]), _why_skipped(kind, body, sources)) for kind, body in ordered]
        if not planned:
            what = f"pipeline {p.spec.pipeline}" if p.spec.pipeline else "spec.resources"
            p.failure = ("NothingToReplay", f"{what}: no resource to replay in namespace {p.namespace}")
            return
        p.status["steps"] = plan.new_steps(planned)

    async def _check_overlap(self, p: Pass) -> None:
        if p.failure or p.status.get("startedAt"):
            return  # checked once, before the first seek: a Replay that started keeps going
        others = await self.kube.items(custom(PLURAL, p.namespace))
        if older := plan.overlapping(p.status.get("steps") or [], others, p.body):
            p.failure = (
                "ReplayConflict",
                f"Replay {older} is still replaying some of these steps: run this one after it",
            )

    async def _read_targets(self, p: Pass) -> None:
        if p.failure:
            return
        for step in p.status.get("steps") or []:
            if step["state"] in (plan.REPOSITIONED, plan.SKIPPED):
                continue
            key = f"{step['kind']}/{step['name']}"
            p.targets[key] = await self.kube.get_object(pipeline.KINDS[step["kind"]], p.namespace, step["name"])
            if step["state"] != plan.SEEKING:
                break  # the first step still to be told: nothing after it is looked at yet

    async def _decide(self, p: Pass) -> None:
        if p.failure or p.spec is None:
            return
        seek_nonce = plan.nonce(p.name, str(p.body["metadata"]["uid"]))
        p.decision = plan.decide(p.spec, p.status, p.targets, seek_nonce, format_time(utcnow()))

    async def _count(self, p: Pass) -> None:
        if p.decision is None or p.decision.seek is None or p.spec is None:
            return
        kind, name, _ = p.decision.seek
        body = p.targets.get(f"{kind}/{name}")
        step = next(s for s in p.decision.status["steps"] if (s["kind"], s["name"]) == (kind, name))
        bootstrap, topics = _reads(kind, body or {}, self.kafka_bootstrap)
        if not (bootstrap and topics):
            return  # a connector counts its own; a step that read nothing yet has nothing to count
        try:
            step["records"] = total(await asyncio.to_thread(lookup, bootstrap, topics, p.spec.start))
        except PositionsError as exc:  # the step's own seek says so too, as its failure
            log.info(
                "records to replay not counted", extra={"replay": p.name, "step": f"{kind}/{name}", "why": str(exc)}
            )

    async def _seek(self, p: Pass) -> None:
        if p.decision is None or p.decision.seek is None:
            return
        kind, name, seek = p.decision.seek
        # The seek is written before the status that says so: written twice (a crash between), it is one seek.
        # A JSON patch replaces a seek written before as a whole (a merge patch would mix its fields in).
        replace = [{"op": "add", "path": "/spec/seek", "value": seek}]
        found = await self.kube.patch_object(pipeline.KINDS[kind], p.namespace, name, replace)
        log.info("step told to seek", extra={"replay": p.name, "step": f"{kind}/{name}", "found": found})
        body = p.targets.get(f"{kind}/{name}")
        if found and body is not None and p.spec is not None:  # the step's own Events say who moved it, and where
            ref = object_ref(kind, p.namespace, name, str(body["metadata"]["uid"]))
            self.kube.post_event_soon(ref, "ReplaySeek", f"Replay {p.name}: seeking {p.spec.start.describe()}")

    async def _publish(self, p: Pass) -> None:
        status = p.decision.status if p.decision else dict(p.status)
        now = format_time(utcnow())
        if p.failure:
            status.update(phase=plan.FAILED, finishedAt=now)
            conds = conditions.stalled(*p.failure)
        elif status.get("phase") == plan.SUCCEEDED:
            conds = conditions.ready("Replayed", f"every step runs {p.spec.start.describe() if p.spec else ''}")
        elif status.get("phase") == plan.FAILED:
            failed = next(s for s in status["steps"] if s["state"] == plan.FAILED)
            message = f"{failed['kind']}/{failed['name']}: {failed.get('message', '')}; " + _where_it_stopped(status)
            conds = conditions.stalled("ReplayFailed", message)
        else:
            current = next((s for s in status["steps"] if s["state"] == plan.SEEKING), None)
            what = f"{current['kind']}/{current['name']}: {current.get('message', '')}" if current else "starting"
            conds = conditions.waiting("Replaying", f"{status.get('progress', '')} steps repositioned; {what}")
        generation = int(p.body["metadata"].get("generation", 0))
        status["observedGeneration"] = generation
        status["conditions"] = conditions.merge(p.status.get("conditions"), conds, generation, now)
        if status != p.body.get("status"):
            await self.kube.replace_status(PLURAL, p.namespace, p.name, status, p.body.get("status") or {})
        ref = object_ref(KIND, p.namespace, p.name, str(p.body["metadata"]["uid"]))
        for moved in p.decision.changed_steps if p.decision else []:
            self.kube.post_event_soon(ref, "ReplayStep", moved, warning=moved.endswith(": failed"))
        if p.failure and (p.body.get("status") or {}).get("phase") != plan.FAILED:
            self.kube.post_event_soon(ref, p.failure[0], p.failure[1], warning=True)

    async def _report_lineage(self, p: Pass) -> None:
        if self.lineage_base is None or p.decision is None or p.spec is None:
            return
        for kind, name in p.decision.repositioned:
            step = next(s for s in p.decision.status["steps"] if (s["kind"], s["name"]) == (kind, name))
            self._send_lineage(p, step)

    def _send_lineage(self, p: Pass, step: dict[str, Any]) -> None:
        assert self.lineage_base is not None and p.spec is not None
        kind, name = step["kind"], step["name"]
        settings = lineage.Settings.from_dict(
            {
                **self.lineage_base,
                "job": f"{p.namespace}.{kind.lower()}.{name}",
                "runId": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{p.body['metadata']['uid']}/{kind}/{name}")),
            }
        )
        facet = lineage.ReplayRunFacet(f"{p.namespace}/{p.name}", p.spec.start.describe(), step.get("records"))
        task = asyncio.ensure_future(asyncio.to_thread(lineage.Emitter(settings).repositioned, [], facet))
        self._sent.add(task)
        task.add_done_callback(self._sent.discard)


def _reads(kind: str, body: dict[str, Any], default_bootstrap: str | None) -> tuple[str, list[str]]:
    """The Kafka where the operator counts a consumer's or a Transform's records, and the topics it reads as its
    status resolved them. Counted on the operator's own Kafka only ("" otherwise: not counted): a step's
    `bootstrapServers` is its user's to write, and must not point the operator's network identity elsewhere."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    if kind == "DatabusConsumer":
        own = (spec.get("relay") or {}).get("bootstrapServers")
        topics = list(status.get("sources") or spec.get("sources") or [])
    elif kind == "Transform":
        own = (spec.get("kafka") or {}).get("bootstrapServers")
        topics = [t for i in status.get("inputs") or [] for t in i.get("topics") or []]
        inputs = spec.get("inputs") or []
        if not topics and not any({"connectRef", "transformRef"} & set(i) for i in inputs):  # topics as given
            topics = [t for i in inputs for t in (i.get("kafka") or {}).get("topics") or []]
    else:
        return "", []
    if own and not same_kafka(own, default_bootstrap or ""):
        return "", topics
    return default_bootstrap or "", topics


def _absent(name: str) -> dict[str, Any]:
    """A named resource that does not exist (yet): planned all the same, and reported when its turn comes."""
    return {"metadata": {"name": name}, "spec": {}}


def _why_skipped(kind: str, body: dict[str, Any], sources: str) -> str:
    """Why a step has nothing to move ("" when it has)."""
    spec = body.get("spec") or {}
    keys = set(spec.get("config") or {}) | set(spec.get("secretConfig") or {})  # a sink's topics may be a Secret's
    if kind == "Connect" and spec and not {"topics", "topics.regex"} & keys and sources == "keep":
        return (
            "a source connector has no position in time: the topic it writes keeps what it wrote, and the steps "
            "reading it replay that (spec.sources: snapshot has it send its tables again)"
        )
    if kind == "Transform" and body.get("spec") and not _reads_kafka(body["spec"]):
        return "reads no Kafka topic"
    return ""


def _reads_kafka(spec: dict[str, Any]) -> bool:
    return any({"kafka", "connectRef", "transformRef"} & set(item) for item in spec.get("inputs") or [])


def _where_it_stopped(status: dict[str, Any]) -> str:
    moved = [f"{s['kind']}/{s['name']}" for s in status["steps"] if s["state"] == plan.REPOSITIONED]
    untouched = [f"{s['kind']}/{s['name']}" for s in status["steps"] if s["state"] == plan.WAITING]
    return f"repositioned: {', '.join(moved) or 'none'}; untouched: {', '.join(untouched) or 'none'}"
