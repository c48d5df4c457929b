"""The consumer runtime: relay puller, bootstrap puller and dispatcher (what consumer pods run).

Kafka is the relay: one timeline per topic-partition, each with a Databus checkpoint in the
ConfigMap plus `kafka_next_offset`, the offset to resume from. An instance consumes a timeline only
while it holds the timeline's Lease (`ownership`), and claims it in the ConfigMap before it reads
the checkpoint (`checkpoint_store`); it looks at who should own what every OWNERSHIP_CHECK_SECONDS,
so instances come and go without a restart. A timeline taken either resumes from its checkpoint,
or (no checkpoint) starts as `startPosition` says. A
checkpoint whose offset Kafka no longer holds means the consumer fell off the relay: it
bootstraps from the store, or stops with RelayFallOff when there is no store — offsets are
never reset silently (auto.offset.reset=error).

Windows are source transactions (or single records). A window is dispatched whole; only after
the sink applied it and `on_checkpoint` agreed does the timeline's checkpoint move, so a
persisted checkpoint is never ahead of the sink. A failed window is rolled back: the relay is
sought back to the last checkpoint and the window is read and dispatched again, with a growing
pause, until the retries run out.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pymongo import MongoClient
from pymongo.errors import ConnectionFailure

from fibers import failpoints, lineage, termination
from fibers.api import API_VERSION
from fibers.databus import sinks
from fibers.databus.callbacks import Callback, Result, Singles, bootstrap_page, call, end_batch, window_dispatcher
from fibers.databus.checkpoint import (
    Checkpoint,
    Checkpoints,
    ConsumptionMode,
    parse_timeline_key,
    progressed,
    timeline_key,
)
from fibers.databus.checkpoint_store import CheckpointStore, StoreUnavailable
from fibers.databus.config import ConsumerConfig
from fibers.databus.driver import CallbackDriver, CallbackTimeout
from fibers.databus.events import ChangeEvent, MalformedEvent, Parser, decode, parse_json
from fibers.databus.ownership import Leases, Members, lease_name, owned_keys
from fibers.databus.store import BootstrapStore
from fibers.databus.telemetry import SinkFigures, Snapshot, Telemetry, Timeline
from fibers.databus.tuning import (
    BATCH_RECORDS,
    BOOTSTRAP_PAGE_ROWS,
    IDLE_WAIT_SECONDS,
    KAFKA_CONSUMER,
    MAX_RETRY_PAUSE_SECONDS,
    OWNERSHIP_CHECK_SECONDS,
    QUIET_SECONDS,
    TAKE_RETRIES,
    TRANSIENT_RETRY_BASE_SECONDS,
    TRANSIENT_RETRY_CAP_SECONDS,
)
from fibers.databus.undecodable import UndecodablePolicy
from fibers.kubeapi import Api, ApiError, Unreachable
from fibers.redact import redact
from fibers.wire import AvroDecoder, Registry, RegistryUnavailable

log = logging.getLogger("fibers.databus")
NEXT_OFFSET = "kafka_next_offset"
UNDECODABLE_EXIT = 6  # the exit code of a consumer stopped on a record it cannot decode (spec.onUndecodable: fail)
SNAPSHOT_LAST_KEY = "fibers_snapshot_last_key"
CATCHUP_LAST_ID = "fibers_catchup_last_id"


def _kafka_transport_error(message: str) -> KafkaException:
    """What a poll raises when the broker is away, for the kafka.poll failpoint."""
    return KafkaException(KafkaError(KafkaError._TRANSPORT, message, retriable=True))


def next_offset(cp: Checkpoint | None) -> int | None:
    """The Kafka offset a timeline resumes from, kept in its checkpoint next to the SCNs."""
    value = cp.get(NEXT_OFFSET) if cp is not None else None
    return value if isinstance(value, int) else None


class BootstrapInterrupted(Exception):
    """A bootstrap stopped between pages: the consumer is stopping, or no longer owns its timelines."""


class _StoppedWaiting(Exception):
    """A stop request came while the consumer waited for a server: it ends cleanly, without a checkpoint."""


class ConsumerStopped(Exception):
    """The consumer cannot go on; the message says why (exit code in `code`)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class BatchOutcome:
    """What the callback thread did with a batch of windows."""

    applied: list[list[ChangeEvent]] = field(default_factory=list)  # windows dispatched successfully, in order
    pending: list[list[ChangeEvent]] = field(default_factory=list)  # from the failed window on (to read again)
    last: dict[tuple[str, int], ChangeEvent] = field(default_factory=dict)  # per timeline, to checkpoint at
    force: bool = False  # a callback asked for CHECKPOINT: write now, ignoring the throttle
    error: BaseException | None = None  # what stopped the batch (the window `failed`)

    @property
    def failed(self) -> list[ChangeEvent]:
        """The window that failed: the first pending one (of a Singles run, its first record)."""
        first = self.pending[0]
        return [first[0]] if first.__class__ is Singles else first

    @classmethod
    def of(
        cls, windows: list[list[ChangeEvent]], results: list[Result], error: BaseException | None, timelines: int
    ) -> BatchOutcome:
        """Split the batch where the results end (inside a Singles run, if that is where a record failed)
        and find each timeline's last window to checkpoint at, walking back only until every timeline has one."""
        applied, pending, position = windows, [], 0
        for index, window in enumerate(windows):
            size = len(window) if window.__class__ is Singles else 1
            if position + size > len(results):
                cut = len(results) - position
                applied = [*windows[:index], *([Singles(window[:cut])] if cut else [])]
                pending = [Singles(window[cut:]) if cut else window, *windows[index + 1 :]]
                break
            position += size
        last: dict[tuple[str, int], ChangeEvent] = {}
        for event, result in _window_ends_backwards(applied, results):
            if result is not Result.SKIP_CHECKPOINT:
                last.setdefault((event.topic, event.partition), event)
                if len(last) >= timelines:
                    break
        return cls(applied, pending, last, Result.CHECKPOINT in results, error)


