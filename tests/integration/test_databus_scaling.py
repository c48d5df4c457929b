"""DatabusConsumer instances scaled while they consume: Leases hand partitions over, fencing guards checkpoints.

The first tests take Leases and write checkpoints against the real API server directly; the last one runs
real pods on the node (a recording callback in an image FROM the job image) and rescales them under load.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client
from kubernetes.client import ApiClient

import fibers_stack as stack
from fibers import kubeapi
from fibers.consumer.checkpoint_store import CheckpointStore
from fibers.consumer.ownership import Leases, lease_name
from fibers.consumer.tuning import LEASE_DURATION_SECONDS
from fibers.databus.checkpoint import Checkpoint
from fibers.databus.owners import LABEL_CONSUMER
from fibers.databus.timelines import Checkpoints
from fibers_stack import StackInfo
from tests.helpers import Resources, read_all, wait_for
from tests.integration.conftest import OperatorProcess

pytestmark = pytest.mark.databus
RECORDER = Path(__file__).resolve().parent / "recorder"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_process_holds_a_lease_until_it_releases_it_or_stops_renewing(
    stack_info: StackInfo, namespace: str, unique: str
) -> None:
    api = kubeapi.Api(kubeapi.from_kubeconfig(stack_info.kubeconfig))
    clock = Clock()
    a = Leases(api, namespace, "a", labels={}, clock=clock)
    b = Leases(api, namespace, "b", labels={}, clock=clock)
    name = lease_name(unique, "shop.public.orders", 0)
    assert a.take("t.0", name)
    assert not b.take("t.0", name)  # held by a
    clock.now += LEASE_DURATION_SECONDS + 1
    a.renew()
    assert not b.take("t.0", name)  # a renewed it: b's count starts again
    clock.now += LEASE_DURATION_SECONDS + 1
    assert b.take("t.0", name)  # a stood still for longer than the duration: expired, and b takes it
    lease = api.get(kubeapi.path("coordination.k8s.io/v1", "leases", namespace, name))
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 2
    a.renew()
    assert "t.0" in a.overdue() and "t.0" not in a.held  # a learns it lost the partition
    b.release("t.0")
    assert a.take("t.0", name)  # released: free at once, no waiting for expiry


def test_a_lease_of_a_partitions_name_that_no_instance_made_is_never_taken(
    stack_info: StackInfo, namespace: str, unique: str
) -> None:
    """Someone's Lease under the name of one of a consumer's partitions, expired or held: the instance
    leaves it (and the partition) alone, where it used to take it over once it expired."""
    api = kubeapi.Api(kubeapi.from_kubeconfig(stack_info.kubeconfig))
    clock = Clock()
    name = lease_name(unique, "shop.public.orders", 0)
    planted = {"metadata": {"name": name}, "spec": {"holderIdentity": "someone", "leaseDurationSeconds": 1}}
    api.create(kubeapi.path("coordination.k8s.io/v1", "leases", namespace), planted)
    mine = Leases(api, namespace, "a", labels={LABEL_CONSUMER: unique}, clock=clock)
    assert not mine.take("t.0", name)
    clock.now += LEASE_DURATION_SECONDS + 1
    assert not mine.take("t.0", name)  # expired by now, and still not ours
    lease = api.get(kubeapi.path("coordination.k8s.io/v1", "leases", namespace, name))
    assert lease["spec"]["holderIdentity"] == "someone" and not mine.held


def online(offset: int) -> Checkpoint:
    return Checkpoint.initial().online(offset).with_values({"kafka_next_offset": offset})


def test_a_stale_owner_cannot_move_a_checkpoint_backwards(stack_info: StackInfo, namespace: str, unique: str) -> None:
    api = kubeapi.Api(kubeapi.from_kubeconfig(stack_info.kubeconfig))
    old = CheckpointStore(api, namespace, f"{unique}-checkpoint", ["t"], instance=0, min_interval=0)
    new = CheckpointStore(api, namespace, f"{unique}-checkpoint", ["t"], instance=1, min_interval=0)
    first, _ = old.claim("t.0")
    assert old.save({"t.0": online(10)}, force=True)
    second, stored = new.claim("t.0")
    assert second == first + 1 and stored["t.0"] == online(10)  # the new owner starts where the old one was
    assert not old.save({"t.0": online(5)}, force=True)  # refused: a newer owner claimed it
    assert old.fenced == {"t.0"}
    assert new.save({"t.0": online(12)}, force=True)
    data = api.get(kubeapi.path("v1", "configmaps", namespace, f"{unique}-checkpoint"))["data"]
    assert Checkpoints.from_configmap_data(data, ["t"])["t.0"] == online(12)


def test_an_owner_never_writes_its_checkpoints_back_into_a_configmap_deleted_since_its_claim(
    stack_info: StackInfo, namespace: str, unique: str
) -> None:
    """A seek deletes the checkpoints once the instances are gone; an instance still stopping (its last
    flush on SIGTERM) must not create the ConfigMap again with its old positions: the consumers would
    resume from there and the seek be silently undone."""
    api = kubeapi.Api(kubeapi.from_kubeconfig(stack_info.kubeconfig))
    url = kubeapi.path("v1", "configmaps", namespace, f"{unique}-checkpoint")
    store = CheckpointStore(api, namespace, f"{unique}-checkpoint", ["t"], instance=0, min_interval=0)
    store.claim("t.0")
    assert store.save({"t.0": online(10)}, force=True)
    api.delete(url)  # the seek drops the checkpoints
    assert not store.save({"t.0": online(20)}, force=True)
    assert api.get_or_none(url) is None
    assert store.fenced == {"t.0"}


def test_an_owner_never_writes_into_a_configmap_made_again_since_its_claim(
    stack_info: StackInfo, namespace: str, unique: str
) -> None:
    """The checkpoints deleted (a seek, or by hand) and a new owner's claim making the ConfigMap again, with its
    tokens counted from 1, before the old owner's next flush: that flush finds a ConfigMap, and no newer token
    than its own. It is still refused: the ConfigMap is not the one it claimed in (its uid), and writing there
    would put the old positions over the new owner's and undo the seek unseen."""
    api = kubeapi.Api(kubeapi.from_kubeconfig(stack_info.kubeconfig))
    url = kubeapi.path("v1", "configmaps", namespace, f"{unique}-checkpoint")
    old = CheckpointStore(api, namespace, f"{unique}-checkpoint", ["t"], instance=0, min_interval=0)
    new = CheckpointStore(api, namespace, f"{unique}-checkpoint", ["t"], instance=1, min_interval=0)
    old.claim("t.0")
    assert old.save({"t.0": online(10)}, force=True)
    api.delete(url)  # the seek drops the checkpoints
    token, stored = new.claim("t.0")
    assert token == 1 and "t.0" not in stored  # counted afresh in the new ConfigMap
    assert new.save({"t.0": online(3)}, force=True)
    assert not old.save({"t.0": online(20)}, force=True)
    assert old.fenced == {"t.0"}
    assert Checkpoints.from_configmap_data(api.get(url)["data"], ["t"])["t.0"] == online(3)


