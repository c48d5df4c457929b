"""A checkpoint's Kafka offsets are taken only in the log they were read from: its Kafka cluster and its topic.

Before, a consumer whose `bootstrapServers` was pointed at another Kafka cluster (a mirror), or whose topic
was deleted and created again, resumed at its checkpoint's offset there: the records before it were skipped,
or other records taken for the ones after it, and nothing said so. (The topic created again is also shown
against the real Kafka: `test_databus_recovery.py::test_a_topic_created_again_stops_the_consumer_…`.)
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from fibers.consumer.assignment import Assignment
from fibers.consumer.positions import NEXT_OFFSET, Positions
from fibers.consumer.relay_log import CLUSTER_ID, TOPIC_ID, RelayLog
from fibers.consumer.stops import RELAY_GONE_EXIT, ConsumerStopped
from fibers.databus.checkpoint import Checkpoint
from fibers.databus.timelines import Checkpoints

HERE = RelayLog("cluster-a", "topic-1")


def at(offset: int, **ids: str) -> Checkpoint:
    return Checkpoint.initial().online(7, values={NEXT_OFFSET: offset, **ids})


class Consumer:
    """The Kafka consumer as `_take` calls it once every timeline has a position."""

    def __init__(self) -> None:
        self.assigned: list[TopicPartition] = []

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned += partitions


def take(stored: Checkpoint) -> tuple[Consumer, Positions, list[Any]]:
    """Timeline t.0 taken by an instance whose relay is HERE, with `stored` in its ConfigMap."""
    saved: list[Any] = []
    positions = Positions(SimpleNamespace(save=lambda cps, force=False: saved.append(cps)))  # type: ignore[arg-type]
    positions.logs["t"] = HERE
    consumer = Consumer()
    assignment = Assignment(
        SimpleNamespace(topics=["t"]),  # type: ignore[arg-type]
        consumer,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        positions,
        SimpleNamespace(plan=lambda topic, partitions, stored: []),  # type: ignore[arg-type]
        SimpleNamespace(requested=False),  # type: ignore[arg-type]
        str,
    )
    assignment._take([("t", 0)], Checkpoints(["t"], {"t.0": stored}))
    return consumer, positions, saved


@pytest.mark.parametrize(
    ("ids", "named"),
    [
        ({CLUSTER_ID: "cluster-b", TOPIC_ID: "topic-1"}, "Kafka cluster cluster-b"),
        ({CLUSTER_ID: "cluster-a", TOPIC_ID: "topic-0"}, "topic (deleted and created again?) topic-0"),
    ],
)
def test_a_checkpoint_of_another_kafka_log_stops_the_consumer_for_good_naming_both(
    ids: dict[str, str], named: str
) -> None:
    with pytest.raises(ConsumerStopped) as stopped:
        take(at(500, **ids))
    assert stopped.value.code == RELAY_GONE_EXIT  # no restart changes it: the pod waits to be replaced
    message = str(stopped.value)
    assert message.startswith("RelayChanged: t.0: ") and named in message and "spec.seek" in message


def test_a_checkpoint_of_this_log_resumes_at_its_offset() -> None:
    consumer, positions, _ = take(at(500, **{CLUSTER_ID: "cluster-a", TOPIC_ID: "topic-1"}))
    assert [(tp.topic, tp.partition, tp.offset) for tp in consumer.assigned] == [("t", 0, 500)]
    assert positions.resume("t.0") == 500


def test_a_checkpoint_recording_no_log_is_taken_as_this_ones_and_records_it_from_then_on() -> None:
    """Checkpoints written before these keys: nothing to compare, so the upgrade goes on where it was."""
    consumer, positions, _ = take(at(500))
    assert [tp.offset for tp in consumer.assigned] == [500]
    cp = positions.checkpoints["t.0"]
    assert (cp.get(CLUSTER_ID), cp.get(TOPIC_ID)) == ("cluster-a", "topic-1")
    following = cp.online(9, values={NEXT_OFFSET: 501})  # the relay's next window keeps them
    assert (following.get(CLUSTER_ID), following.get(TOPIC_ID)) == ("cluster-a", "topic-1")


def test_ids_a_broker_does_not_give_are_neither_recorded_nor_compared() -> None:
    """A broker before Kafka 2.8 has no topic ids: the cluster id is still compared."""
    old_broker = RelayLog("cluster-a", "")
    cp = old_broker.stamp(at(500))
    assert cp.get(TOPIC_ID) is None and cp.get(CLUSTER_ID) == "cluster-a"
    assert old_broker.changed(at(500, **{TOPIC_ID: "topic-0"})) == ""
    assert "cluster-b" in old_broker.changed(at(500, **{CLUSTER_ID: "cluster-b"}))
    assert HERE.stamp(cp) is not cp and HERE.stamp(HERE.stamp(cp)) == HERE.stamp(cp)
