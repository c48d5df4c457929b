"""Built-in sinks: each is a Callback that applies a window when the window ends.

Events are buffered per window and written at `on_end_data_event_sequence`, so a window is the
unit of work: either it is applied and then checkpointed, or it fails (ERROR) and is replayed.
Writes are idempotent, which is what makes a replay after a crash or a rollback safe.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from pymongo import MongoClient
from pymongo.errors import AutoReconnect

from fibers.consumer import callbacks
from fibers.consumer.callbacks import Callback, WindowSink
from fibers.consumer.events import ChangeEvent
from fibers.consumer.mongo_servers import detect
from fibers.consumer.store import BootstrapStore, GuardedCollection
from fibers.consumer.tuning import KAFKA_SINK_FLUSH_SECONDS, KAFKA_SINK_QUEUE_FULL_WAIT_SECONDS
from fibers.databus.config import TOPIC
from fibers.mongodb import SELECTION_TIMEOUT_MS

log = logging.getLogger("fibers.consumer.sink")


class SinkNotDelivered(RuntimeError):
    """A sink's write was not confirmed: the window fails and is replayed from its checkpoint."""


def _mongo(uri_env: str) -> MongoClient[dict[str, Any]]:
    uri = os.environ.get(uri_env)
    if not uri:
        raise ValueError(f"environment variable {uri_env} (the MongoDB URI) is not set")
    return MongoClient(uri, serverSelectionTimeoutMS=SELECTION_TIMEOUT_MS)


class MongoSink(WindowSink):
    """A materialised view: one document per key, never moved back to an older SCN.

    How the writes reach the server (FerretDB's or MongoDB's way) is detected on the first flush,
    from the server the client talks to: see fibers.consumer.mongo_servers. A collection name with
    `{topic}` in it is each topic's own (two tables' rows of one key are two rows); without it there is
    one collection, which the configuration allows for one topic only (`fibers.databus.config`).
    """

    failpoint, failpoint_error = "mongo.write", AutoReconnect

    def __init__(self, uri_env: str, database: str, collection: str, *, reapply: bool = False) -> None:
        super().__init__()
        self.client = _mongo(uri_env)
        self.database, self.template, self.reapply = self.client[database], collection, reapply
        self.collections: dict[str, GuardedCollection] = {}  # by name, opened on a topic's first rows

    def open(self, name: str) -> GuardedCollection:
        return GuardedCollection(self.database[name], reapply=self.reapply)

    def _collection(self, topic: str) -> GuardedCollection:
        name = self.template.replace(TOPIC, topic)
        if (found := self.collections.get(name)) is None:
            found = self.collections[name] = self.open(name)
        return found

    def flush(self, events: list[ChangeEvent]) -> None:
        if TOPIC not in self.template:
            self._collection("").apply(events)
            return
        by_topic: dict[str, list[ChangeEvent]] = {}
        for event in events:
            by_topic.setdefault(event.topic, []).append(event)
        for topic, rows in by_topic.items():
            self._collection(topic).apply(rows)

    def on_timelines_taken(self, timelines: list[str]) -> callbacks.Result:
        for collection in self.collections.values():
            collection.forget()
        return callbacks.Result.SUCCESS

    def close(self) -> None:
        self.client.close()


class HistorySink(WindowSink):
    """Every event as a document of its own (a history, not a view): see `history_document`. The document
    id is the change's position, so a replayed window finds its documents written and adds nothing."""

    failpoint, failpoint_error = "mongo.write", AutoReconnect

    def __init__(self, uri_env: str, database: str, collection: str) -> None:
        super().__init__()
        self.client = _mongo(uri_env)
        self.collection = self.client[database][collection]

    def flush(self, events: list[ChangeEvent]) -> None:
        documents = [{"_id": id_, **doc} for id_, doc in map(history_document, events)]
        detect(self.client).insert_absent(self.collection, documents)

    def close(self) -> None:
        self.client.close()


def history_document(event: ChangeEvent) -> tuple[str, dict[str, Any]]:
    """(id, document) of one change in a history sink.

    A relay or catch-up change is the record value as read, keyed by where it is in the relay
    (topic/partition/offset). A snapshot row has no relay position (offset -1): it is keyed by the
    snapshot's SCN and the row key, so every row of a snapshot is kept and a replayed page writes the
    same documents. Bootstrap events carry no record value; their document is the change itself (op,
    before, after, SCN), the shape a Debezium envelope gives a relay change.
    """
    if event.offset < 0:
        id_ = f"{event.topic}/{event.partition}/snapshot@{event.scn}/{event.key}"
    else:
        id_ = f"{event.topic}/{event.partition}/{event.offset}"
    body = event.raw if event.raw is not None else {"op": event.op, "before": event.before, "after": event.after}
    return id_, {
        **body,
        "_key": event.key,
        "_scn": event.scn,
        "_topic": event.topic,
        "_partition": event.partition,
        "_offset": event.offset,
    }


