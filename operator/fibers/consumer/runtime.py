"""The consumer runtime, what a consumer pod runs: it wires the pieces of the Databus 2.0 client together,
runs them, and reports on them.

Kafka is the relay: one timeline per topic-partition, each with a Databus checkpoint in the
ConfigMap plus `kafka_next_offset`, the offset to resume from (`positions`). An instance consumes a
timeline only while it holds the timeline's Lease, and claims it in the ConfigMap before it reads
the checkpoint (`assignment`). A timeline taken either resumes from its checkpoint, or (no
checkpoint) starts as `startPosition` says; a checkpoint whose offset Kafka no longer holds means
the consumer fell off the relay: it bootstraps from the store (`bootstrap`), or stops with
RelayFallOff when there is no store — offsets are never reset silently (auto.offset.reset=error).
Records are cut into windows and dispatched to the sinks (`relay`, `sinkset`); a persisted
checkpoint is never ahead of what every sink applied.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from fibers import failpoints, lineage, termination
from fibers.api import API_VERSION
from fibers.consumer import relay_log
from fibers.consumer import sinks as built_in
from fibers.consumer.assignment import Assignment
from fibers.consumer.batches import Progress
from fibers.consumer.bootstrap import Bootstrap
from fibers.consumer.callbacks import Callback
from fibers.consumer.checkpoint_store import CheckpointStore, StoreUnavailable
from fibers.consumer.events import Parser, parse_json
from fibers.consumer.ownership import Leases, Members
from fibers.consumer.positions import Positions, next_offset
from fibers.consumer.relay import Relay
from fibers.consumer.sinkset import SinkSet
from fibers.consumer.stops import ConsumerStopped, StoppedWaiting, Stopping
from fibers.consumer.telemetry import SinkFigures, Snapshot, Telemetry, Timeline
from fibers.consumer.tuning import KAFKA_CONSUMER, KAFKA_METADATA_TIMEOUT_SECONDS
from fibers.consumer.undecodable import UndecodablePolicy
from fibers.databus.config import TOPIC, ConsumerConfig
from fibers.databus.timelines import parse_timeline_key
from fibers.kubeapi import Api
from fibers.redact import redact
from fibers.wire import AvroDecoder, Registry

log = logging.getLogger("fibers.consumer")


class Runtime:
    def __init__(
        self,
        config: ConsumerConfig,
        api: Api,
        callback: Callback | None = None,
        members: Members | None = None,
        *,
        telemetry: bool = False,
    ) -> None:
        """`callback`: one given by the caller (tests, benchmarks) instead of the configured sinks;
        `members`: this instance's place among the consumer's pods (default: the configuration's);
        `telemetry`: keep the metrics a pod serves (`self.telemetry`, served by `fibers consume`)."""
        self.config = config
        members = members or Members.fixed(config.name, config.instance, config.instances)
        if callback is not None:
            callbacks, names = [callback], ["callback"]
        else:
            callbacks = [built_in.build(sink, config.bootstrap_servers) for sink in config.sinks]
            names = [str(sink["name"]) for sink in config.sinks]
        # One thread per callback, for relay windows and bootstrap pages alike.
        self.sinks = SinkSet(callbacks, names, config.callback_timeout)
        parse: Parser = parse_json
        if config.registry_url:  # Avro values: each record's writer schema from the registry, fetched once per id
            parse = AvroDecoder(Registry(config.registry_url))
        self.stopping = Stopping()
        self.store = CheckpointStore(
            api,
            config.namespace,
            config.checkpoint_config_map,
            config.topics,
            instance=members.ordinal,
            min_interval=config.checkpoint_min_interval,
            labels=config.labels,
        )
        self.store.stats_source = self._stats
        self.store.stopping = lambda: self.stopping.requested
        self.store.pause = self.stopping.wait  # a stop request cuts the store's waits short
        self.consumer = Consumer(
            {
                "bootstrap.servers": config.bootstrap_servers,
                "group.id": f"fibers-{config.namespace}-{config.name}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "error",  # falling off the relay must be seen, not papered over
                "enable.partition.eof": False,
                **KAFKA_CONSUMER,
            }
        )
        self.positions = Positions(self.store)
        self.progress = Progress()
        self.undecodable = UndecodablePolicy(config.on_undecodable, config.dead_letter_topic, config.bootstrap_servers)
        uid = config.labels.get("fibers.dev/consumer-uid")
        owner = {"apiVersion": API_VERSION, "kind": "DatabusConsumer", "name": config.name, "uid": uid} if uid else None
        self.leases = Leases(api, config.namespace, members.holder, labels=config.labels, owner=owner)
        self.lags: dict[str, int] = {}  # timeline key → records after its checkpoint, as last measured
        # What the run waits for before it can consume (said on /ready), "" once it runs: not ready before then.
        self.waiting_for = "looking up its relay topics"
        self.telemetry = Telemetry(config.name, self.snapshot) if telemetry else None
        if self.telemetry:
            self.sinks.timers = [self.telemetry.sink_timer(name) for name in names]
        bootstrap = Bootstrap(
            config,
            self.positions,
            self.sinks,
            self.progress,
            self.stopping,
            low_watermark=self._low_watermark,
            still_ours=lambda keys: self.assignment.still_ours(keys),
            mask=self._masked,
        )
        self.assignment = Assignment(
            config,
            self.consumer,
            members,
            self.leases,
            self.store,
            self.positions,
            bootstrap,
            self.stopping,
            self._masked,
            taken=self.sinks.timelines_taken,
        )
        self.relay = Relay(
            config,
            self.consumer,
            parse,
            self.assignment,
            self.sinks,
            self.positions,
            self.progress,
            self.stopping,
            store=self.store,
            undecodable=self.undecodable,
            looked=self._lag if self.telemetry else lambda: None,
            applied=self.telemetry.applied if self.telemetry else None,
            mask=self._masked,
        )

    @property
    def events_processed(self) -> int:
        return self.progress.events

    @property
    def partitions(self) -> dict[str, list[int]]:
        """Every partition of each relay topic (known once the run has started)."""
        return self.assignment.partitions

    # ----- running ---------------------------------------------------------------------------------

    def run(self) -> int:
        if threading.current_thread() is threading.main_thread():  # embedded runs (benchmarks) stop by `stop`
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        emitter = self._lineage()
        if emitter:
            emitter.start(*self._datasets())
        try:
            self.store.load()  # a malformed checkpoint stops the consumer here, before anything is taken
            self.assignment.partitions = {topic: self._relay_topic(topic) for topic in self.config.topics}
            self.waiting_for = ""
            self.sinks.hook("on_start_consumption")
            self.leases.start()
            self.assignment.look()
            self.relay.consume()
        except (StoreUnavailable, StoppedWaiting) as exc:  # asked to stop while a server was away: a normal end
            log.warning("stopped while waiting: %s (what was not checkpointed is replayed)", exc)
        except ConsumerStopped as exc:
            message = redact(str(exc), self.config.secrets())
            log.error("consumer stopped: %s", message)
            termination.write(message)
            if emitter:
                emitter.fail(*self._datasets(), message)
            return exc.code
        except Exception as exc:
            # pymongo names what it takes for a host in its errors: a URI that is not one shows whole.
            message = redact(f"{type(exc).__name__}: {exc}", self.config.secrets())
            termination.write(message)
            if emitter:
                emitter.fail(*self._datasets(), message)
            raise  # `fibers consume` prints the traceback, masked too
        finally:
            self._shutdown()
        if emitter:
            facet = lineage.IngestionRunFacet(kind="DatabusConsumer", rowsIn=self.progress.events)
            emitter.complete(*self._datasets(), facet)
        return 0

    def _on_signal(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Ask the consumer to stop (a signal, or an embedding caller): it ends at the next window or page."""
        self.stopping.request()

    def _shutdown(self) -> None:
        try:
            self.store.flush()
        except Exception:
            log.exception("could not write the last checkpoint")
        self.leases.release_all()  # after the last checkpoint: the next owner starts from it
        self.undecodable.close()
        try:
            self.sinks.close()
        finally:
            self.consumer.close()

    # ----- Kafka ------------------------------------------------------------------------------------

    def _relay_topic(self, topic: str) -> list[int]:
        """The topic's partitions, and its log in `positions.logs`, waited for while it does not exist: a
        consumer is often applied before what writes its topic (a Connect, a Transform). The instance stays
        unready meanwhile and its readiness answer says why (the operator puts it on Ready); exiting instead
        made a crash loop."""
        attempt = 0
        while True:
            try:
                failpoints.hit("relay.lookup")
                metadata = self.consumer.list_topics(topic, timeout=KAFKA_METADATA_TIMEOUT_SECONDS)
                info = metadata.topics.get(topic)
                if info is not None and info.error is None and info.partitions:
                    self.positions.logs[topic] = relay_log.RelayLog(metadata.cluster_id or "", self._topic_id(topic))
                    if attempt:
                        log.info("relay topic %s found after %d look(s)", topic, attempt)
                    return sorted(info.partitions)
                missing = f"relay topic {topic} does not exist yet"
            except KafkaException as exc:
                missing = f"Kafka does not answer for relay topic {topic}: {self._masked(exc)}"
            if not attempt or missing != self.waiting_for:
                log.warning("%s; waiting for it (the instance stays unready)", missing)
            self.waiting_for = missing
            attempt += 1
            self.stopping.transient(attempt)
            if self.stopping.requested:  # before another metadata call, which may block for its timeout
                raise StoppedWaiting(f"for relay topic {topic}")

    def _topic_id(self, topic: str) -> str:
        """The topic's id; "" when the broker does not give it (a proxy that answers metadata only): it guards
        against a topic created again under its name, and is no reason to hold consumption up."""
        try:
            return relay_log.topic_id(self.config.bootstrap_servers, topic, KAFKA_METADATA_TIMEOUT_SECONDS)
        except (KafkaException, TimeoutError) as exc:
            log.warning(
                "could not read the id of relay topic %s (a topic created again under its name goes unnoticed): %s",
                topic,
                self._masked(exc),
            )
            return ""

    def _low_watermark(self, topic: str, partition: int) -> int:
        low, _ = self.consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=KAFKA_METADATA_TIMEOUT_SECONDS
        )
        return int(low)

    def _masked(self, error: BaseException) -> str:
        """An error as logged: pymongo names what it took for a host, which a URI that is not one (a password
        where the URI belongs) makes a secret; URL credentials and the configured URIs are masked."""
        return redact(str(error), self.config.secrets())

    # ----- what it reports --------------------------------------------------------------------------

    def _stats(self) -> dict[str, Any]:
        """Figures the operator mirrors into status; computed only when a checkpoint is written."""
        return {
            "eventsProcessed": self.progress.events,
            "mode": self.positions.mode(),
            "lag": self._lag(),
            "sinks": self.sinks.figures(),
            "undecodable": dict(self.undecodable.counts),
        }

    def snapshot(self) -> Snapshot:
        """The figures a scrape reports. Runs on the metrics server's thread, so it never calls the Kafka
        consumer (a call beside the relay loop's `consume` blocks) and reads copies of what the relay loop
        changes (each dict copied in one step under the GIL)."""
        written, lags = dict(self.store.written), self.lags
        held = list(self.assignment.held.items())
        return Snapshot(
            events=self.progress.events,
            mode=self.positions.mode(),
            sinks=[
                SinkFigures(name, stats.windows, stats.errors, stats.timeouts)
                for name, stats in zip(self.sinks.names, self.sinks.stats, strict=True)
            ],
            timelines=[Timeline(*timeline, lags.get(key), written.get(key)) for key, timeline in held],
            checkpoint_writes=self.store.writes,
            rollbacks=dict(self.progress.rollbacks),
            attempt=self.progress.attempt,
            undecodable=dict(self.undecodable.counts),
            api_waiting_since=self.store.waiting_since,
            waiting_for=self.waiting_for,
        )

    def _lag(self) -> int:
        """Measure each timeline's lag from librdkafka's cached high watermarks (no request) into `lags`,
        and return their sum. Only the relay loop's thread may call the Kafka consumer: a scrape reads
        `lags`, measured again at every checkpoint write and every ownership look (once a second)."""
        lags = {}
        for key, cp in self.positions.checkpoints.items():
            resume = next_offset(cp)
            if resume is not None:
                topic, partition = parse_timeline_key(key)
                _, high = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
                if high >= 0:
                    lags[key] = max(int(high) - resume, 0)
        self.lags = lags
        return sum(lags.values())

    def _lineage(self) -> lineage.Emitter | None:
        """This instance's run (one per process) in OpenLineage terms, when the operator reports lineage."""
        raw = self.config.lineage
        if not raw:
            return None
        return lineage.Emitter(lineage.Settings.from_dict({**raw, "runId": str(uuid.uuid4())}))

    def _datasets(self) -> tuple[list[lineage.DatasetRef], list[lineage.DatasetRef]]:
        bootstrap, events = self.config.bootstrap_servers, self.progress.events
        producers = self.config.producers
        topics = self.config.topics
        inputs = [lineage.kafka(bootstrap, t, None, lineage.Producer.from_dict(producers.get(t))) for t in topics]
        outputs: list[lineage.DatasetRef] = []
        for sink in self.config.sinks:
            if sink["type"] in ("mongodb", "history"):
                uri, collection = os.environ.get(sink.get("uriEnv", ""), ""), str(sink["collection"])
                if sink["type"] == "mongodb" and TOPIC in collection:  # a collection per topic, rows not counted
                    outputs += [lineage.mongodb(uri, sink["database"], collection.replace(TOPIC, t)) for t in topics]
                else:
                    outputs.append(lineage.mongodb(uri, sink["database"], collection, events))
            elif sink["type"] == "kafka":
                outputs.append(lineage.kafka(bootstrap, sink["topic"], events))
        return inputs, outputs
