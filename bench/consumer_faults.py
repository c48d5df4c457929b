"""The consumer's fault matrix: every I/O boundary of a consumer made to fail, hang, slow down, or die
just after it, while the consumer talks to the real Kafka, MongoDB, API server and schema registry.

One case is a boundary (a failpoint, `fibers.failpoints`) and a fault, run against a fresh CDC
workload: Debezium-shaped change events (inserts, updates, deletes; transactions of 1-3 changes;
SCNs from a made-up WAL position) produced straight to a 2-partition topic, half before the consumer
starts and half while it runs. The consumer is `fibers consume` in a pod of the job image
(`bench.consumer_pods`), replaced as its StatefulSet would replace it if it dies, without the fault the
second time. Checked after recovery, whatever the timing:

- the sink equals the source: every key's latest value (a deleted key absent), for the MongoDB view;
  every change on the output topic for a Kafka sink; every change kept for a history sink;
- no key's SCN went backwards in the view (sampled while the consumer ran);
- no checkpoint was ahead of its sink: each time the process died, every change before the stored
  checkpoint was in the view;
- a transient fault restarted nothing; a kill restarted the process once.

`tests/integration/test_databus_faults.py` runs a few cases per boundary; `bench/chaos.py`
(`--scenarios consumer-faults`) runs `MATRIX`, and so does this module on its own:

    .venv/bin/python -m bench.consumer_faults [--records 2000] [--cases mongo.write,checkpoint.write]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client
from pymongo import MongoClient

import fibers_stack as stack
from bench.consumer_pods import KILLED, ConsumerPod
from fibers import failpoints
from fibers.consumer.store import collection_suffix
from fibers.databus.checkpoint import Checkpoint
from fibers.databus.timelines import timeline_key
from fibers_stack import namespaces

PARTITIONS = 2
KEYS = 40
# Seconds: a hang of 12 s goes past it. Not shorter: a replayed batch of a thousand history upserts takes
# FerretDB (SQLite) a few seconds, and a timeout below that fails every replay.
CALLBACK_TIMEOUT = 10.0
SETTLE_SECONDS = 90.0  # the most a case waits for the sink to equal the source after its fault
READY_AGAIN_SECONDS = 15.0  # the most a pod may take to pass its readiness probe again after an outage
START_WAIT_SECONDS = 60.0  # the most a case waits for its consumer to start reading before the second half
PACE_SECONDS = 0.01  # between the second half's transactions: many small batches, so the Nth hit of a point comes


@dataclass(frozen=True)
class Case:
    """One boundary and one fault: the failpoint spec the first process runs with, and what is expected."""

    name: str
    spec: str  # FIBERS_FAILPOINTS of the first process
    sinks: tuple[str, ...] = ("mongodb",)
    restarts: int = 0  # processes the fault ends (a kill): each is started again, without the fault
    bootstrap: bool = False  # the consumer starts from a bootstrap store another consumer fills
    # The fault is an outage long enough that the pod turns NotReady (it waits for the API server) and,
    # once it ends, Ready again, with no restart.
    unready: bool = False

    @property
    def transient(self) -> bool:
        return self.restarts == 0

    @property
    def firings(self) -> int:
        """How often the fault fires in all (a case runs until it has, and the sink has caught up after it)."""
        return sum(action.count or 1 for action in failpoints.parse(self.spec).values())


# Every boundary at least once in the suite (tests/integration/test_databus_faults.py picks from here).
SUITE = (
    Case("kafka.poll error", "kafka.poll=3+3*error"),
    Case("kafka.produce error", "kafka.produce=1+2*error", sinks=("kafka",)),
    Case("mongo.write error", "mongo.write=1+2*error", sinks=("mongodb", "kafka")),
    Case("mongo.write.done kill", "mongo.write.done=2+1*kill", restarts=1),
    # About 25 s without checkpoint writes (the store's backoff: 0.5, 1, 2, 4, 8, 10 s).
    Case("checkpoint.write outage", "checkpoint.write=3+6*error", unready=True),
    Case("checkpoint.read error", "checkpoint.read=0+3*error"),
    Case("lease.renew error", "lease.renew=1+4*error"),
    Case("callback hang", f"callback=0+1*hang({CALLBACK_TIMEOUT + 2:g})", sinks=("history",)),
    Case("bootstrap.read error", "bootstrap.read=1+3*error", bootstrap=True),
)

# The benchmark's matrix: every boundary with every fault that means something there.
MATRIX = (
    *SUITE,
    Case("checkpoint.write error", "checkpoint.write=3+4*error"),
    Case("kafka.poll sleep", "kafka.poll=2+3*sleep(2)"),
    Case("kafka.poll kill", "kafka.poll=5+1*kill", restarts=1),
    Case("kafka.produce sleep", "kafka.produce=1+2*sleep(2)", sinks=("kafka",)),
    Case("kafka.produce.done kill", "kafka.produce.done=1+1*kill", sinks=("kafka",), restarts=1),
    Case("mongo.write sleep", "mongo.write=1+2*sleep(2)"),
    Case("mongo.write hang", f"mongo.write=1+1*hang({CALLBACK_TIMEOUT + 2:g})"),
    Case("mongo.write kill", "mongo.write=2+1*kill", restarts=1),
    Case("history mongo.write error", "mongo.write=1+3*error", sinks=("history",)),
    Case("history mongo.write.done kill", "mongo.write.done=1+1*kill", sinks=("history",), restarts=1),
    Case("two sinks kafka.produce.done kill", "kafka.produce.done=1+1*kill", sinks=("mongodb", "kafka"), restarts=1),
    Case("checkpoint.write sleep", "checkpoint.write=2+3*sleep(2)"),
    Case("checkpoint.write kill", "checkpoint.write=3+1*kill", restarts=1),
    Case("checkpoint.write.done kill", "checkpoint.write.done=3+1*kill", restarts=1),
    Case("checkpoint.read kill", "checkpoint.read=1+1*kill", restarts=1),
    Case("lease.renew sleep", "lease.renew=1+2*sleep(3)"),
    Case("lease.renew kill", "lease.renew=2+1*kill", restarts=1),
    Case("callback error", "callback=2+3*error"),
    Case("callback kill", "callback=3+1*kill", restarts=1),
    Case("bootstrap.read hang", "bootstrap.read=1+1*sleep(4)", bootstrap=True),
    Case("bootstrap.read kill", "bootstrap.read=1+1*kill", bootstrap=True, restarts=1),
    Case("bootstrap mongo.write error", "mongo.write=1+2*error", bootstrap=True),
)


@dataclass
class Change:
    partition: int
    offset: int
    key: str
    op: str
    scn: int
    after: dict[str, Any] | None


@dataclass
class Workload:
    """The changes produced to the relay, in order, and what they add up to."""

    topic: str
    changes: list[Change] = field(default_factory=list)

    def latest(self, before: dict[int, int] | None = None) -> dict[str, Change]:
        """Each key's last change (of the changes before these offsets per partition, when given)."""
        last: dict[str, Change] = {}
        for change in self.changes:
            if before is None or change.offset < before.get(change.partition, 0):
                last[change.key] = change
        return last

    def expected_view(self) -> dict[str, dict[str, Any]]:
        return {k: c.after for k, c in self.latest().items() if c.op != "d" and c.after is not None}


