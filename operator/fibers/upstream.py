"""References between kinds: what a resource reads from, and whether that is healthy.

A Transform input or a DatabusConsumer source may name the resource that writes its topics
(`connectRef`: a Connect's topics; `transformRef`: another Transform's Kafka output) instead of
the topics themselves. The kinds know nothing of each other's code (an import-linter contract):
what a reference means is read here, from the referenced resource's own spec and status, through
the API server. Both reconcilers resolve their references on every reconcile and note them in
`Dependents`; a change to a referenced resource (its status included) makes the resources that
read from it reconcile again (`fibers.reconciles.Reconciles.changed`).

`UpstreamReady` is an extra condition (kstatus reads only Ready, Reconciling and Stalled): False,
naming the first upstream resource that is missing or not Ready and why, while anything the
resource reads from is unhealthy. It does not flip Ready by itself; Ready's message says so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fibers.api import CONNECT_PLURAL, TRANSFORM_PLURAL
from fibers.conditions import Condition, find

UPSTREAM_READY = "UpstreamReady"
PLURALS = {"Connect": CONNECT_PLURAL, "Transform": TRANSFORM_PLURAL}
REF_FIELDS = {"connectRef": "Connect", "transformRef": "Transform"}

# Debezium writes these beside a connector's change topics (transaction boundaries, heartbeats); a
# Databus consumer reads the boundaries from each change event, so they are not its sources.
_HEARTBEAT_PREFIX = "__debezium-heartbeat"

Getter = Callable[[str, str, str], Awaitable[dict[str, Any] | None]]  # (plural, namespace, name) → body


def read_once(get: Getter) -> Getter:
    """`get`, remembering what it read: one reconcile reads each referenced resource once."""
    seen: dict[tuple[str, str, str], dict[str, Any] | None] = {}

    async def cached(plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        if (plural, namespace, name) not in seen:
            seen[(plural, namespace, name)] = await get(plural, namespace, name)
        return seen[(plural, namespace, name)]

    return cached


@dataclass(frozen=True)
class Ref:
    """One reference in a spec: the kind and name it points at, and the field that names it."""

    kind: str  # Connect | Transform
    name: str
    field: str  # e.g. spec.inputs[0].connectRef
    index: int  # of the entry in its list

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Upstream:
    """A reference and what it points at now (`body` None: it does not exist)."""

    ref: Ref
    body: dict[str, Any] | None

    @property
    def ready(self) -> bool:
        return self.body is not None and _ready(self.body).get("status") == "True"

    def trouble(self, namespace: str) -> str:
        """Why this upstream is not healthy, for a message ("" when it is)."""
        if self.body is None:
            return f"{self.ref.label} ({self.ref.field}) does not exist in namespace {namespace}"
        ready = _ready(self.body)
        if ready.get("status") == "True":
            return ""
        why = ": ".join(str(p) for p in (ready.get("reason"), ready.get("message")) if p) or "no status yet"
        return f"{self.ref.label} is not Ready ({why})"

    def topics(self) -> list[str]:
        """The Kafka topics this upstream writes, as far as it has said (sorted)."""
        if self.body is None:
            return []
        if self.ref.kind == "Transform":
            topic = ((self.body.get("spec") or {}).get("output") or {}).get("kafka", {}).get("topic")
            return [str(topic)] if topic else []
        return sorted(str(t) for t in (self.body.get("status") or {}).get("topics") or [])

    def change_topics(self) -> list[str]:
        """`topics()` without a Debezium connector's transaction-metadata and heartbeat topics."""
        config = ((self.body or {}).get("spec") or {}).get("config") or {}
        skip = set()
        if str(config.get("provide.transaction.metadata", "")).lower() == "true" and config.get("topic.prefix"):
            skip.add(f"{config['topic.prefix']}.{config.get('topic.transaction') or 'transaction'}")
        return [t for t in self.topics() if t not in skip and not t.startswith(_HEARTBEAT_PREFIX)]


Key = tuple[str, str, str]  # (kind, namespace, name)


