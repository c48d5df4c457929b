"""Where a `startFrom` falls in Kafka topics: per partition, the offset a reader starts from and how many
records lie after it. The operator asks this where it moves a reader itself (a sink connector's
consumer group, through Kafka Connect's offsets API) and to count what a Replay replays.

Blocking (librdkafka): callers run `lookup` in a thread. confluent_kafka is imported on first use, so the
operator process pays for it only once something is repositioned. A time older than what Kafka keeps is
refused (`startfrom.before_retention`), as every reader refuses it; a topic that does not exist is named.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from fibers.startfrom import StartFrom, before_retention, offset_at, retention_message

TIMEOUT_SECONDS = 10.0  # one metadata or offsets request; a broker that does not answer in this is down
GROUP = "fibers-positions"  # never joined nor committed to: offsets_for_times needs a group.id only


class PositionsError(RuntimeError):
    """The positions cannot be had (a missing topic, a time before retention, Kafka down); the message says which."""


@dataclass(frozen=True)
class Position:
    topic: str
    partition: int
    offset: int  # where reading starts
    high: int  # the partition's end when asked

    @property
    def records(self) -> int:
        return max(self.high - self.offset, 0)


def same_kafka(bootstrap: str, declared: str) -> bool:
    """Whether a bootstrap list a user wrote names the Kafka the platform declared: a broker in common (host:port,
    compared without case or spaces). The operator connects only to the declared one."""

    def brokers(servers: str) -> set[str]:
        return {b.strip().lower() for b in servers.split(",") if b.strip()}

    return bool(brokers(bootstrap) & brokers(declared))


def _refuse_another_kafka(bootstrap: str, found: str | None, expected: str) -> None:
    """PositionsError when the Kafka at `bootstrap` is not the one expected (when both ids are known)."""
    if expected and found and found != expected:
        raise PositionsError(
            f"the Kafka at {bootstrap} is cluster {found}, not {expected}, the one its Kafka Connect uses: name "
            "that Kafka in the ConnectCluster's spec.kafkaBootstrapServers"
        )


def _matches(regex: str, topic: str) -> bool:
    """Whether a sink's `topics.regex` (a Java pattern) takes the topic; one Python cannot read is refused."""
    try:
        return re.fullmatch(regex, topic) is not None
    except re.error as exc:
        raise PositionsError(
            f"topics.regex {regex!r} cannot be read here ({exc}): name the topics (topics) to seek this connector"
        ) from None


def total(positions: Iterable[Position]) -> int:
    return sum(p.records for p in positions)


def describe(positions: list[Position]) -> str:
    """`3 partition(s) of orders, items: 1234 record(s) to replay`, for conditions and Events."""
    topics = ", ".join(sorted({p.topic for p in positions}))
    return f"{len(positions)} partition(s) of {topics}: {total(positions)} record(s) to replay"


def lookup(
    bootstrap: str, topics: Iterable[str], start: StartFrom, *, regex: str = "", cluster_id: str = ""
) -> list[Position]:
    """The positions of `start` in every partition of `topics` (and of every topic matching `regex`).

    `cluster_id`: the id of the Kafka the positions are for (a Kafka Connect's, where its consumer group is);
    positions looked up in another Kafka would name other records there, so another id is refused.
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        listing = consumer.list_topics(timeout=TIMEOUT_SECONDS)
        _refuse_another_kafka(bootstrap, listing.cluster_id, cluster_id)
        metadata = listing.topics
        names = sorted(set(topics) | ({t for t in metadata if _matches(regex, t)} if regex else set()))
        if not names:
            raise PositionsError(f"no topic matches {regex!r}" if regex else "no topic to position")
        positions = []
        for topic in names:
            found = metadata.get(topic)
            if found is None or not found.partitions:
                raise PositionsError(f"topic {topic} does not exist on {bootstrap}")
            for partition in sorted(found.partitions):
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=TIMEOUT_SECONDS)
                offset = high if start.position == "latest" else low
                if start.timestamp_ms is not None:
                    [at] = consumer.offsets_for_times(
                        [TopicPartition(topic, partition, start.timestamp_ms)], timeout=TIMEOUT_SECONDS
                    )
                    if before_retention(at.offset, low):
                        message = retention_message("startFrom", start.timestamp_ms, topic, partition, low)
                        raise PositionsError(message)
                    offset = offset_at(at.offset, high)
                positions.append(Position(topic, partition, offset, high))
        return positions
    except KafkaException as exc:
        raise PositionsError(f"Kafka at {bootstrap} did not answer: {exc.args[0]}") from None
    finally:
        consumer.close()