class BootstrapStoreSink(WindowSink):
    """Fills the bootstrap store that later consumers bootstrap from."""

    failpoint, failpoint_error = "mongo.write", AutoReconnect

    def __init__(self, uri_env: str, database: str) -> None:
        super().__init__()
        self.client = _mongo(uri_env)
        self.store = BootstrapStore(self.client[database])

    def flush(self, events: list[ChangeEvent]) -> None:
        self.store.apply_window(events)

    def on_timelines_taken(self, timelines: list[str]) -> callbacks.Result:
        self.store.forget()
        return callbacks.Result.SUCCESS

    def close(self) -> None:
        self.client.close()


class KafkaSink(WindowSink):
    """Row images as JSON to a topic, keyed by row key; a delete is a tombstone.

    A batch counts as written only when every record's delivery was confirmed: librdkafka drops a
    record whose delivery failed (authorization, size, policy, message.timeout.ms) from its queue, so an
    empty queue after `flush` says nothing about success. The producer reports failed deliveries only
    (`delivery.report.only.error`), so a batch that goes through costs no Python call per record.
    """

    failpoint, failpoint_error = "kafka.produce", KafkaException

    def __init__(self, bootstrap_servers: str, topic: str, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.topic = topic
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap_servers,
                "enable.idempotence": True,
                "delivery.report.only.error": True,
                **(settings or {}),
            }
        )

    def flush(self, events: list[ChangeEvent]) -> None:
        # Each flush has its own list: an abandoned thread still flushing must not reset the replay's.
        failed: list[KafkaError] = []

        def report(error: KafkaError | None, _message: object) -> None:
            if error is not None:
                failed.append(error)

        for event in events:
            value = None if event.document is None else json.dumps({**event.document, "_scn": event.scn})
            self._produce(event.key.encode(), value, report)
        left = self.producer.flush(KAFKA_SINK_FLUSH_SECONDS)
        if left:
            raise SinkNotDelivered(f"{left} of {len(events)} records to {self.topic} not delivered in time")
        if failed:
            raise SinkNotDelivered(
                f"{len(failed)} of {len(events)} records to {self.topic} not delivered: {failed[0].str()}"
            )

    def _produce(self, key: bytes, value: str | None, report: Callable[[KafkaError | None, object], None]) -> None:
        """Queue one record; when librdkafka's queue is full, serve deliveries until there is room."""
        while True:
            try:
                self.producer.produce(self.topic, key=key, value=value, on_delivery=report)
                return
            except BufferError:
                self.producer.poll(KAFKA_SINK_QUEUE_FULL_WAIT_SECONDS)

    def close(self) -> None:
        self.producer.flush(KAFKA_SINK_FLUSH_SECONDS)


class LogSink(WindowSink):
    """Logs each window (and every event at debug level); `quiet` only counts."""

    def __init__(self, quiet: bool = False) -> None:
        super().__init__()
        self.quiet = quiet
        self.events = 0

    def flush(self, events: list[ChangeEvent]) -> None:
        self.events += len(events)
        if not self.quiet and events:
            log.info("window applied", extra={"events": len(events), "scn": events[-1].scn})


def build(sink: dict[str, Any], kafka_bootstrap: str | None) -> Callback:
    """The sink named by the rendered config (see fibers.databus.config)."""
    kind = sink["type"]
    if kind == "mongodb":
        return MongoSink(sink["uriEnv"], sink["database"], sink["collection"], reapply=bool(sink.get("reapply")))
    if kind == "history":
        return HistorySink(sink["uriEnv"], sink["database"], sink["collection"])
    if kind == "bootstrap":
        return BootstrapStoreSink(sink["uriEnv"], sink["database"])
    if kind == "kafka":
        if not kafka_bootstrap:
            raise ValueError("a kafka sink needs the relay's bootstrap servers")
        return KafkaSink(kafka_bootstrap, sink["topic"])
    if kind == "log":
        return LogSink(quiet=bool(sink.get("quiet")))
    if kind == "callback":
        options: dict[str, Any] = dict(sink.get("options") or {})
        if sink.get("uriEnv"):  # the sink's uriSecretRef, from the pod's environment (never from the spec)
            options["uri"] = os.environ.get(sink["uriEnv"], "")
        return callbacks.load(sink["callback"], options)
    raise ValueError(f"unknown sink type {kind!r}")
