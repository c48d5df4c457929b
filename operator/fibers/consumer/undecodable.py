"""What a consumer does with a record it cannot decode (spec.onUndecodable), as Kafka Connect's
errors.tolerance and dead letter queue do.

- `fail` (the default): the consumer stops, naming the topic, partition, offset and error (the
  resource's condition); nothing after the record is applied until the spec says otherwise.
- `skip`: the record is counted and passed over.
- `deadLetter`: the record goes, bytes unchanged, to a topic of its own, with where it came from and
  why in headers; it is passed over only once that topic confirmed it (a failed delivery stops the
  consumer rather than drop it).

Counted in `counts` for status and /metrics.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, Producer

from fibers.consumer.tuning import KAFKA_SINK_FLUSH_SECONDS

log = logging.getLogger("fibers.consumer.undecodable")
ACTIONS = ("fail", "skip", "deadLetter")
HEADER_PREFIX = "fibers.undecodable."


class DeadLetterFailed(RuntimeError):
    """The dead letter topic did not confirm the record."""


class UndecodablePolicy:
    def __init__(self, action: str, topic: str | None, bootstrap_servers: str) -> None:
        self.action, self.topic = action, topic
        self.counts = {"skipped": 0, "deadLettered": 0}
        self._producer: Producer | None = None
        if action == "deadLetter":
            self._producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True})

    def passes(self, message: Any, error: Exception) -> bool:
        """Whether the relay goes on past this record (skipped or dead-lettered); False: stop on it."""
        where = {"topic": message.topic(), "partition": message.partition(), "offset": message.offset()}
        if self.action == "skip":
            self.counts["skipped"] += 1
            log.warning("undecodable record skipped", extra={**where, "error": str(error)})
            return True
        if self.action == "deadLetter" and self._producer is not None and self.topic:
            self._dead_letter(message, error)
            self.counts["deadLettered"] += 1
            log.warning("undecodable record sent to the dead letter topic", extra={**where, "to": self.topic})
            return True
        return False

    def _dead_letter(self, message: Any, error: Exception) -> None:
        assert self._producer is not None and self.topic is not None
        failed: list[KafkaError] = []
        headers = [
            (f"{HEADER_PREFIX}topic", message.topic().encode()),
            (f"{HEADER_PREFIX}partition", str(message.partition()).encode()),
            (f"{HEADER_PREFIX}offset", str(message.offset()).encode()),
            (f"{HEADER_PREFIX}error", str(error)[:1000].encode()),
        ]
        self._producer.produce(
            self.topic,
            key=message.key(),
            value=message.value(),
            headers=headers,
            on_delivery=lambda err, _msg: failed.append(err) if err is not None else None,
        )
        if self._producer.flush(KAFKA_SINK_FLUSH_SECONDS) or failed:
            reason = failed[0].str() if failed else "not confirmed in time"
            raise DeadLetterFailed(f"dead letter topic {self.topic}: {reason}")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(KAFKA_SINK_FLUSH_SECONDS)
