"""Sink consumer groups across ConnectClusters that share one Kafka (pure: no I/O).

A sink connector's consumer group is `connect-<connector name>` on the Kafka its Connect cluster uses
(the override is refused, see `fibers.connect.spec`). On one Connect cluster a connector name is one
connector, and `fibers.connect.ownership` keeps it its owner's. Two Connect clusters on one Kafka — one
per team is a common shape — are another matter: a Connect on the second cluster that names the first
one's connector would join that team's group, read part of its records (which the owner then never
sees), and with a seek or a Replay move that team's offsets.

So among sink Connects on different ConnectClusters whose Kafka is the same (each cluster's probe reads
the Kafka cluster id its Kafka Connect reports), a group belongs to one: the Connect that recorded the
connector as its own first (`status.connectorName`), then the oldest. The others are neither created nor
have offsets moved, and say why (`ConsumerGroupInUse`). The order survives an operator restart, so a
restart never flips which one holds a group.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from fibers.conditions import READY, Condition

if TYPE_CHECKING:
    from fibers.connect.reconcile import Target

IN_USE = "ConsumerGroupInUse"
# While its cluster's Kafka is not known (its first probe has not answered), a sink is not created where
# another ConnectCluster exists: it might name a group there.
KAFKA_UNKNOWN = "KafkaNotKnownYet"


def group_of(connector: str) -> str:
    """Kafka Connect's consumer group for a sink connector."""
    return f"connect-{connector}"


def _rank(target: Target) -> tuple[bool, str, str, str]:
    """Who holds a contested group first: the one that recorded the connector as its own, then the oldest."""
    assert target.spec is not None
    recorded = target.status.get("connectorName") == target.spec.connector
    return not recorded, str(target.meta.get("creationTimestamp") or "~"), target.namespace, target.name


def is_sink(target: Target) -> bool:
    """A placed Connect whose connector is a sink (`ConnectSpec.is_sink`)."""
    return target.spec is not None and target.placed and target.spec.is_sink


def check(targets: Iterable[Target], kafka_ids: Mapping[str, str | None]) -> list[Target]:
    """Set each Connect's `group_problem`; return the Connects whose problem changed.

    `kafka_ids`: per ConnectCluster, the id of the Kafka its Kafka Connect reports ("" when it reports
    none, None when not probed yet). A Connect being deleted still holds its group: its connector runs
    until the deletion has removed it."""
    targets = list(targets)
    if len(kafka_ids) < 2:  # one ConnectCluster (the usual case): no group to share, nothing to compare
        return [_clear(t) for t in targets if t.group_problem is not None]
    contenders: dict[tuple[str, str], list[Target]] = defaultdict(list)
    for target in targets:
        if is_sink(target) and (kafka := kafka_ids.get(target.cluster)):
            assert target.spec is not None
            contenders[(kafka, target.spec.connector)].append(target)
    changed = []
    for target in targets:
        problem = None if target.deleting or not is_sink(target) else _problem(target, kafka_ids, contenders)
        if problem != target.group_problem:
            target.group_problem = problem
            changed.append(target)
    return changed


def _clear(target: Target) -> Target:
    target.group_problem = None
    return target


def _problem(
    target: Target, kafka_ids: Mapping[str, str | None], contenders: Mapping[tuple[str, str], list[Target]]
) -> Condition | None:
    assert target.spec is not None
    kafka = kafka_ids.get(target.cluster)
    if kafka is None:  # (`check` asks only where there are several ConnectClusters)
        if target.status.get("connectorName") == target.spec.connector:
            return None
        message = (
            f"waiting for ConnectCluster {target.cluster}'s first probe: its Kafka must be known before the sink's "
            f"consumer group {group_of(target.spec.connector)} can be checked against the other ConnectClusters"
        )
        return Condition(READY, False, KAFKA_UNKNOWN, message)
    if not kafka:
        return None
    rivals = [t for t in contenders[(kafka, target.spec.connector)] if t.cluster != target.cluster]
    if not rivals:
        return None
    holder = min([target, *rivals], key=_rank)
    if holder is target:
        return None
    message = (
        f"consumer group {group_of(target.spec.connector)} on Kafka {kafka} is the sink of Connect {holder.name} in "
        f"namespace {holder.namespace} (ConnectCluster {holder.cluster}, on the same Kafka): this connector is "
        "neither created nor has its offsets moved. Choose another connectorName."
    )
    return Condition(READY, False, IN_USE, message)