class Dependents:
    """Who reads from whom: for each referenced resource, the resources whose specs reference it.

    Kept from what each reconcile resolved (a reference to a resource that does not exist yet counts:
    its creation is the news the reader waits for).
    """

    def __init__(self) -> None:
        self._readers: dict[Key, set[Key]] = {}  # referenced -> its readers
        self._reads: dict[Key, set[Key]] = {}  # reader -> what it references

    def note(self, reader: Key, refs: list[Ref]) -> None:
        """What `reader` references now (replacing what it referenced before)."""
        namespace = reader[1]
        now = {(ref.kind, namespace, ref.name) for ref in refs}
        before = self._reads.get(reader, set())
        for gone in before - now:
            self._unlink(gone, reader)
        for new in now - before:
            self._readers.setdefault(new, set()).add(reader)
        if now:
            self._reads[reader] = now
        else:
            self._reads.pop(reader, None)

    def forget(self, reader: Key) -> None:
        for referenced in self._reads.pop(reader, set()):
            self._unlink(referenced, reader)

    def of(self, kind: str, namespace: str, name: str) -> list[Key]:
        """The resources that reference this one."""
        return sorted(self._readers.get((kind, namespace, name), ()))

    def _unlink(self, referenced: Key, reader: Key) -> None:
        readers = self._readers.get(referenced)
        if readers is not None:
            readers.discard(reader)
            if not readers:
                del self._readers[referenced]


def _ready(body: dict[str, Any]) -> dict[str, Any]:
    return find((body.get("status") or {}).get("conditions"), "Ready") or {}


def refs_in(items: list[dict[str, Any]], where: str) -> list[Ref]:
    """The references among list entries (Transform `inputs`, DatabusConsumer `sourceRefs`), in order."""
    found = []
    for index, item in enumerate(items):
        for key, kind in REF_FIELDS.items():
            if isinstance(item.get(key), dict) and item[key].get("name"):
                found.append(Ref(kind, str(item[key]["name"]), f"{where}[{index}].{key}", index))
    return found


async def resolve(get: Getter, namespace: str, refs: list[Ref]) -> list[Upstream]:
    """Read each referenced resource once (a name referenced twice is read once)."""
    get = read_once(get)
    return [Upstream(ref, await get(PLURALS[ref.kind], namespace, ref.name)) for ref in refs]


def condition(upstreams: list[Upstream], namespace: str) -> Condition:
    """UpstreamReady: True when everything referenced exists and is Ready (or nothing is referenced)."""
    if not upstreams:
        return Condition(UPSTREAM_READY, True, "NoUpstream", "reads no other Fibers resource")
    for upstream in upstreams:
        if trouble := upstream.trouble(namespace):
            reason = "UpstreamMissing" if upstream.body is None else "UpstreamNotReady"
            return Condition(UPSTREAM_READY, False, reason, trouble)
    names = ", ".join(dict.fromkeys(u.ref.label for u in upstreams))
    return Condition(UPSTREAM_READY, True, "UpstreamReady", f"{names}: Ready")


def transition(before: list[dict[str, Any]] | None, after: Condition) -> tuple[str, str, bool] | None:
    """The Event (reason, message, warning) for an UpstreamReady change; None when nothing changed.

    The first status is not news either way: a pipeline applied at once has every upstream still
    starting, and the condition itself says so.
    """
    old = find(before, UPSTREAM_READY)
    if old is None or (old.get("status") == "True") == after.status:
        return None
    if after.status:
        return "UpstreamRecovered", f"upstream recovered: {after.message}", False
    return "UpstreamDegraded", after.message, True


async def find_cycle(get: Getter, namespace: str, name: str, refs: list[Ref]) -> str:
    """A cycle of transformRefs through this Transform, as "a → b → a" ("" when there is none).

    Depth first from this Transform's own references; each Transform on the way is read once, and
    a missing one ends its branch (that is reported as UpstreamMissing, not as a cycle).
    """
    inputs: dict[str, list[Ref]] = {}
    stack = [([name], ref) for ref in reversed(refs) if ref.kind == "Transform"]
    while stack:
        path, ref = stack.pop()
        if ref.name == name:
            return " → ".join([*path, name])
        if ref.name in path:
            continue  # a cycle further down that does not pass through this Transform: theirs to report
        if ref.name not in inputs:
            body = await get(TRANSFORM_PLURAL, namespace, ref.name)
            inputs[ref.name] = refs_in(((body or {}).get("spec") or {}).get("inputs") or [], "spec.inputs")
        stack += [([*path, ref.name], nxt) for nxt in reversed(inputs[ref.name]) if nxt.kind == "Transform"]
    return ""
