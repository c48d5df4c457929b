"""Partition ownership while scaling: who wants what, Lease names and expiry, fencing, the StatefulSet (pure)."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from fibers.consumer.checkpoint_store import CheckpointStore, fenced_keys
from fibers.consumer.ownership import Leases, lease_name, ordinal_of, owned_keys, wanted
from fibers.consumer.tuning import LEASE_DURATION_SECONDS
from fibers.databus.checkpoint import Checkpoint
from fibers.databus.config import POD_NAME_ENV, POD_UID_ENV
from fibers.databus.owners import LABEL_CONSUMER
from fibers.databus.stats import instance_stats
from fibers.databus.timelines import OWNERS_ANNOTATION
from fibers.databus.workload import render_config, statefulset

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 7, 8, 9])
def test_every_partition_is_wanted_by_exactly_one_instance(replicas: int) -> None:
    partitions = range(8)
    shares = [wanted(partitions, replicas, i) for i in range(replicas)]
    flat = [p for share in shares for p in share]
    assert sorted(flat) == list(partitions)  # all of them, none twice
    assert max(map(len, shares)) - min(map(len, shares)) <= 1  # and evenly


def test_an_instance_beyond_the_replicas_wants_nothing() -> None:
    assert wanted(range(8), 2, 2) == [] and wanted(range(8), 0, 0) == []


def test_owned_keys_span_every_topic() -> None:
    keys = owned_keys({"a": [0, 1, 2], "b.c": [0, 1]}, 2, 1)
    assert keys == {"a.1": ("a", 1), "b.c.1": ("b.c", 1)}


def test_a_pods_ordinal_is_the_number_after_its_last_dash() -> None:
    assert ordinal_of("orders-view-12") == 12
    with pytest.raises(ValueError, match="StatefulSet"):
        ordinal_of("orders-view")


def test_lease_names_are_dns_subdomains_and_tell_topics_apart() -> None:
    names = {
        lease_name("orders", topic, p)
        for topic in ("shop.public.Orders", "shop_public_orders", "shop-public-orders", "x" * 249)
        for p in (0, 1)
    }
    assert len(names) == 8
    assert all(DNS_SUBDOMAIN.match(n) and len(n) <= 253 for n in names), names


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lease(holder: str | None, renew: str = "t1", transitions: int = 1) -> dict[str, Any]:
    return {"holderIdentity": holder, "renewTime": renew, "leaseTransitions": transitions, "leaseDurationSeconds": 10}


def test_another_holders_lease_is_free_only_once_it_stood_still_for_its_duration() -> None:
    clock = Clock()
    leases = Leases(None, "shop", "me", labels={}, clock=clock)  # type: ignore[arg-type]  # no API calls here
    assert not leases._free("t.0", lease("other"))  # first seen: we cannot know how old it is
    clock.now += LEASE_DURATION_SECONDS - 1
    assert not leases._free("t.0", lease("other"))
    clock.now += 2
    assert leases._free("t.0", lease("other"))  # unchanged for longer than its duration: expired
    assert not leases._free("t.0", lease("other", renew="t2"))  # renewed: the count starts again
    clock.now += LEASE_DURATION_SECONDS + 1
    assert leases._free("t.0", lease("other", renew="t2"))


def test_an_empty_or_own_lease_is_free_at_once() -> None:
    leases = Leases(None, "shop", "me", labels={}, clock=Clock())  # type: ignore[arg-type]
    assert leases._free("t.0", lease(None)) and leases._free("t.0", lease("")) and leases._free("t.0", lease("me"))


def test_a_write_is_fenced_where_a_newer_owner_claimed_the_timeline() -> None:
    recorded = {"t.0": 3, "t.1": 1}
    assert fenced_keys(recorded, {"t.0": 2, "t.1": 1}, ["t.0", "t.1", "t.2"]) == {"t.0"}
    assert fenced_keys(recorded, {"t.0": 3}, ["t.0"]) == set()  # our own claim
    assert fenced_keys({}, {}, ["t.0"]) == set()  # nobody claimed it (a ConfigMap of an earlier version)


def consumer(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "fibers.dev/v1beta1",
        "kind": "DatabusConsumer",
        "metadata": {"name": "view", "namespace": "shop", "uid": "u-1"},
        "spec": {"sources": ["shop.public.orders"], "sink": {"type": "log"}, **spec},
    }


def manifest(body: dict[str, Any]) -> dict[str, Any]:
    config = render_config(body, topics=body["spec"]["sources"], kafka_bootstrap="kafka:9092")
    return statefulset(body, config=config, image="job", service_account=None)


def test_instances_are_one_statefulset_and_scaling_leaves_the_pods_alone() -> None:
    three = manifest(consumer(instances=3))
    assert three["kind"] == "StatefulSet" and three["metadata"]["name"] == "view"
    assert three["spec"]["replicas"] == 3 and three["spec"]["podManagementPolicy"] == "Parallel"
    five = manifest(consumer(instances=5))
    assert five["spec"]["replicas"] == 5
    # Only replicas differ: the pods keep running and hand partitions over through their Leases.
    assert five["spec"]["template"] == three["spec"]["template"]
    assert manifest(consumer(instances=3, state="stopped"))["spec"]["replicas"] == 0
    env = {e["name"]: e for e in three["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[POD_NAME_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env[POD_UID_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    # The consumer is the StatefulSet's controller: Kubernetes deletes the StatefulSet (and its pods) with it.
    assert three["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "fibers.dev/v1beta1",
            "kind": "DatabusConsumer",
            "name": "view",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    [port] = three["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert port["name"] == "metrics"  # what the chart's PodMonitor scrapes


def test_a_changed_spec_changes_the_template() -> None:
    before = manifest(consumer())
    after = manifest(copy.deepcopy(consumer(sink={"type": "kafka", "topic": "out"})))
    assert before["spec"]["template"] != after["spec"]["template"]


def test_figures_of_instances_scaled_away_are_left_out() -> None:
    annotations = {
        "fibers.dev/stats-0": '{"lag": 1}',
        "fibers.dev/stats-1": '{"lag": 2}',
        "fibers.dev/stats-3": '{"lag": 40}',  # instance 3 of 4, before a scale to 2
        "fibers.dev/owners": '{"t.0": 1}',
    }
    assert instance_stats(annotations, 2) == ([{"lag": 1}, {"lag": 2}], [])


class OneConfigMap:
    """The API as a checkpoint store sees it: one ConfigMap, and the replace it is written with."""

    def __init__(self, cm: dict[str, Any]) -> None:
        self.cm, self.replaced = cm, None

    def get_or_none(self, url: str) -> dict[str, Any] | None:
        return json.loads(json.dumps(self.cm))

    def replace(self, url: str, cm: dict[str, Any]) -> dict[str, Any]:
        self.replaced = cm
        return cm


def test_a_timeline_a_newer_owner_holds_is_not_written_beside_one_whose_checkpoints_were_dropped() -> None:
    """t.0 was claimed in a ConfigMap since deleted (a seek) and t.1 is held by a newer owner (token 5 over
    ours, 3): both are refused. The dropped one was checked first and the newer owner's was not looked at,
    so t.1's older position was written over the newer owner's (its windows read again, or skipped past)."""
    labels = {LABEL_CONSUMER: "c"}
    owners = {OWNERS_ANNOTATION: json.dumps({"t.0": 1, "t.1": 5})}
    meta = {"name": "cp", "uid": "uid-2", "resourceVersion": "1", "labels": labels, "annotations": owners}
    api = OneConfigMap({"metadata": meta, "data": {}})
    store = CheckpointStore(api, "ns", "cp", ["t"], instance=0, labels=labels)  # type: ignore[arg-type]
    store.tokens, store.claimed_in = {"t.0": 1, "t.1": 3}, {"t.0": "uid-1", "t.1": "uid-2"}
    store.pending = {"t.0": Checkpoint.initial(), "t.1": Checkpoint.initial()}
    assert store._flush() is False
    assert store.fenced == {"t.0", "t.1"}
    assert api.replaced is None