# ----- real pods, rescaled under load --------------------------------------------------------------

PARTITIONS = 8
RATE = 1000  # events per second into the relay while instances come and go


class Load:
    """Writes `{"id": n}` with key n to partition n % PARTITIONS at RATE per second until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic, self.sent, self.stop = topic, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - started) * RATE)
            while self.sent < due:
                n = self.sent
                self.producer.produce(
                    self.topic, key=str(n).encode(), value=json.dumps({"id": n}).encode(), partition=n % PARTITIONS
                )
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.01)
        assert self.producer.flush(30) == 0


class CheckpointWatch:
    """Reads the checkpoint ConfigMap every 0.1 s; notes any timeline whose next offset went down."""

    def __init__(self, kube: ApiClient, namespace: str, name: str) -> None:
        self.core, self.namespace, self.name = client.CoreV1Api(kube), namespace, name
        self.last: dict[str, int] = {}
        self.backwards: list[str] = []
        self.reads = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                cm = self.core.read_namespaced_config_map(self.name, self.namespace)
            except client.ApiException:
                continue
            self.reads += 1
            for key, value in (cm.data or {}).items():
                if key == "sources.sha256":
                    continue
                offset = Checkpoint.parse(value).get("kafka_next_offset")
                if isinstance(offset, int):
                    if offset < self.last.get(key, -1):
                        self.backwards.append(f"{key}: {self.last[key]} -> {offset}")
                    self.last[key] = max(offset, self.last.get(key, -1))


def holders(kube: ApiClient, namespace: str, consumer: str, topic: str, partitions: int) -> dict[int, str]:
    """Partition → the pod holding its Lease (holder names are `<pod>_<uid>`)."""
    leases = {
        lease.metadata.name: lease.spec.holder_identity or ""
        for lease in client.CoordinationV1Api(kube).list_namespaced_lease(namespace).items
    }
    return {p: leases.get(lease_name(consumer, topic, p), "").split("_")[0] for p in range(partitions)}


def owned_as_wanted(
    kube: ApiClient, namespace: str, consumer: str, topic: str, n: int, partitions: int = PARTITIONS
) -> bool:
    wanted = {p: f"{consumer}-{p % n}" for p in range(partitions)}
    return holders(kube, namespace, consumer, topic, partitions) == wanted


def overlaps(records: list[dict[str, Any]]) -> list[str]:
    """Batches of one partition delivered by two pods at overlapping times."""
    found = []
    by_partition: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_partition[record["partition"]].append(record)
    for partition, batches in by_partition.items():
        batches.sort(key=lambda r: r["t0"])
        latest: dict[str, float] = {}  # pod → the end of its latest batch so far
        for batch in batches:
            for pod, end in latest.items():
                if pod != batch["pod"] and end > batch["t0"]:
                    found.append(f"partition {partition}: {pod} until {end:.3f}, {batch['pod']} from {batch['t0']:.3f}")
            latest[batch["pod"]] = max(latest.get(batch["pod"], 0.0), batch["t1"])
    return found


def test_rescaling_under_load_loses_nothing_and_never_delivers_a_partition_from_two_pods(
    kube: ApiClient, namespace: str, operator: OperatorProcess, stack_info: StackInfo, unique: str
) -> None:
    image = stack.user_image(stack_info, "fibers-test-recorder", RECORDER)
    relay, recording = f"{unique}-relay", f"{unique}-recording"
    admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(relay, PARTITIONS, 1), NewTopic(recording, 1, 1)]).values():
        future.result(30)
    consumers = Resources(kube, "databusconsumers", namespace)
    custom = client.CustomObjectsApi(kube)
    load = Load(stack_info.kafka_bootstrap, relay)
    watch = CheckpointWatch(kube, namespace, f"{unique}-checkpoint")
    consumers.create(
        unique,
        {
            "sources": [relay],
            "startPosition": "earliest",
            "image": image,
            "checkpoint": {"minIntervalSeconds": 0.2},
            "sink": {
                "type": "callback",
                "callback": "window_recorder:WindowRecorder",
                "options": {"bootstrap": stack_info.kafka_bootstrap, "topic": recording},
            },
        },
    )
    wait_for(lambda: owned_as_wanted(kube, namespace, unique, relay, 1), timeout=120, what="one pod owns all")
    load.thread.start()
    watch.thread.start()
    time.sleep(3)
    handover: dict[str, float] = {}
    for n in (3, 2, 4):
        # What `kubectl scale databusconsumer/<name> --replicas n` does: the scale subresource.
        started = time.monotonic()
        custom.patch_namespaced_custom_object_scale(
            "fibers.dev", "v1beta1", namespace, "databusconsumers", unique, {"spec": {"replicas": n}}
        )
        if n == 4:  # a pod killed in the middle of a rescale: gone at once, its Leases left to expire
            time.sleep(1)
            client.CoreV1Api(kube).delete_namespaced_pod(f"{unique}-1", namespace, grace_period_seconds=0)
        wait_for(
            lambda n=n: owned_as_wanted(kube, namespace, unique, relay, n),  # type: ignore[misc]
            timeout=120,
            what=f"every partition owned by its pod of {n}",
        )
        handover[f"to {n}"] = round(time.monotonic() - started, 1)
        time.sleep(3)
    load.stop.set()
    load.thread.join(60)
    sent = {str(n) for n in range(load.sent)}

    def recorded() -> list[dict[str, Any]] | None:
        records = [json.loads(v) for v in read_all(stack_info.kafka_bootstrap, recording, idle=2)]
        return records if sent <= {k for r in records for k in r["keys"]} else None

    try:
        records = wait_for(recorded, timeout=120, what="every key sent to reach the callback")
    finally:
        watch.stop.set()
    watch.thread.join(5)
    print(f"rescale handovers (s): {handover}; events sent: {load.sent}; checkpoint reads: {watch.reads}")
    assert overlaps(records) == []
    assert watch.backwards == [] and watch.reads > 50
    pods = {r["pod"].split("_")[0] for r in records}
    assert {f"{unique}-{i}" for i in range(4)} <= pods  # every instance delivered something
    status = consumers.wait_status(unique, lambda s: s.get("readyInstances") == 4, timeout=60, what="4 ready")
    assert status["phase"] == "Running"
