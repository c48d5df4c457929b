"""Where a seek's positions are looked up: in the Kafka the connector's group is in, and by a regex the
lookup can read — else a Failed operation naming why, not positions of other records or a retry loop."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import confluent_kafka
import pytest

from fibers.kafka_positions import PositionsError, lookup
from fibers.startfrom import StartFrom


class Consumer:
    """A Kafka holding topics orders.1 and orders.2 (one partition each, offsets 3 to 10), cluster id K1."""

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def list_topics(self, timeout: float) -> Any:
        partitions = {0: object()}
        topics = {name: SimpleNamespace(partitions=partitions) for name in ("orders.1", "orders.2")}
        return SimpleNamespace(cluster_id="K1", topics=topics)

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        return 3, 10

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confluent_kafka, "Consumer", Consumer)


EARLIEST = StartFrom(position="earliest")


def test_positions_in_the_kafka_expected_are_found() -> None:
    found = lookup("k:9092", [], EARLIEST, regex=r"orders\.\d+", cluster_id="K1")
    assert [(p.topic, p.offset, p.high) for p in found] == [("orders.1", 3, 10), ("orders.2", 3, 10)]


def test_positions_in_another_kafka_are_refused() -> None:
    """A ConnectCluster naming no Kafka had its seek looked up in the operator's: offsets of another Kafka
    were written to its group, and the seek said Succeeded."""
    with pytest.raises(PositionsError, match=r"is cluster K1, not K2.*spec\.kafkaBootstrapServers"):
        lookup("k:9092", ["orders.1"], EARLIEST, cluster_id="K2")


def test_a_topics_regex_python_cannot_read_fails_the_seek_naming_it() -> None:
    """A Java pattern (\\p{Digit}) raised re.error out of the seek step: retried for ever, the connector
    left STOPPED."""
    with pytest.raises(PositionsError, match=r"topics\.regex .* cannot be read here"):
        lookup("k:9092", [], EARLIEST, regex=r"orders\.\p{Digit}+")
