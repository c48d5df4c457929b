"""startFrom, the one vocabulary of where reading a stream starts (fibers.startfrom)."""

from __future__ import annotations

import pytest

from fibers.databus.config import ConfigError, ConsumerConfig
from fibers.databus.workload import seek_position
from fibers.startfrom import NO_OFFSET, StartFrom, StartFromError, before_retention, format_time, offset_at

T = 1_795_770_000_000  # 2026-11-27T09:00:00Z


def test_a_position_or_a_timestamp_exactly() -> None:
    assert StartFrom.parse({"position": "latest"}, "spec.startFrom") == StartFrom(position="latest")
    at = StartFrom.parse({"timestamp": "2026-11-27T09:00:00Z"}, "spec.startFrom")
    assert at.timestamp_ms == T and at.to_dict() == {"timestamp": "2026-11-27T09:00:00.000Z"}
    assert StartFrom.parse({"timestamp": "2026-11-27T10:00:00+01:00"}, "x").timestamp_ms == T


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({}, "spec.startFrom: exactly one of position, timestamp"),
        ({"position": "earliest", "timestamp": "2026-11-27T09:00:00Z"}, "exactly one"),
        ("earliest", "exactly one"),
        ({"position": "yesterday"}, "spec.startFrom.position must be one of earliest, latest, bootstrap"),
        ({"timestamp": "27/11/2026"}, "spec.startFrom.timestamp: '27/11/2026' is not an RFC 3339 time"),
        ({"timestamp": "2026-11-27T09:00:00"}, "has no time zone"),
    ],
)
def test_anything_else_is_refused_naming_the_field(value: object, message: str) -> None:
    with pytest.raises(StartFromError, match=message):
        StartFrom.parse(value, "spec.startFrom")


def test_a_time_to_come_is_refused() -> None:
    at = StartFrom(timestamp_ms=T)
    assert at.check(T, "spec.startFrom") is at
    with pytest.raises(StartFromError, match=r"spec.startFrom.timestamp 2026-11-27T09:00:00.000Z is in the future"):
        at.check(T - 1, "spec.startFrom")


def test_the_offset_kafka_gives_for_a_time_and_the_retention_check() -> None:
    assert offset_at(42, high=100) == 42
    assert offset_at(NO_OFFSET, high=100) == 100  # nothing at or after T yet: the end
    assert not before_retention(0, low=0)  # nothing ever deleted
    assert not before_retention(57, low=50)  # T falls inside what is kept
    assert before_retention(50, low=50)  # the first record at or after T is the oldest kept, and some went before
    assert not before_retention(NO_OFFSET, low=50)
    assert format_time(T) == "2026-11-27T09:00:00.000Z"


def config(**data: object) -> ConsumerConfig:
    base = {
        "name": "c",
        "namespace": "n",
        "relay": {"bootstrapServers": "k:9092", "topics": ["t"]},
        "sink": {"type": "log"},
        "checkpoint": {"configMapName": "c-checkpoint"},
    }
    return ConsumerConfig.from_dict({**base, **data})


def test_the_consumer_reads_startfrom_and_its_older_startposition() -> None:
    assert config(startPosition="latest").start_position == "latest"
    at = config(startFrom={"timestamp": "2026-11-27T09:00:00Z"}, startFromField="spec.seek.startFrom")
    assert at.start_position == "timestamp" and at.start_from.timestamp_ms == T
    with pytest.raises(ConfigError, match=r"spec\.startPosition must be one of"):
        config(startPosition="yesterday").check()
    with pytest.raises(ConfigError, match=r"spec\.seek\.startFrom\.timestamp .* is in the future"):
        config(startFrom={"timestamp": "2999-01-01T00:00:00Z"}, startFromField="spec.seek.startFrom").check()
    with pytest.raises(ConfigError, match=r"spec\.startFrom bootstrap needs spec\.bootstrap"):
        config(startFrom={"position": "bootstrap"}, startFromField="spec.startFrom").check()


def test_a_seek_names_startfrom_or_its_older_to() -> None:
    assert seek_position({"nonce": "1", "to": "latest"}) == StartFrom(position="latest")
    assert seek_position({"nonce": "1", "startFrom": {"timestamp": "2026-11-27T09:00:00Z"}}).timestamp_ms == T
