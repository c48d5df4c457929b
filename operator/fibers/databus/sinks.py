"""Built-in sinks: each is a Callback that applies a window when the window ends.

Events are buffered per window and written at `on_end_data_event_sequence`, so a window is the
unit of work: either it is applied and then checkpointed, or it fails (ERROR) and is replayed.
Writes are idempotent, which is what makes a replay after a crash or a rollback safe.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from confluent_kafka import Producer
from pymongo import MongoClient

from fibers.databus import callbacks
from fibers.databus.callbacks import Callback, Result
from fibers.databus.events import ChangeEvent
from fibers.databus.mongo_servers import detect
from fibers.databus.store import BootstrapStore, GuardedCollection

log = logging.getLogger("fibers.databus.sink")


class WindowSink(Callback):
    """Buffers complete windows; subclasses write them in `flush`, once per dispatched batch.

    The runtime hands the callbacks several complete windows at a time and calls `on_end_batch`
    after the last one succeeded; only then may their checkpoints move. A window that fails is
    dropped from the buffer (`on_rollback`), and the windows before it are still written.
    """

    def __init__(self) -> None:
        self.window: list[ChangeEvent] = []
        self.completed: list[ChangeEvent] = []

    def on_start_data_event_sequence(self, scn: int) -> Result:
        self.window = []
        return Result.SUCCESS

    def on_data_event(self, event: ChangeEvent) -> Result:
        self.window.append(event)
        return Result.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> Result:
        self.completed.extend(self.window)
        self.window = []
        return Result.SUCCESS

    def on_rollback(self, scn: int) -> Result:
        self.window = []
        return Result.SUCCESS

    on_start_bootstrap_sequence = on_start_data_event_sequence
    on_end_bootstrap_sequence = on_end_data_event_sequence
    on_bootstrap_rollback = on_rollback

    def on_end_batch(self) -> None:
        """Write every complete window received since the last batch (raises on failure)."""
        events, self.completed = self.completed, []
        if events:
            self.flush(events)

    def flush(self, events: list[ChangeEvent]) -> None:
        raise NotImplementedError


def _mongo(uri_env: str) -> MongoClient[dict[str, Any]]:
    uri = os.environ.get(uri_env)
    if not uri:
        raise ValueError(f"environment variable {uri_env} (the MongoDB URI) is not set")
    return MongoClient(uri, serverSelectionTimeoutMS=10000)


class MongoSink(WindowSink):
    """A materialised view: one document per key, never moved back to an older SCN.

    How the writes reach the server (FerretDB's or MongoDB's way) is detected on the first flush,
    from the server the client talks to: see fibers.databus.mongo_servers.
    """

    def __init__(self, uri_env: str, database: str, collection: str) -> None:
        super().__init__()
        self.client = _mongo(uri_env)
        self.collection = GuardedCollection(self.client[database][collection])

    def flush(self, events: list[ChangeEvent]) -> None:
        self.collection.apply(events)

    def close(self) -> None:
        self.client.close()


class HistorySink(WindowSink):
    """Every event as a document of its own (a history, not a view): the record value, its key, and where it
    was in the relay. The document id is that position (topic/partition/offset), so a replayed window
    writes the same documents again instead of new ones."""

    def __init__(self, uri_env: str, database: str, collection: str) -> None:
        super().__init__()
        self.client = _mongo(uri_env)
        self.collection = self.client[database][collection]

    def flush(self, events: list[ChangeEvent]) -> None:
        from pymongo import ReplaceOne

        writes = [
            ReplaceOne(
                {"_id": f"{e.topic}/{e.partition}/{e.offset}"},
                {**(e.raw or {}), "_key": e.key, "_topic": e.topic, "_partition": e.partition, "_offset": e.offset},
                upsert=True,
            )
            for e in events
        ]
        detect(self.client).bulk_write(self.collection, writes, ordered=True)  # FerretDB v1: in bulks it can take

    def close(self) -> None:
        self.client.close()


class BootstrapStoreSink(WindowSink):
    """Fills the bootstrap store that later consumers bootstrap from."""

    def __init__(self, uri_env: str, database: str) -> None:
        super().__init__()
        self.client = _mongo(uri_env)
        self.store = BootstrapStore(self.client[database])

    def flush(self, events: list[ChangeEvent]) -> None:
        self.store.apply_window(events)

    def close(self) -> None:
        self.client.close()


class KafkaSink(WindowSink):
    """Row images as JSON to a topic, keyed by row key; a delete is a tombstone."""

    def __init__(self, bootstrap_servers: str, topic: str) -> None:
        super().__init__()
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True})

    def flush(self, events: list[ChangeEvent]) -> None:
        for event in events:
            value = None if event.document is None else json.dumps({**event.document, "_scn": event.scn})
            self.producer.produce(self.topic, key=event.key.encode(), value=value)
        if self.producer.flush(30) != 0:
            raise RuntimeError(f"could not deliver {len(events)} records to {self.topic}")

    def close(self) -> None:
        self.producer.flush(30)


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
        return MongoSink(sink["uriEnv"], sink["database"], sink["collection"])
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
