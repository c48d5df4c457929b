"""Which Kafka log a checkpoint's offsets count in: the Kafka cluster's id and the topic's id.

A checkpoint keeps Kafka offsets (`kafka_next_offset`, a bootstrap's target offsets). They mean something
only in the log they were read from. Pointed at another Kafka cluster (`bootstrapServers` changed to a
mirror), or at a topic deleted and created again under its name, the same numbers name other records:
resuming there skips the records before the offset, or delivers others as if they were the ones after it,
and nothing says so. So every checkpoint written records the ids of its log, and a checkpoint recorded
against another log stops the consumer (`RelayChanged`) until a seek gives it a position in this one.

Pure, but for `topic_id`, which asks the broker.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient

from fibers.databus.checkpoint import Checkpoint

CLUSTER_ID = "kafka_cluster_id"  # Fibers keys beside `kafka_next_offset`; Databus readers ignore them
TOPIC_ID = "kafka_topic_id"
_NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # the all-zero id a broker without topic ids (before Kafka 2.8) answers


@dataclass(frozen=True)
class RelayLog:
    """One relay topic's log: ids as the broker gives them, "" where the broker gives none."""

    cluster_id: str
    topic_id: str

    def stamp(self, cp: Checkpoint) -> Checkpoint:
        """`cp` recording this log (the same checkpoint when it already does, or when nothing is known)."""
        values = {key: value for key, value in self._ids().items() if value and cp.get(key) != value}
        return cp.with_values(values) if values else cp

    def changed(self, cp: Checkpoint) -> str:
        """What differs between the log `cp` was recorded against and this one ("" when nothing known does).

        A checkpoint that records no log (written before these keys) is taken to be of this one: there is
        nothing to compare. One written here records it from its first position on, a bootstrap's too (its
        target offsets are the relay's).
        """
        for key, now in self._ids().items():
            then = cp.get(key)
            if isinstance(then, str) and then and now and then != now:
                what = "Kafka cluster" if key == CLUSTER_ID else "topic (deleted and created again?)"
                return f"its checkpoint was written against {what} {then}, the relay is now {now}"
        return ""

    def _ids(self) -> dict[str, str]:
        return {CLUSTER_ID: self.cluster_id, TOPIC_ID: self.topic_id}


def topic_id(bootstrap_servers: str, topic: str, timeout: float) -> str:
    """The topic's id, asked of the broker ("" from one without topic ids; KafkaException, or TimeoutError,
    when it does not answer)."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    [future] = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout).values()
    found = str(future.result(timeout).topic_id)
    return "" if found == _NO_TOPIC_ID else found
