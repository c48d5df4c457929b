"""A pipeline as one thing: the resources labelled `fibers.dev/pipeline=NAME`, in the order data flows.

Resources are linked by their references (connectRef, transformRef, sourceRefs) and by topics: a
Transform or consumer that names a topic some other step writes reads from that step. The chain is
printed upstream first; the first step that is not Ready is the first broken link — where to look.
Pure, apart from `fetch` (one list call per kind); `fibers pipeline NAME` prints `render(order(…))`, or
`as_json` of it for scripts.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol

from fibers.api import CONNECT_PLURAL, DATABUS_PLURAL, LABEL_PIPELINE, TRANSFORM_PLURAL
from fibers.conditions import find
from fibers.upstream import UPSTREAM_READY, Ref, Upstream, refs_in


class Lister(Protocol):
    """What lists Fibers objects: the command line's `fibers.kubeconfig.Kubeconfig`."""

    def custom_objects(self, plural: str, namespace: str | None, label_selector: str) -> list[dict[str, Any]]: ...


KINDS = {"Connect": CONNECT_PLURAL, "Transform": TRANSFORM_PLURAL, "DatabusConsumer": DATABUS_PLURAL}
_RANK = {kind: rank for rank, kind in enumerate(KINDS)}


@dataclass
class Step:
    kind: str
    body: dict[str, Any]
    reads: list[str] = field(default_factory=list)  # keys ("Kind/name") of the steps it reads from

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.body['metadata']['name']}"

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.body.get("status") or {})

    @property
    def ready(self) -> dict[str, Any]:
        return find(self.status.get("conditions"), "Ready") or {}

    def writes(self) -> set[str]:
        """Topics this step writes (what a reference to it resolves to; a consumer's Kafka sink)."""
        if self.kind == "DatabusConsumer":
            spec = self.body["spec"]
            return {str(sink["topic"]) for sink in spec.get("sinks") or [spec.get("sink") or {}] if sink.get("topic")}
        return set(Upstream(Ref(self.kind, self.body["metadata"]["name"], "", 0), self.body).topics())

    def names(self) -> tuple[set[str], set[str]]:
        """(resources it references as Kind/name, raw topics it reads)."""
        spec = self.body.get("spec") or {}
        items = (spec.get("inputs") if self.kind == "Transform" else spec.get("sourceRefs")) or []
        refs = {f"{ref.kind}/{ref.name}" for ref in refs_in(items, "")}
        topics = {t for item in items for t in (item.get("kafka") or {}).get("topics") or []}
        if self.kind == "DatabusConsumer":
            topics |= set(spec.get("sources") or [])
        return refs, topics


def order(bodies: dict[str, list[dict[str, Any]]]) -> list[Step]:
    """The steps upstream first (a topological order; ties by kind, then name; a cycle keeps its rest last)."""
    steps = {s.key: s for kind, items in bodies.items() for s in (Step(kind, body) for body in items)}
    for step in steps.values():
        refs, topics = step.names()
        step.reads = sorted(
            other.key
            for other in steps.values()
            if other is not step and (other.key in refs or topics & other.writes())
        )
    done: list[Step] = []
    pending = sorted(steps.values(), key=lambda s: (_RANK[s.kind], s.key))
    while pending:
        placed = {s.key for s in done}
        ready = [s for s in pending if all(r in placed for r in s.reads)] or pending[:1]
        done.append(ready[0])
        pending.remove(ready[0])
    return done


def detail(step: Step) -> str:
    """What a person checks first for this kind: connector and tasks; the run; lag and mode."""
    status = step.status
    if step.kind == "Connect":
        topics = ", ".join(sorted(step.writes())) or "-"
        return f"connector {status.get('connectorState', '-')}, tasks {status.get('tasksReady', '-')}, topics {topics}"
    if step.kind == "Transform":
        run = status.get("currentRun") or {}
        if not run:
            return "no run yet"
        records = f", {run['recordsOut']} records" if "recordsOut" in run else ""
        when = f", finished {run['finishedAt']}" if run.get("finishedAt") else ""
        return f"run {run.get('name', '-')} {run.get('applicationState', '-')}{records}{when}"
    return (
        f"lag {status.get('lag', '-')}, {status.get('consumptionMode', 'no checkpoint')}, "
        f"events {status.get('eventsProcessed', '-')}"
    )


def first_broken(steps: list[Step]) -> Step | None:
    """The first step, upstream first, that is not Ready: the others may only be suffering from it."""
    return next((s for s in steps if s.ready.get("status") != "True"), None)


def render(name: str, steps: list[Step]) -> str:
    if not steps:
        return f"pipeline {name}: no Connect, Transform or DatabusConsumer is labelled {LABEL_PIPELINE}={name}"
    broken = first_broken(steps)
    rows = [["", "STEP", "PHASE", "READY", "READS FROM", "DETAIL"]]
    for index, step in enumerate(steps, 1):
        ready = step.ready
        upstream_ok = (find(step.status.get("conditions"), UPSTREAM_READY) or {}).get("status", "")
        mark = "✗" if step is broken else ("!" if upstream_ok == "False" else " ")
        rows.append(
            [
                f"{mark}{index}",
                step.key,
                str(step.status.get("phase", "-")),
                f"{ready.get('status', '-')} {ready.get('reason', '')}".strip(),
                ", ".join(step.reads) or "-",
                detail(step),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"pipeline {name}: {len(steps)} steps"]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    if broken is None:
        lines.append("every step is Ready")
    else:
        lines.append(
            f"first broken link: {broken.key}: {broken.ready.get('reason', 'no status yet')}: "
            f"{broken.ready.get('message', '')}".rstrip(": ")
        )
    return "\n".join(lines)


def as_json(namespace: str, name: str, steps: list[Step]) -> dict[str, Any]:
    """What `render` prints, as data (`fibers pipeline -o json`)."""
    broken = first_broken(steps)
    return {
        "namespace": namespace,
        "pipeline": name,
        "ready": bool(steps) and broken is None,
        "firstBroken": broken.key if broken else None,
        "steps": [
            {
                "step": step.key,
                "kind": step.kind,
                "name": step.body["metadata"]["name"],
                "phase": step.status.get("phase"),
                "ready": step.ready.get("status"),
                "reason": step.ready.get("reason"),
                "message": step.ready.get("message"),
                "upstreamReady": (find(step.status.get("conditions"), UPSTREAM_READY) or {}).get("status"),
                "readsFrom": step.reads,
                "detail": detail(step),
            }
            for step in steps
        ],
    }


def fetch(lister: Lister, name: str, namespace: str | None) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The pipeline's resources by namespace, then kind: one list call per kind (namespace None: every
    namespace, where a pipeline of that name is one per namespace)."""
    selector = f"{LABEL_PIPELINE}={name}"
    found: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: {kind: [] for kind in KINDS})
    if namespace is not None:  # an empty pipeline is still reported, in its namespace
        found[namespace] = {kind: [] for kind in KINDS}
    for kind, plural in KINDS.items():
        for body in lister.custom_objects(plural, namespace, selector):
            found[body["metadata"].get("namespace") or namespace or ""][kind].append(body)
    return dict(sorted(found.items()))
