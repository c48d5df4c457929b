"""A callback that records what each pod delivered, and when, to a Kafka topic (the scaling test reads it).

One record per partition of each batch: the pod, the partition, the offsets and keys delivered, and the
wall-clock interval the batch spent in the callback — from its first window's start to the end of the
batch. Overlapping intervals of one partition from two pods are what exclusive ownership must prevent.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from confluent_kafka import Producer

from fibers.consumer.callbacks import Result
from fibers.consumer.events import ChangeEvent
from fibers.consumer.sinks import WindowSink


class WindowRecorder(WindowSink):
    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__()
        # The pod's name and uid: a pod made anew under the same name counts as another pod.
        self.topic = topic
        self.pod = f"{os.environ.get('FIBERS_POD_NAME', '?')}_{os.environ.get('FIBERS_POD_UID', '?')[:8]}"
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.started: float | None = None

    def on_start_data_event_sequence(self, scn: int) -> Result:
        if self.started is None:
            self.started = time.time()
        return super().on_start_data_event_sequence(scn)

    def flush(self, events: list[ChangeEvent]) -> None:
        by_partition: dict[int, list[ChangeEvent]] = {}
        for event in events:
            by_partition.setdefault(event.partition, []).append(event)
        started, self.started = self.started or time.time(), None
        for partition, own in by_partition.items():
            record: dict[str, Any] = {
                "pod": self.pod,
                "partition": partition,
                "offsets": [e.offset for e in own],
                "keys": [e.key for e in own],
                "t0": started,
                "t1": time.time(),
            }
            self.producer.produce(self.topic, json.dumps(record).encode())
        if self.producer.flush(30):
            raise RuntimeError("recording not acknowledged by Kafka")

    def on_rollback(self, scn: int) -> Result:
        self.started = None
        return super().on_rollback(scn)

    def close(self) -> None:
        self.producer.flush(10)
