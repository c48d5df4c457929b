"""Small test helpers shared by integration tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import Consumer, KafkaException

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.5) -> T:
    """Poll probe() until it returns something truthy; fail with `what` after the timeout."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def read_topic(bootstrap: str, topic: str, count: int, *, timeout: float = 60) -> list[bytes]:
    """Read the first `count` record values of a topic from the beginning."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-reader-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().retriable() or "UNKNOWN_TOPIC" in msg.error().name():
                    continue
                raise KafkaException(msg.error())
            values.append(msg.value() or b"")
    finally:
        consumer.close()
    if len(values) < count:
        raise AssertionError(f"read {len(values)} of {count} records from {topic} in {timeout:.0f}s")
    return values