def _window_starts(windows: list[list[ChangeEvent]]) -> Iterator[ChangeEvent]:
    """Each window's first event (of a Singles run, every event: each is a window of its own)."""
    for window in windows:
        if window.__class__ is Singles:
            yield from window
        else:
            yield window[0]


def _window_ends_backwards(
    windows: list[list[ChangeEvent]], results: list[Result]
) -> Iterator[tuple[ChangeEvent, Result]]:
    """Each window's last event with the window's result, the last window first."""
    index = len(results)
    for window in reversed(windows):
        if window.__class__ is Singles:
            for event in reversed(window):
                index -= 1
                yield event, results[index]
        else:
            index -= 1
            yield window[-1], results[index]


class SinkFailed(Exception):
    """One of several sinks failed a window: every sink is rolled back to the same checkpoint."""

    def __init__(self, sink: str, error: BaseException) -> None:
        super().__init__(f"sink {sink}: {error}")
        self.sink, self.error = sink, error


@dataclass(slots=True)
class SinkStats:
    """What one callback did, for the consumer's status (summed over instances by the operator)."""

    windows: int = 0
    errors: int = 0
    timeouts: int = 0
    last_batch_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "windows": self.windows,
            "errors": self.errors,
            "timeouts": self.timeouts,
            "lastBatchSeconds": round(self.last_batch_seconds, 4),
        }