class Generator:
    """Debezium-shaped changes over KEYS keys, each key's changes in its own partition (as Debezium keys them)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.rows: dict[int, dict[str, Any]] = {}
        self.lsn = 1_000
        self.tx = 0

    def transactions(self, records: int) -> Iterator[list[tuple[int, str, dict[str, Any]]]]:
        """Transactions of 1-3 changes, as (partition, key, envelope) each, until `records` changes."""
        made = 0
        while made < records:
            self.tx += 1
            partition = self.rng.randrange(PARTITIONS)
            keys = [k for k in range(KEYS) if k % PARTITIONS == partition]
            batch = []
            for _ in range(min(self.rng.randint(1, 3), records - made)):
                key = self.rng.choice(keys)
                self.lsn += self.rng.randint(1, 50)
                before = self.rows.get(key)
                if before is None:
                    op, after = "c", {"id": key, "qty": 1, "note": f"k{key}"}
                elif self.rng.random() < 0.3:
                    op, after = "d", None
                else:
                    op, after = "u", {**before, "qty": before["qty"] + 1}
                if after is None:
                    self.rows.pop(key, None)
                else:
                    self.rows[key] = after
                envelope = {
                    "op": op,
                    "before": before,
                    "after": after,
                    "source": {"lsn": self.lsn, "txId": self.tx},
                    "transaction": {"id": f"tx{self.tx}"},
                    "ts_ms": int(time.time() * 1000),
                }
                batch.append((partition, str(key), envelope))
                made += 1
            yield batch


def produce(bootstrap: str, workload: Workload, generator: Generator, records: int, *, pace: float = 0.0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    delivered: list[Change] = []

    def report(error: Any, message: Any) -> None:
        if error is not None:
            raise RuntimeError(f"producing the workload: {error}")
        envelope = json.loads(message.value())
        delivered.append(
            Change(
                message.partition(),
                message.offset(),
                message.key().decode(),
                envelope["op"],
                envelope["source"]["lsn"],
                envelope["after"],
            )
        )

    for batch in generator.transactions(records):
        for partition, key, envelope in batch:
            producer.produce(
                workload.topic, key=key.encode(), value=json.dumps(envelope), partition=partition, on_delivery=report
            )
        producer.poll(0)
        if pace:
            producer.flush(10)
            time.sleep(pace)
    if producer.flush(30):
        raise RuntimeError("the workload was not delivered")
    workload.changes.extend(sorted(delivered, key=lambda c: c.scn))


@dataclass
class Outcome:
    """What one case did: the figures the benchmark prints and the test asserts."""

    case: str
    records: int
    restarts: int = 0
    exits: list[int | str | None] = field(default_factory=list)  # each process's exit code (None: the fault's kill)
    fired: int = 0  # times the case's failpoint fired (0: the case tested nothing)
    lost: int = 0  # keys whose latest value the sink does not hold (or changes a history or topic lacks)
    scn_backwards: int = 0
    checkpoint_ahead: int = 0
    behind: list[str] = field(default_factory=list)  # the first keys a checkpoint was ahead of, for a reader
    replayed_windows: int = 0
    unready_seen: bool = False  # a pod of the consumer was seen NotReady after it had been Ready
    ready_at_end: bool = False  # the last pod was ready when it was stopped
    seconds: float = 0.0
    log_tail: str = ""

    def as_dict(self) -> dict[str, Any]:
        figures = {k: v for k, v in self.__dict__.items() if k != "log_tail"}
        return figures


class Harness:
    """The servers' clients and the namespace the cases run in."""

    def __init__(self, info: stack.StackInfo, api: client.ApiClient, namespace: str) -> None:
        self.info, self.api, self.namespace = info, api, namespace
        self.core = client.CoreV1Api(api)
        self.mongo: MongoClient[dict[str, Any]] = MongoClient(info.mongodb_uri)
        self.admin = AdminClient({"bootstrap.servers": info.kafka_bootstrap})

    def close(self) -> None:
        self.mongo.close()

    def _topic(self, name: str) -> None:
        self.admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)

    def _sink(self, kind: str, unique: str) -> dict[str, Any]:
        if kind == "kafka":
            return {"type": "kafka", "name": "kafka", "topic": f"{unique}-out"}
        return {
            "type": kind,
            "name": kind,
            "uriEnv": "FIBERS_SINK_MONGODB_URI",
            "database": unique,
            "collection": kind,
        }

    def _config(self, name: str, topic: str, sinks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.namespace,
            "relay": {"bootstrapServers": self.info.kafka_bootstrap, "topics": [topic]},
            "sinks": sinks,
            "checkpoint": {"configMapName": f"{name}-checkpoint", "minIntervalSeconds": 0.2},
            "startPosition": "earliest",
            "callback": {"timeoutSeconds": CALLBACK_TIMEOUT, "retries": 8, "retryBackoffSeconds": 0.2},
            **extra,
        }

    def _start(self, config: dict[str, Any], pods: list[ConsumerPod], failpoints: str = "") -> ConsumerPod:
        """A consumer pod for `config` (the next of its name), added to `pods`."""
        env = {
            "FIBERS_SINK_MONGODB_URI": self.info.mongodb_uri,
            "FIBERS_BOOTSTRAP_MONGODB_URI": self.info.mongodb_uri,
            "FIBERS_FAILPOINTS": failpoints,
        }
        name = f"{config['name']}-{len(pods)}"
        pod = ConsumerPod(self.core, self.namespace, name, image=self.info.images["job"], config=config, env=env)
        pods.append(pod)
        return pod

    def _checkpoint_offsets(self, name: str, topic: str) -> dict[int, int]:
        try:
            data = self.core.read_namespaced_config_map(f"{name}-checkpoint", self.namespace).data or {}
        except client.exceptions.ApiException:
            return {}
        offsets = {}
        for partition in range(PARTITIONS):
            text = data.get(timeline_key(topic, partition))
            value = Checkpoint.parse(text).get("kafka_next_offset") if text else None
            if isinstance(value, int):
                offsets[partition] = value
        return offsets

    def _view(self, database: str, collection: str) -> dict[str, dict[str, Any]]:
        return {str(d["_id"]): d for d in self.mongo[database][collection].find()}

    @staticmethod
    def _behind(view: dict[str, dict[str, Any]], workload: Workload, before: dict[int, int]) -> list[str]:
        """Keys whose last change before the checkpoints `before` the view reflects neither that change nor
        a later one. The sink runs ahead of its checkpoint by the windows applied since the last write
        (at-least-once): a key deleted after the checkpoint is absent from a view that is not behind."""
        behind = []
        for key, change in workload.latest(before).items():
            doc = view.get(key)
            if doc is not None:
                stale = int(doc["_scn"]) < change.scn or (change.op == "d" and int(doc["_scn"]) == change.scn)
            else:
                later = (c for c in workload.changes if c.key == key and c.scn > change.scn)
                stale = change.op != "d" and not any(c.op == "d" for c in later)
            if stale:
                behind.append(f"{key}: {change.op}@{change.scn}, view {doc and doc['_scn']}")
        return behind

    @staticmethod
    def _consuming(pod: ConsumerPod) -> None:
        """Until the consumer says it consumes (or ends, or START_WAIT_SECONDS pass: the case goes on)."""
        pod.wait_running()
        deadline = time.monotonic() + START_WAIT_SECONDS
        while time.monotonic() < deadline and pod.poll() is None:
            if '"consuming"' in pod.log():
                return
            time.sleep(0.3)

    def run(self, case: Case, records: int, seed: int) -> Outcome:
        unique = "f" + uuid.uuid4().hex[:8]
        started = time.monotonic()
        workload = Workload(unique)
        self._topic(unique)
        generator = Generator(seed)
        outcome = Outcome(case.name, records)
        pods: list[ConsumerPod] = []  # the consumer's, in order: the first with the fault, the rest without
        helpers: list[ConsumerPod] = []
        extra: dict[str, Any] = {}
        if case.bootstrap:
            # A store consumer fills the bootstrap store first; the consumer under test bootstraps from it.
            produce(self.info.kafka_bootstrap, workload, generator, records // 2)
            store = self._config(f"{unique}-store", unique, [self._sink("bootstrap", unique)])
            self._start(store, helpers)
            extra = {
                "startPosition": "bootstrap",
                "bootstrap": {"uriEnv": "FIBERS_BOOTSTRAP_MONGODB_URI", "database": unique},
            }
            self._wait_store(unique, workload)
        else:
            produce(self.info.kafka_bootstrap, workload, generator, records // 2)
        sinks = [self._sink(kind, unique) for kind in case.sinks]
        config = self._config(f"{unique}-c", unique, sinks, **extra)
        try:
            with self._sampling(unique, "mongodb" in case.sinks, outcome):
                self._drive(case, config, workload, generator, records, pods, outcome)
            for helper in helpers:
                helper.stop()
            outcome.lost = self._lost(case, unique, workload)
            text = "\n".join(pod.log() for pod in pods)
            outcome.replayed_windows = text.count("rolling back")
            outcome.fired = text.count("failpoint fired")  # the pods started again run without the fault
            outcome.seconds = round(time.monotonic() - started, 1)
            outcome.log_tail = text[-3000:]
        finally:
            for pod in pods + helpers:
                pod.delete()
            self.mongo.drop_database(unique)
            self.admin.delete_topics([unique, f"{unique}-out"])
            for name in (config["name"], f"{unique}-store"):
                with contextlib.suppress(client.exceptions.ApiException):  # no store consumer without a bootstrap
                    self.core.delete_namespaced_config_map(f"{name}-checkpoint", self.namespace)
        return outcome

    def _drive(
        self,
        case: Case,
        config: dict[str, Any],
        workload: Workload,
        generator: Generator,
        records: int,
        pods: list[ConsumerPod],
        outcome: Outcome,
    ) -> None:
        """Run the consumer through the fault: the second half produced while it reads, a pod that died
        replaced (as its StatefulSet would) after the checkpoint is checked against the view, and the last
        one stopped once the fault fired and the sinks caught up."""
        unique = config["relay"]["topics"][0]
        pod = self._start(config, pods, case.spec)
        # The second half once the consumer reads the relay: produced while it still starts (a few
        # seconds on a busy machine), it is all there at once and comes in one or two batches, and a
        # fault that skips the first hits of a point would wait for hits that never come.
        self._consuming(pod)
        half = threading.Thread(
            target=produce,
            args=(self.info.kafka_bootstrap, workload, generator, records - records // 2),
            kwargs={"pace": PACE_SECONDS},
        )
        half.start()
        deadline = time.monotonic() + SETTLE_SECONDS
        ready_once: set[str] = set()  # pods seen Ready
        while time.monotonic() < deadline:
            code = pod.poll()
            if code is not None:  # died: check the checkpoint against the view, then start another
                killed = code == KILLED
                outcome.exits.append(None if killed else code)
                if "mongodb" in case.sinks:
                    half.join()
                    before = self._checkpoint_offsets(config["name"], unique)
                    behind = self._behind(self._view(unique, "mongodb"), workload, before)
                    outcome.checkpoint_ahead += len(behind)
                    outcome.behind.extend(behind[:10])
                if not killed or outcome.restarts > case.restarts:
                    half.join()  # it ended by itself, or died once too often: a finding, not papered over
                    return
                outcome.restarts += 1
                pod = self._start(config, pods)
            running, ready = pod.readiness()
            if running and ready:
                ready_once.add(pod.name)
            elif running and pod.name in ready_once:  # a starting pod is not ready yet either: not counted
                outcome.unready_seen = True
            fired = sum(p.log().count("failpoint fired") for p in pods)
            settled = not half.is_alive() and fired >= case.firings and self._lost(case, unique, workload) == 0
            if settled and (not case.unready or self._ready_again(pod)):
                break
            time.sleep(0.5)
        half.join()
        outcome.ready_at_end = pod.ready()
        outcome.exits.append(pod.stop())

    @staticmethod
    def _ready_again(pod: ConsumerPod) -> bool:
        """Ready within a probe period or two of the outage's end (the probe runs every 5 s)."""
        deadline = time.monotonic() + READY_AGAIN_SECONDS
        while time.monotonic() < deadline:
            if pod.ready():
                return True
            time.sleep(0.5)
        return False

    def _wait_store(self, unique: str, workload: Workload) -> None:
        applier = self.mongo[unique][f"applier_{collection_suffix(unique)}"]
        ends = {}
        for change in workload.changes:
            ends[change.partition] = max(ends.get(change.partition, -1), change.offset)
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:
            done = {int(d["_id"]): int(d["offset"]) for d in applier.find()}
            if all(done.get(p, -1) >= end for p, end in ends.items()):
                return
            time.sleep(0.3)
        raise RuntimeError("the bootstrap store did not take the first half of the workload")

    @contextmanager
    def _sampling(self, database: str, view: bool, outcome: Outcome) -> Iterator[None]:
        """Read the view's SCNs every 0.3 s while the consumer runs, counting keys whose SCN went back."""
        stop = threading.Event()
        seen: dict[str, int] = {}

        def sample() -> None:
            while not stop.wait(0.3):
                for key, doc in self._view(database, "mongodb").items():
                    scn = int(doc.get("_scn", -1))
                    if scn < seen.get(key, -1):
                        outcome.scn_backwards += 1
                    seen[key] = scn

        thread = threading.Thread(target=sample, daemon=True)
        if view:
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if view:
                thread.join()

    def _lost(self, case: Case, unique: str, workload: Workload) -> int:
        lost = 0
        for kind in case.sinks:
            if kind == "mongodb":
                view = {
                    k: {f: v for f, v in d.items() if f not in ("_id", "_scn")}
                    for k, d in self._view(unique, "mongodb").items()
                }
                expected = workload.expected_view()
                lost += sum(1 for k in set(view) | set(expected) if view.get(k) != expected.get(k))
            elif kind == "history":
                ids = {str(d["_id"]) for d in self.mongo[unique]["history"].find({}, {"_id": 1})}
                lost += sum(1 for c in workload.changes if f"{unique}/{c.partition}/{c.offset}" not in ids)
            elif kind == "kafka":
                lost += self._missing_on_topic(f"{unique}-out", workload)
        return lost

    def _missing_on_topic(self, topic: str, workload: Workload) -> int:
        """Changes (key, SCN) not on the output topic (a delete is a tombstone: its key only), and keys whose
        last record there is not their latest value."""
        reader = Consumer(
            {
                "bootstrap.servers": self.info.kafka_bootstrap,
                "group.id": f"probe-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        try:
            metadata = reader.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is None or metadata.error is not None:
                return len(workload.changes)
            parts = [TopicPartition(topic, p, 0) for p in metadata.partitions]
            ends = {p.partition: reader.get_watermark_offsets(p, timeout=10)[1] for p in parts}
            reader.assign(parts)
            seen: set[tuple[str, int]] = set()
            last: dict[str, dict[str, Any] | None] = {}
            deleted: set[str] = set()
            position = dict.fromkeys(ends, 0)
            deadline = time.monotonic() + 30
            while any(position[p] < end for p, end in ends.items()) and time.monotonic() < deadline:
                message = reader.poll(0.5)
                if message is None or message.error():
                    continue
                position[message.partition()] = message.offset() + 1
                key = message.key().decode()
                if message.value() is None:
                    last[key] = None
                    deleted.add(key)
                    continue
                value = json.loads(message.value())
                seen.add((key, int(value.pop("_scn"))))
                last[key] = value
        finally:
            reader.close()
        missing = sum(1 for c in workload.changes if c.op != "d" and (c.key, c.scn) not in seen)
        missing += sum(1 for c in workload.changes if c.op == "d" and c.key not in deleted)
        expected = workload.expected_view()
        missing += sum(1 for k in set(expected) | {k for k, v in last.items() if v} if last.get(k) != expected.get(k))
        return missing


def verdict(case: Case, outcome: Outcome) -> list[str]:
    """What the outcome breaks of the case's invariants (empty: all held)."""
    broken = []
    for figure in ("lost", "scn_backwards", "checkpoint_ahead"):
        if getattr(outcome, figure):
            broken.append(f"{figure}={getattr(outcome, figure)}")
    if outcome.fired < case.firings:  # the consumer ended or settled before its fault: the case tested less
        broken.append(f"the fault fired {outcome.fired} of {case.firings} times")
    if outcome.restarts != case.restarts:
        broken.append(f"restarts={outcome.restarts} (expected {case.restarts})")
    if case.unready and not (outcome.unready_seen and outcome.ready_at_end):
        broken.append(f"readiness: NotReady seen {outcome.unready_seen}, Ready at the end {outcome.ready_at_end}")
    if any(code not in (None, 0) for code in outcome.exits):  # a crash, an error exit, or a hang on SIGTERM
        broken.append(f"exit codes {outcome.exits}")
    return broken


def main() -> int:
    from bench.machine import Run, say

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--cases", default="", help="comma-separated case names (default: the whole matrix)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    session = Run("consumer_faults")
    info = session.stack()
    from kubernetes import config as kube_config

    api = kube_config.new_client_from_config(config_file=info.kubeconfig)
    figures = matrix(info, api, args.records, args.seed, args.cases, say)
    session.report({**figures, "pass": figures["broken"] == 0})
    return 0 if figures["broken"] == 0 else 1


def matrix(
    info: stack.StackInfo, api: client.ApiClient, records: int, seed: int, names: str, say: Callable[[str], None]
) -> dict[str, Any]:
    """Run the matrix (or the cases named) in a namespace of its own; the figures, summed and per case."""
    cases = [c for c in MATRIX if not names or c.name in names.split(",")]
    namespace = f"faults-{uuid.uuid4().hex[:6]}"
    namespaces.create(api, namespace)
    harness = Harness(info, api, namespace)
    per_case: dict[str, Any] = {}
    totals = {
        "faults_injected": 0,
        "records": 0,
        "replayed_windows": 0,
        "lost": 0,
        "scn_backwards": 0,
        "checkpoint_ahead": 0,
        "transient_restarts": 0,
        "broken": 0,
    }
    try:
        for index, case in enumerate(cases):
            outcome = harness.run(case, records, seed + index)
            broken = verdict(case, outcome)
            say(
                f"{case.name}: lost {outcome.lost}, replayed {outcome.replayed_windows}, restarts {outcome.restarts}, "
                f"{outcome.seconds} s" + (f" — BROKEN: {', '.join(broken)}" if broken else "")
            )
            per_case[case.name] = {**outcome.as_dict(), "problems": broken}
            totals["faults_injected"] += 1
            totals["records"] += records
            totals["replayed_windows"] += outcome.replayed_windows
            for figure in ("lost", "scn_backwards", "checkpoint_ahead"):
                totals[figure] += getattr(outcome, figure)
            if case.transient:  # any end of the process before the last SIGTERM is one restart too many
                totals["transient_restarts"] += len(outcome.exits) - 1
            totals["broken"] += bool(broken)
    finally:
        harness.close()
        client.CoreV1Api(api).delete_namespace(namespace)
    return {**totals, "cases": per_case}


if __name__ == "__main__":
    raise SystemExit(main())