def _stricter(a: Result, b: Result) -> Result:
    """Two callbacks' results for one window: skipping a checkpoint wins, then asking for one."""
    for result in (Result.SKIP_CHECKPOINT, Result.CHECKPOINT):
        if result in (a, b):
            return result
    return Result.SUCCESS


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
        self.members = members or Members.fixed(config.name, config.instance, config.instances)
        if callback is not None:
            self.callbacks, self.sink_names = [callback], ["callback"]
        else:
            self.callbacks = [sinks.build(sink, config.bootstrap_servers) for sink in config.sinks]
            self.sink_names = [str(sink["name"]) for sink in config.sinks]
        self.sink_stats = [SinkStats() for _ in self.callbacks]
        self._parse: Parser = parse_json
        if config.registry_url:  # Avro values: each record's writer schema from the registry, fetched once per id
            self._parse = AvroDecoder(Registry(config.registry_url))
        self.store = CheckpointStore(
            api,
            config.namespace,
            config.checkpoint_config_map,
            config.topics,
            instance=self.members.ordinal,
            min_interval=config.checkpoint_min_interval,
            labels=config.labels,
        )
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
        self.store.stats_source = self._stats
        self.checkpoints: dict[str, Checkpoint] = {}
        self.events_processed = 0
        self.stopping = False
        self._stop = threading.Event()  # set with `stopping`: pauses end early when the consumer stops
        self.store.stopping = lambda: self.stopping
        self.store.pause = self._stop.wait  # a stop request cuts the store's waits short
        self.undecodable = UndecodablePolicy(config.on_undecodable, config.dead_letter_topic, config.bootstrap_servers)
        # One thread per callback, for relay windows and bootstrap pages alike.
        self.driver = CallbackDriver(len(self.callbacks), config.callback_timeout)
        self._dispatchers = [window_dispatcher(callback) for callback in self.callbacks]
        uid = config.labels.get("fibers.dev/consumer-uid")
        owner = {"apiVersion": API_VERSION, "kind": "DatabusConsumer", "name": config.name, "uid": uid} if uid else None
        self.leases = Leases(api, config.namespace, self.members.holder, labels=config.labels, owner=owner)
        self.partitions: dict[str, list[int]] = {}  # every partition of each relay topic
        self.held: dict[str, tuple[str, int]] = {}  # timeline key → (topic, partition) consumed here now
        self._next_look = 0.0  # when (monotonic) the relay loop next looks at ownership
        self._take_failures = 0  # looks in a row that could not start the timelines they took
        self.rollbacks = {"online": 0, "bootstrap": 0}  # windows / pages rolled back, for the metrics
        self.attempt = 0  # the attempt the failing window or page is at (0: the last one went through)
        self.lags: dict[str, int] = {}  # timeline key → records after its checkpoint, as last measured
        self.telemetry = Telemetry(config.name, self.snapshot) if telemetry else None
        self._sink_timers = [self.telemetry.sink_timer(n) for n in self.sink_names] if self.telemetry else None

    # ----- plumbing ------------------------------------------------------------------------------

    def _all_partitions(self, topic: str) -> list[int]:
        metadata = self.consumer.list_topics(topic, timeout=30)
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            raise ConsumerStopped(f"relay topic {topic} does not exist (yet)", code=4)
        return sorted(info.partitions)

    def _low_watermark(self, topic: str, partition: int) -> int:
        low, _ = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        return int(low)

    def _save(self, keys: list[str], force: bool = False) -> None:
        self.store.save({k: self.checkpoints[k] for k in keys}, force=force)

    def _stats(self) -> dict[str, Any]:
        """Figures the operator mirrors into status; computed only when a checkpoint is written."""
        return {
            "eventsProcessed": self.events_processed,
            "mode": self._mode(),
            "lag": self._lag(),
            "sinks": [
                {"name": name, **stats.as_dict()} for name, stats in zip(self.sink_names, self.sink_stats, strict=True)
            ],  # a list: the stats are stored with sorted keys, and the sinks keep the spec's order
            "undecodable": dict(self.undecodable.counts),
        }

    def snapshot(self) -> Snapshot:
        """The figures a scrape reports. Runs on the metrics server's thread, so it never calls the Kafka
        consumer (a call beside the relay loop's `consume` blocks) and reads copies of what the relay loop
        changes (each dict copied in one step under the GIL)."""
        written, lags = dict(self.store.written), self.lags
        timelines = [Timeline(*timeline, lags.get(key), written.get(key)) for key, timeline in list(self.held.items())]
        return Snapshot(
            events=self.events_processed,
            mode=self._mode(),
            sinks=[
                SinkFigures(name, stats.windows, stats.errors, stats.timeouts)
                for name, stats in zip(self.sink_names, self.sink_stats, strict=True)
            ],
            timelines=timelines,
            checkpoint_writes=self.store.writes,
            rollbacks=dict(self.rollbacks),
            attempt=self.attempt,
            undecodable=dict(self.undecodable.counts),
            api_waiting_since=self.store.waiting_since,
        )

    def _hook(self, name: str, *args: Any) -> None:
        """Call a start or stop hook of every callback, each on its thread; any failure stops the consumer."""
        self.driver.all(lambda i: call(getattr(self.callbacks[i], name), *args))

    def _tell(self, name: str, *args: Any) -> None:
        """Tell every callback of a failure (on_error, on_rollback and their bootstrap twins)."""
        for callback in self.callbacks:
            getattr(callback, name)(*args)

    def _mode(self) -> str:
        # list(): copied in one step, as the metrics server's thread asks too (`snapshot`).
        modes = {cp.consumption_mode.value for cp in progressed(list(self.checkpoints.values()))}
        for mode in ("BOOTSTRAP_SNAPSHOT", "BOOTSTRAP_CATCHUP", "ONLINE_CONSUMPTION"):
            if mode in modes:
                return mode
        return "INIT"

    def _lag(self) -> int:
        """Measure each timeline's lag from librdkafka's cached high watermarks (no request) into `lags`,
        and return their sum. Only the relay loop's thread may call the Kafka consumer: a scrape reads
        `lags`, measured again at every checkpoint write and every ownership look (once a second)."""
        lags = {}
        for key, cp in self.checkpoints.items():
            resume = next_offset(cp)
            if resume is not None:
                topic, partition = parse_timeline_key(key)
                _, high = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
                if high >= 0:
                    lags[key] = max(int(high) - resume, 0)
        self.lags = lags
        return sum(lags.values())

    # ----- start-up ------------------------------------------------------------------------------

    def run(self) -> int:
        if threading.current_thread() is threading.main_thread():  # embedded runs (benchmarks) stop by flag
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        emitter = self._lineage()
        if emitter:
            emitter.start(*self._datasets())
        try:
            self.store.load()  # a malformed checkpoint stops the consumer here, before anything is taken
            self.partitions = {topic: self._all_partitions(topic) for topic in self.config.topics}
            self._hook("on_start_consumption")
            self.leases.start()
            self._look()
            self._consume()
        except (StoreUnavailable, _StoppedWaiting) as exc:  # asked to stop while a server was away: a normal end
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
            facet = lineage.IngestionRunFacet(kind="DatabusConsumer", rowsIn=self.events_processed)
            emitter.complete(*self._datasets(), facet)
        return 0

    def _lineage(self) -> lineage.Emitter | None:
        """This instance's run (one per process) in OpenLineage terms, when the operator reports lineage."""
        raw = self.config.lineage
        if not raw:
            return None
        return lineage.Emitter(lineage.Settings.from_dict({**raw, "runId": str(uuid.uuid4())}))

    def _datasets(self) -> tuple[list[lineage.DatasetRef], list[lineage.DatasetRef]]:
        bootstrap = self.config.bootstrap_servers
        producers = self.config.producers
        inputs = [
            lineage.kafka(bootstrap, t, None, lineage.Producer.from_dict(producers.get(t))) for t in self.config.topics
        ]
        outputs: list[lineage.DatasetRef] = []
        for sink in self.config.sinks:
            if sink["type"] in ("mongodb", "history"):
                uri = os.environ.get(sink.get("uriEnv", ""), "")
                outputs.append(lineage.mongodb(uri, sink["database"], sink["collection"], self.events_processed))
            elif sink["type"] == "kafka":
                outputs.append(lineage.kafka(bootstrap, sink["topic"], self.events_processed))
        return inputs, outputs

    def _on_signal(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Ask the consumer to stop (a signal, or an embedding caller): it ends at the next window or page."""
        self.stopping = True
        self._stop.set()

    # ----- ownership: which timelines this instance consumes -----------------------------------------

    def _look(self) -> set[tuple[str, int]]:
        """Drop what is lost, give up what another instance should consume, take what is ours and free.

        Returns the timelines no longer consumed here (their unread window is dropped by the caller).
        """
        self._next_look = time.monotonic() + OWNERSHIP_CHECK_SECONDS
        gone = {self.held[k] for k in self.leases.overdue() | self.store.fenced if k in self.held}
        for timeline in gone:
            self._let_go(timeline, release=False)
        self.store.fenced.clear()
        try:
            replicas = self.members.replicas()
        except Exception as exc:  # the API server is away: keep what we hold, take nothing new
            log.warning("could not read the number of instances", extra={"error": self._masked(exc)})
            return gone
        wanted = owned_keys(self.partitions, replicas, self.members.ordinal)
        giving = [self.held[k] for k in self.held if k not in wanted]
        taken: list[tuple[str, int]] = []
        stored = Checkpoints(self.config.topics)
        try:
            if giving:
                self.store.flush()  # the next owner starts from our last window, not an older one
                for timeline in giving:
                    self._let_go(timeline, release=True)
                gone.update(giving)
            for key, timeline in wanted.items():
                if key not in self.held and self.leases.take(key, self._lease(*timeline)):
                    _, stored = self.store.claim(key)
                    taken.append(timeline)
        except (ApiError, Unreachable) as exc:  # try again at the next look; what is held stays held
            log.warning("could not hand partitions over", extra={"error": self._masked(exc)})
        if taken:
            try:
                self._take(taken, stored)
                self._take_failures = 0
            except (KafkaException, ConnectionFailure) as exc:  # a server away: taken again at the next look
                self._take_failures += 1
                if self._take_failures > TAKE_RETRIES:  # away for good, or a wrong address: say so (exit)
                    raise
                log.warning(
                    "could not start the timelines taken; again at the next look",
                    extra={"error": self._masked(exc), "attempt": self._take_failures},
                )
                for timeline in taken:
                    self._drop(timeline_key(*timeline))
        return gone

    def _masked(self, error: BaseException) -> str:
        """An error as logged: pymongo names what it took for a host, which a URI that is not one (a password
        where the URI belongs) makes a secret; URL credentials and the configured URIs are masked."""
        return redact(str(error), self.config.secrets())

    def _lease(self, topic: str, partition: int) -> str:
        return lease_name(self.config.name, topic, partition)

    def _let_go(self, timeline: tuple[str, int], *, release: bool) -> None:
        key = timeline_key(*timeline)
        self.consumer.incremental_unassign([TopicPartition(*timeline)])
        self.held.pop(key, None)
        self.checkpoints.pop(key, None)
        self.store.forget(key)
        if release:
            self.leases.release(key)
        else:
            self.leases.forget(key)
        log.info("timeline given up" if release else "timeline lost", extra={"timeline": key})

    def _take(self, timelines: list[tuple[str, int]], stored: Checkpoints) -> None:
        """Start consuming timelines just claimed: from their checkpoints, or as startPosition says,
        bootstrapping first where a checkpoint says a bootstrap is under way or the relay no longer
        holds its offset."""
        assignments = []
        for topic in self.config.topics:
            partitions = [p for t, p in timelines if t == topic]
            if not partitions:
                continue
            keys = [timeline_key(topic, p) for p in partitions]
            for key in keys:
                if key in stored:
                    self.checkpoints[key] = stored[key]
            bootstraps = self._bootstraps(topic, partitions, stored)
            booting = {p for group, _ in bootstraps for p in group}
            # Before any bootstrap: "latest" is the end as of now, not once the other partitions' bootstraps are done.
            self._resolve_starts(topic, [p for p in partitions if p not in booting])
            for group, reason in bootstraps:
                try:
                    self._bootstrap(topic, group, reason=reason)
                except BootstrapInterrupted as exc:
                    log.warning("bootstrap interrupted", extra={"topic": topic, "why": str(exc)})
                    if self.stopping:
                        return  # what is held is written and released by the shutdown
                    for partition in group:
                        self._drop(timeline_key(topic, partition))
                    partitions = [p for p in partitions if p not in group]
            self._resolve_starts(topic, partitions)  # a bootstrap ends with a position: none is left, unless it did not
            for partition in partitions:
                resume = next_offset(self.checkpoints.get(timeline_key(topic, partition)))
                assert resume is not None  # every partition has a position by now (_resolve_starts)
                assignments.append(TopicPartition(topic, partition, resume))
        if self.stopping:
            return
        self.consumer.incremental_assign(assignments)
        self.held.update({timeline_key(tp.topic, tp.partition): (tp.topic, tp.partition) for tp in assignments})
        log.info("consuming", extra={"timelines": [f"{tp.topic}/{tp.partition}@{tp.offset}" for tp in assignments]})

    def _resolve_starts(self, topic: str, partitions: list[int]) -> None:
        """Give the partitions with no position one, as startPosition says, and write it at once, before anything
        is read: "latest" is the end of the partition now, "earliest" (and a bootstrap's online partitions) the
        first offset Kafka keeps. Resolved once, ever: a restart resumes from it like from any checkpoint."""
        resolved = []
        for partition in partitions:
            key = timeline_key(topic, partition)
            if next_offset(self.checkpoints.get(key)) is None:
                low, high = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
                offset = int(high if self.config.start_position == "latest" else low)
                self.checkpoints[key] = self.checkpoints.get(key, Checkpoint.initial()).with_values(
                    {NEXT_OFFSET: offset}
                )
                resolved.append(key)
        if resolved:
            self._save(resolved, force=True)

    def _drop(self, key: str) -> None:
        """Forget a timeline taken but not consumed (its Lease lost, or a server away while it was being
        started): the next owner, or this instance at its next look, takes it again from its checkpoint."""
        self.checkpoints.pop(key, None)
        self.store.forget(key)
        self.leases.forget(key)

    def _still_ours(self, keys: list[str]) -> None:
        """Between bootstrap pages: stop when the consumer stops, or when a timeline's Lease is lost or a
        newer owner fenced it (the pages go on only while nobody else may deliver them)."""
        if self.stopping:
            raise BootstrapInterrupted("the consumer is stopping")
        lost = (self.leases.overdue() | self.store.fenced) & set(keys)
        if lost:
            raise BootstrapInterrupted(f"no longer the owner of {', '.join(sorted(lost))}")

    def _bootstraps(self, topic: str, partitions: list[int], stored: Checkpoints) -> list[tuple[list[int], str]]:
        """The bootstraps to run before these partitions of `topic` go online: (partitions, why) each.

        Partitions whose checkpoints record the same interrupted bootstrap resume it together (one
        instance may take partitions from two earlier owners, each bootstrapping its own set).
        """
        keys = {p: timeline_key(topic, p) for p in partitions}
        interrupted: dict[str, list[int]] = {}
        for p, key in keys.items():
            cp = self.checkpoints.get(key)
            if cp and cp.consumption_mode in (ConsumptionMode.BOOTSTRAP_SNAPSHOT, ConsumptionMode.BOOTSTRAP_CATCHUP):
                interrupted.setdefault(cp.to_json(), []).append(p)
        if interrupted:
            return [(group, "resuming an interrupted bootstrap") for group in interrupted.values()]
        if self._fell_off(topic, partitions):
            return [(partitions, "fell off the relay")]
        # No checkpoint: bootstrap, unless the topic is consumed online already (another partition's
        # checkpoint says so): then this partition has had no changes yet and starts at the relay's start.
        fresh = [p for p, key in keys.items() if key not in self.checkpoints]
        online = any(
            parse_timeline_key(k)[0] == topic and cp.consumption_mode is ConsumptionMode.ONLINE_CONSUMPTION
            for k, cp in stored.items()
        )
        if fresh and self.config.start_position == "bootstrap" and not online:
            return [(fresh, "no checkpoint (startPosition: bootstrap)")]
        return []

    def _fell_off(self, topic: str, partitions: list[int]) -> bool:
        for partition in partitions:
            resume = next_offset(self.checkpoints.get(timeline_key(topic, partition)))
            if resume is None:
                continue
            low = self._low_watermark(topic, partition)
            if resume < low:
                if not self.config.bootstrap:
                    raise ConsumerStopped(
                        f"RelayFallOff: {topic}/{partition} resumes at offset {resume} but Kafka only keeps "
                        f"offsets from {low}; configure a bootstrap store or "
                        "seek explicitly",
                        code=5,
                    )
                log.warning("fell off the relay", extra={"topic": topic, "partition": partition, "next_offset": resume})
                return True
        return False

    # ----- bootstrap: snapshot → catchup → online -------------------------------------------------

    def _bootstrap(self, topic: str, partitions: list[int], *, reason: str) -> None:
        if not self.config.bootstrap:
            raise ConsumerStopped(f"cannot bootstrap {topic} ({reason}): no bootstrap store configured", code=5)
        uri = os.environ.get(self.config.bootstrap["uriEnv"], "")
        mongo: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=10000)
        store = BootstrapStore(mongo[self.config.bootstrap["database"]])
        keys = [timeline_key(topic, p) for p in partitions]
        log.info("bootstrap starting", extra={"topic": topic, "reason": reason})
        try:
            cp = self._bootstrap_checkpoint(topic, keys, store, partitions)
            self._hook("on_start_bootstrap")
            if cp.consumption_mode is ConsumptionMode.BOOTSTRAP_SNAPSHOT:
                cp = self._snapshot(topic, partitions, keys, store, cp)
            cp = self._catchup(topic, partitions, keys, store, cp)
            self._hook("on_stop_bootstrap")
        finally:
            mongo.close()

    def _bootstrap_checkpoint(
        self, topic: str, keys: list[str], store: BootstrapStore, partitions: list[int]
    ) -> Checkpoint:
        current = self.checkpoints.get(keys[0])
        if current and current.consumption_mode in (
            ConsumptionMode.BOOTSTRAP_SNAPSHOT,
            ConsumptionMode.BOOTSTRAP_CATCHUP,
        ):
            return current
        base = current if current and current.consumption_mode is ConsumptionMode.ONLINE_CONSUMPTION else None
        since = max(base.window_scn, 0) if base else 0
        applied = store.applier_state(topic, partitions)
        start = min((scn for scn, _ in applied.values()), default=0)
        cp = (base or Checkpoint.initial()).start_bootstrap(since, topic).with_start_scn(start)
        for key in keys:
            self.checkpoints[key] = cp
        self._save(keys, force=True)
        return cp

    def _deliver(self, events: list[ChangeEvent], scn: int, checkpoint: Checkpoint, keys: list[str]) -> None:
        """One bootstrap page (snapshot rows or logged changes) through the callback driver, as relay windows go.

        On ERROR, an exception or a timeout the callbacks hear `on_bootstrap_error`, then
        `on_bootstrap_rollback` with the SCN of the last bootstrap checkpoint (`checkpoint`, persisted
        after the page before), and the page is delivered again from that checkpoint after a growing
        pause — never from the start of the snapshot. Past the retries the consumer stops, naming the
        source, the phase, the SCN and the error (the termination message the resource shows).
        """
        tries = 0
        while True:
            outcomes = self.driver.each(lambda i: self._page(i, events, scn))
            if exc := self._first_failure(outcomes):  # any failure of a page rolls it back, as for windows
                tries += 1
                self.rollbacks["bootstrap"] += 1
                self.attempt = tries
                first = events[0]
                where = {"topic": first.topic, "phase": first.window, "scn": scn, "attempt": tries}
                log.warning("bootstrap page failed; rolling back", extra=where | {"error": self._masked(exc)})
                self._tell("on_bootstrap_error", exc)
                self._tell("on_bootstrap_rollback", checkpoint.window_scn)
                if tries > self.config.retries:
                    raise ConsumerStopped(
                        f"bootstrap {first.window} of {first.topic} failed at SCN {scn} {tries} times: {exc}"
                    ) from exc
                self._pause(tries)
                self._still_ours(keys)
                continue
            self.events_processed += len(events)
            self.attempt = 0
            return

    def _page(self, index: int, events: list[ChangeEvent], scn: int) -> None:
        """In callback `index`'s thread: one bootstrap page, timed like a batch of windows."""
        started = time.perf_counter()
        failpoints.hit("callback")
        if self.driver.abandoned():  # timed out before it began: the replay delivers the page
            raise CallbackTimeout("abandoned after the timeout")
        bootstrap_page(self.callbacks[index], events, scn, self.driver.abandoned)
        if self._sink_timers:
            self._sink_timers[index](time.perf_counter() - started)

    def _first_failure(self, outcomes: list[Any]) -> BaseException | None:
        """The first failure among the callbacks' outcomes (an exception, or anything else for none), named
        by its sink when there are several; every failure is counted in its sink's figures."""
        first: BaseException | None = None
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, BaseException):
                self._count_failure(index, outcome)
                first = first or self._named(index, outcome)
        return first

    def _count_failure(self, index: int, error: BaseException) -> None:
        stats = self.sink_stats[index]
        if isinstance(error, CallbackTimeout):
            stats.timeouts += 1
        else:
            stats.errors += 1

    def _named(self, index: int, error: BaseException) -> BaseException:
        return SinkFailed(self.sink_names[index], error) if len(self.callbacks) > 1 else error

    def _snapshot(
        self, topic: str, partitions: list[int], keys: list[str], store: BootstrapStore, cp: Checkpoint
    ) -> Checkpoint:
        last = cp.get(SNAPSHOT_LAST_KEY)
        delivered = max(cp.snapshot_offset, 0)

        def read(after: str | None) -> Iterator[list[dict[str, Any]]]:
            return store.snapshot_pages(topic, partitions, after, BOOTSTRAP_PAGE_ROWS)

        for rows in self._store_pages(read, last if isinstance(last, str) else None, keys):
            events = [
                ChangeEvent(
                    topic=topic,
                    partition=int(r.get("_partition", 0)),
                    offset=-1,
                    key=str(r["_id"]),
                    op="r",
                    scn=int(r["_scn"]),
                    window="snapshot",
                    after={k: v for k, v in r.items() if k not in ("_id", "_scn", "_partition")},
                )
                for r in rows
            ]
            self._deliver(events, max(e.scn for e in events), cp, keys)
            delivered += len(rows)
            last = str(rows[-1]["_id"])
            cp = cp.snapshot_progress(delivered).with_values({SNAPSHOT_LAST_KEY: last})
            self._set(keys, cp)
        cp = cp.end_snapshot_source(None)
        self._set(keys, cp, force=True)
        log.info("bootstrap snapshot done", extra={"topic": topic, "rows": delivered})
        return cp

    def _catchup(
        self, topic: str, partitions: list[int], keys: list[str], store: BootstrapStore, cp: Checkpoint
    ) -> Checkpoint:
        applied = store.applier_state(topic, partitions)
        if cp.consumption_mode is ConsumptionMode.BOOTSTRAP_SNAPSHOT:
            target = max([scn for scn, _ in applied.values()] + [cp.bootstrap_start_scn, 0])
            cp = cp.start_catchup(target, topic).with_values(
                {"fibers_target_offsets": {str(p): offset for p, (_, offset) in applied.items()}}
            )
            self._set(keys, cp, force=True)
        after = cp.get(CATCHUP_LAST_ID)
        rows_done = 0
        start, target = cp.bootstrap_start_scn, cp.bootstrap_target_scn

        def read(after: str | None) -> Iterator[list[dict[str, Any]]]:
            return store.log_pages(topic, partitions, start, target, after, BOOTSTRAP_PAGE_ROWS)

        for rows in self._store_pages(read, after if isinstance(after, str) else None, keys):
            events = [
                ChangeEvent(
                    topic=topic,
                    partition=int(r["partition"]),
                    offset=int(r["offset"]),
                    key=str(r["key"]),
                    op=str(r["op"]),
                    scn=int(r["scn"]),
                    window="catchup",
                    after=r.get("doc"),
                )
                for r in rows
            ]
            scn = max(e.scn for e in events)
            self._deliver(events, scn, cp, keys)
            rows_done += len(rows)
            after = str(rows[-1]["_id"])
            cp = cp.catchup_progress(max(scn, cp.window_scn), events[-1].offset).with_values({CATCHUP_LAST_ID: after})
            self._set(keys, cp)
        targets = cp.get("fibers_target_offsets") or {}
        online = cp.end_catchup_source(None).finish_bootstrap()
        for partition, key in zip(partitions, keys, strict=True):
            offset = int(targets.get(str(partition), -1)) + 1 if isinstance(targets, dict) else 0
            self.checkpoints[key] = online.with_values(
                {NEXT_OFFSET: offset, SNAPSHOT_LAST_KEY: None, CATCHUP_LAST_ID: None, "fibers_target_offsets": None}
            )
        self._save(keys, force=True)
        log.info(
            "bootstrap done; consuming online",
            extra={"topic": topic, "catchup_rows": rows_done, "scn": online.window_scn},
        )
        return online

    def _store_pages(
        self, read: Callable[[str | None], Iterator[list[dict[str, Any]]]], after: str | None, keys: list[str]
    ) -> Iterator[list[dict[str, Any]]]:
        """The store's pages after the _id `after`; when the store does not answer, read again from the last
        page handed out, after a growing pause (a store outage pauses a bootstrap, never ends it)."""
        attempt = 0
        while True:
            try:
                for rows in read(after):
                    attempt = 0
                    self._still_ours(keys)
                    yield rows
                    after = str(rows[-1]["_id"])
                return
            except ConnectionFailure as exc:
                attempt += 1
                log.warning(
                    "bootstrap store unreachable; reading again", extra={"attempt": attempt, "error": self._masked(exc)}
                )
                self._wait_transient(attempt)
                self._still_ours(keys)

    def _wait_transient(self, attempt: int) -> None:
        """The pause before trying a server that did not answer again: doubling, bounded, cut short by a stop."""
        exponent = min(attempt - 1, 30)  # bounded: no overflow however long the outage
        self._stop.wait(min(TRANSIENT_RETRY_BASE_SECONDS * 2**exponent, TRANSIENT_RETRY_CAP_SECONDS))

    def _set(self, keys: list[str], cp: Checkpoint, force: bool = False) -> None:
        for key in keys:
            self.checkpoints[key] = cp
        self._save(keys, force=force)

    # ----- online ------------------------------------------------------------------------------

    def _consume(self) -> None:
        window: list[ChangeEvent] = []  # the window being read; complete windows go to `ready`
        window_id: object = None  # (window id, partition, topic) of `window`
        attempts: dict[tuple[str, int, int], int] = {}
        max_events = self.config.max_window_events
        parse = self._parse
        polls_failed = 0
        while not self.stopping:
            if time.monotonic() >= self._next_look or self.leases.lost or self.store.fenced:
                gone = self._look()
                if self.telemetry:
                    self._lag()
                if window and (window[0].topic, window[0].partition) in gone:
                    window, window_id = [], None  # its next owner reads it again from the checkpoint
            try:
                messages = self._poll(waiting=bool(window))
            except KafkaException as exc:  # the broker away: the same poll again, after a pause
                if not exc.args[0].retriable():
                    raise ConsumerStopped(f"Kafka error: {exc.args[0].str()}") from None
                polls_failed += 1
                log.warning(
                    "Kafka poll failed; polling again", extra={"attempt": polls_failed, "error": self._masked(exc)}
                )
                self._wait_transient(polls_failed)
                continue
            polls_failed = 0
            ready: list[list[ChangeEvent]] = []
            singles: Singles | None = None  # the run of one-record windows at the end of `ready`
            for message in messages:  # the hot loop: keep it lean
                if (error := message.error()) is not None:
                    self._relay_error(error)
                    continue
                try:
                    event = decode(
                        message.topic(), message.partition(), message.offset(), message.key(), message.value(), parse
                    )
                except (MalformedEvent, RegistryUnavailable) as exc:
                    try:
                        event = self._undecodable(message, exc)
                    except ConsumerStopped:
                        if ready:  # the complete windows before it are applied: the checkpoint stops at the record
                            self._dispatch(ready, attempts)
                        raise
                if event is None:
                    continue
                if event.window.__class__ is int:  # a record of its own (no transaction): a whole window
                    if window:
                        ready.append(window)
                        window, window_id, singles = [], None, None
                    if singles is None:
                        singles = Singles()
                        ready.append(singles)
                    singles.append(event)
                    continue
                if (event.window, event.partition, event.topic) != window_id or len(window) >= max_events:
                    if window:
                        ready.append(window)
                        singles = None
                    window = [event]
                    window_id = (event.window, event.partition, event.topic)
                else:
                    window.append(event)
            # A transaction is complete once the relay goes quiet.
            if window and not messages:
                ready.append(window)
                window, window_id = [], None
            if ready:
                rewound = self._dispatch(ready, attempts)
                if window and (window[0].topic, window[0].partition) in rewound:
                    window, window_id = [], None  # it will be read again from the checkpoint
            if not messages and self.store.pending:
                self.store.flush()

    def _poll(self, *, waiting: bool) -> list[Any]:
        """The next records: what librdkafka has fetched already, else the next to arrive.

        Never waits for a full batch, so a lone change is handed on as soon as it arrives. With
        a transaction open (`waiting`), a short silence is taken to mean it is complete: Debezium
        writes a transaction's events together. Any: a consumed record always has topic,
        partition and offset (the stubs say Optional).
        """
        failpoints.hit("kafka.poll", _kafka_transport_error)
        messages: list[Any] = self.consumer.consume(num_messages=BATCH_RECORDS, timeout=0)
        if messages:
            return messages
        wait = QUIET_SECONDS if waiting else IDLE_WAIT_SECONDS
        first: list[Any] = self.consumer.consume(num_messages=1, timeout=wait)
        return first + self.consumer.consume(num_messages=BATCH_RECORDS - 1, timeout=0) if first else []

    def _undecodable(self, message: Any, error: Exception) -> ChangeEvent | None:
        """A record that did not decode. The registry away is waited out (the record is decoded again,
        after a growing pause); a record that cannot be decoded goes as spec.onUndecodable says: the
        consumer stops naming it (fail), or it is counted and passed (skip, deadLetter)."""
        attempt = 0
        while isinstance(error, RegistryUnavailable):
            attempt += 1
            log.warning(
                "schema registry unavailable; decoding again", extra={"attempt": attempt, "error": self._masked(error)}
            )
            self._wait_transient(attempt)
            if self.stopping:
                raise _StoppedWaiting("for the schema registry")
            try:
                return decode(
                    message.topic(), message.partition(), message.offset(), message.key(), message.value(), self._parse
                )
            except (MalformedEvent, RegistryUnavailable) as exc:
                error = exc
        if self.undecodable.passes(message, error):
            self.store.clear_stop()  # a record the last instance stopped on is passed now
        else:
            raise ConsumerStopped(
                f"UndecodableRecord: {message.topic()}/{message.partition()} offset {message.offset()}: {error} "
                "(spec.onUndecodable: fail)",
                code=UNDECODABLE_EXIT,
            )
        return None

    @staticmethod
    def _relay_error(error: KafkaError) -> None:
        if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            raise ConsumerStopped(f"RelayFallOff: {error.str()} (restart to bootstrap)", code=5)
        if not (error.retriable() or error.code() == KafkaError._PARTITION_EOF):
            raise ConsumerStopped(f"Kafka error: {error.str()}")

    def _dispatch(
        self, windows: list[list[ChangeEvent]], attempts: dict[tuple[str, int, int], int]
    ) -> set[tuple[str, int]]:
        """Dispatch complete windows in order, in one hand-off to the callback thread.

        Each window still gets its own callbacks and checkpoint decision; only the checkpoint of the
        last successful window of each timeline is computed and (throttled) persisted. When a window
        fails, the timelines with windows not yet dispatched are sought back to their checkpoints
        and read again: that is the rollback. Returns those timelines.
        """
        outcome = self._combine(windows, self.driver.each(lambda i: self._run_windows(i, windows)))
        self.events_processed += sum(map(len, outcome.applied))
        if attempts:
            for event in _window_starts(outcome.applied):
                attempts.pop((event.topic, event.partition, event.offset), None)
        for (topic, partition), event in outcome.last.items():
            key = timeline_key(topic, partition)
            previous = self.checkpoints.get(key, Checkpoint.initial())
            scn = event.scn if previous.is_flexible else max(event.scn, previous.window_scn)
            self.checkpoints[key] = previous.online(scn).with_values({NEXT_OFFSET: event.offset + 1})
        if outcome.last:
            self._save([timeline_key(*timeline) for timeline in outcome.last], force=outcome.force)
            if self.telemetry:
                self.telemetry.applied(event.ts_ms for event in outcome.last.values())
        if outcome.error is None:
            self.attempt = 0
            return set()
        self._rollback(outcome.failed, attempts, outcome.error)
        rewound: set[tuple[str, int]] = set()
        for event in _window_starts(outcome.pending):
            timeline = (event.topic, event.partition)
            if timeline not in rewound:
                rewound.add(timeline)
                resume = next_offset(self.checkpoints.get(timeline_key(*timeline)))
                self.consumer.seek(TopicPartition(*timeline, resume if resume is not None else event.offset))
        return rewound

    def _run_windows(self, index: int, windows: list[list[ChangeEvent]]) -> tuple[list[Result], BaseException | None]:
        """In callback `index`'s thread: dispatch windows until one fails; then a buffered sink writes.

        Returns a Result per window (per record of a Singles run) done, and what stopped it, if anything.
        """
        started = time.perf_counter()
        results: list[Result] = []
        error: BaseException | None = None
        dispatch = self._dispatchers[index]
        failpoints.hit("callback")
        for window in windows:
            if self.driver.abandoned():  # timed out: the rollback replays these windows; write nothing
                return [], CallbackTimeout("abandoned after the timeout")
            try:
                dispatch(window, results)
            except Exception as exc:  # any failure of a window rolls it back
                error = exc
                break
        if self.driver.abandoned():
            return [], CallbackTimeout("abandoned after the timeout")
        if results:
            try:
                end_batch(self.callbacks[index])  # a buffered sink writes the successful windows now
            except Exception as exc:  # nothing of this batch is known to be applied
                return [], exc
        stats = self.sink_stats[index]
        stats.windows += len(results)
        stats.last_batch_seconds = time.perf_counter() - started
        if self._sink_timers:
            self._sink_timers[index](stats.last_batch_seconds)
        return results, error

    def _combine(self, windows: list[list[ChangeEvent]], outcomes: list[Any]) -> BatchOutcome:
        """The batch as far as every callback got: a window counts only when all of them succeeded."""
        done = [([], o) if isinstance(o, BaseException) else o for o in outcomes]  # (results, error) each
        failure = self._first_failure([error for _, error in done])
        combined = done[0][0]
        for results, _ in done[1:]:  # zip stops at the shorter: the windows every callback got through
            combined = [_stricter(a, b) for a, b in zip(combined, results, strict=False)]
        return BatchOutcome.of(windows, combined, failure, max(len(self.held), 1))

    def _rollback(
        self, window: list[ChangeEvent], attempts: dict[tuple[str, int, int], int], exc: BaseException
    ) -> None:
        """Count the attempt, tell the callback, and pause before the replay (or give up)."""
        first = window[0]
        key = timeline_key(first.topic, first.partition)
        tries = attempts.get((first.topic, first.partition, first.offset), 0) + 1
        attempts[(first.topic, first.partition, first.offset)] = tries
        self.rollbacks["online"] += 1
        self.attempt = tries
        cp = self.checkpoints.get(key)
        log.warning(
            "window failed; rolling back",
            extra={"timeline": key, "scn": window[-1].scn, "attempt": tries, "error": self._masked(exc)},
        )
        self._tell("on_error", exc)
        self._tell("on_rollback", cp.window_scn if cp else -1)
        if tries > self.config.retries:
            raise ConsumerStopped(f"window at SCN {window[-1].scn} of {key} failed {tries} times: {exc}")
        self._pause(tries)

    def _pause(self, tries: int) -> None:
        """The pause before a replay: the callback policy's backoff, doubled per attempt, bounded."""
        self._stop.wait(min(self.config.retry_backoff * 2 ** (tries - 1), MAX_RETRY_PAUSE_SECONDS))

    def _shutdown(self) -> None:
        try:
            self.store.flush()
        except Exception:
            log.exception("could not write the last checkpoint")
        self.leases.release_all()  # after the last checkpoint: the next owner starts from it
        self.undecodable.close()
        try:
            for callback in self.callbacks:
                try:
                    callback.on_stop_consumption()
                finally:
                    callback.close()
        finally:
            self.consumer.close()
            self.driver.close()
