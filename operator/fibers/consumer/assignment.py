"""Which timelines (topic-partitions) this instance consumes: those the consumer's instances share out to
its ordinal (`ownership.owned_keys`), taken through their Leases and claimed in the checkpoint ConfigMap
before their checkpoints are read, and given up — after a last checkpoint — when another instance
should have them. Looked at every OWNERSHIP_CHECK_SECONDS, so instances come and go without a restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, TopicPartition
from pymongo.errors import ConnectionFailure

from fibers.consumer.bootstrap import Bootstrap
from fibers.consumer.checkpoint_store import CheckpointStore
from fibers.consumer.ownership import Leases, Members, lease_name, owned_keys
from fibers.consumer.positions import NEXT_OFFSET, Positions
from fibers.consumer.stops import RELAY_GONE_EXIT, BootstrapInterrupted, ConsumerStopped, Stopping
from fibers.consumer.tuning import KAFKA_METADATA_TIMEOUT_SECONDS, OWNERSHIP_CHECK_SECONDS, TAKE_RETRIES
from fibers.databus.checkpoint import Checkpoint
from fibers.databus.config import ConsumerConfig
from fibers.databus.timelines import Checkpoints, timeline_key
from fibers.kubeapi import ApiError, Unreachable
from fibers.startfrom import before_retention, offset_at, retention_message

log = logging.getLogger("fibers.consumer")
Timeline = tuple[str, int]  # (topic, partition)


class Assignment:
    def __init__(
        self,
        config: ConsumerConfig,
        consumer: Consumer,
        members: Members,
        leases: Leases,
        store: CheckpointStore,
        positions: Positions,
        bootstrap: Bootstrap,
        stopping: Stopping,
        mask: Callable[[BaseException], str],
        taken: Callable[[list[str]], None] = lambda keys: None,
    ) -> None:
        self.config, self.consumer, self.members, self.leases = config, consumer, members, leases
        self.store, self.positions, self.bootstrap, self.stopping = store, positions, bootstrap, stopping
        self._mask = mask
        self._taken = taken  # the sinks forget what they knew of these timelines' keys (SinkSet.timelines_taken)
        self.partitions: dict[str, list[int]] = {}  # every partition of each relay topic
        self.held: dict[str, Timeline] = {}  # timeline key → (topic, partition) consumed here now
        self._next_look = 0.0  # when (monotonic) the relay loop next looks at ownership
        self._take_failures = 0  # looks in a row that could not start the timelines they took

    def due(self) -> bool:
        """Time to look again, or something changed: a Lease lost, a timeline fenced by a newer owner."""
        return time.monotonic() >= self._next_look or bool(self.leases.lost) or bool(self.store.fenced)

    def look(self) -> set[Timeline]:
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
            log.warning("could not read the number of instances", extra={"error": self._mask(exc)})
            return gone
        wanted = owned_keys(self.partitions, replicas, self.members.ordinal)
        giving = [self.held[k] for k in self.held if k not in wanted]
        taken: list[Timeline] = []
        stored = Checkpoints(self.config.topics)
        try:
            if giving:
                self.store.flush()  # the next owner starts from our last window, not an older one
                for timeline in giving:
                    self._let_go(timeline, release=True)
                gone.update(giving)
            for key, timeline in wanted.items():
                if key not in self.held and self.leases.take(key, lease_name(self.config.name, *timeline)):
                    _, stored = self.store.claim(key)
                    taken.append(timeline)
        except (ApiError, Unreachable) as exc:  # try again at the next look; what is held stays held
            log.warning("could not hand partitions over", extra={"error": self._mask(exc)})
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
                    extra={"error": self._mask(exc), "attempt": self._take_failures},
                )
                for timeline in taken:
                    self._drop(timeline_key(*timeline))
        return gone

    def still_ours(self, keys: list[str]) -> None:
        """Between bootstrap pages: stop when the consumer stops, or when a timeline's Lease is lost or a
        newer owner fenced it (the pages go on only while nobody else may deliver them)."""
        if self.stopping.requested:
            raise BootstrapInterrupted("the consumer is stopping")
        lost = (self.leases.overdue() | self.store.fenced) & set(keys)
        if lost:
            raise BootstrapInterrupted(f"no longer the owner of {', '.join(sorted(lost))}")

    def _let_go(self, timeline: Timeline, *, release: bool) -> None:
        key = timeline_key(*timeline)
        self.consumer.incremental_unassign([TopicPartition(*timeline)])
        self.held.pop(key, None)
        self.positions.forget(key)
        if release:
            self.leases.release(key)
        else:
            self.leases.forget(key)
        log.info("timeline given up" if release else "timeline lost", extra={"timeline": key})

    def _take(self, timelines: list[Timeline], stored: Checkpoints) -> None:
        """Start consuming timelines just claimed: from their checkpoints, or as startPosition says,
        bootstrapping first where a checkpoint says a bootstrap is under way or the relay no longer
        holds its offset."""
        self._taken([timeline_key(*t) for t in timelines])  # another instance may have written their keys since
        assignments = []
        for topic in self.config.topics:
            partitions = [p for t, p in timelines if t == topic]
            if not partitions:
                continue
            for key in (timeline_key(topic, p) for p in partitions):
                if key in stored:
                    self._check_log(topic, key, stored[key])
                    self.positions.put(key, stored[key])
            bootstraps = self.bootstrap.plan(topic, partitions, stored)
            booting = {p for group, _ in bootstraps for p in group}
            # Before any bootstrap: "latest" is the end as of now, not once the other partitions' bootstraps are done.
            self._resolve_starts(topic, [p for p in partitions if p not in booting])
            for group, reason in bootstraps:
                try:
                    self.bootstrap.run(topic, group, reason=reason)
                except BootstrapInterrupted as exc:
                    log.warning("bootstrap interrupted", extra={"topic": topic, "why": str(exc)})
                    if self.stopping.requested:
                        return  # what is held is written and released by the shutdown
                    for partition in group:
                        self._drop(timeline_key(topic, partition))
                    partitions = [p for p in partitions if p not in group]
            self._resolve_starts(topic, partitions)  # a bootstrap ends with a position: none is left, unless it did not
            for partition in partitions:
                resume = self.positions.resume(timeline_key(topic, partition))
                assert resume is not None  # every partition has a position by now (_resolve_starts)
                assignments.append(TopicPartition(topic, partition, resume))
        if self.stopping.requested:
            return
        self.consumer.incremental_assign(assignments)
        self.held.update({timeline_key(tp.topic, tp.partition): (tp.topic, tp.partition) for tp in assignments})
        log.info("consuming", extra={"timelines": [f"{tp.topic}/{tp.partition}@{tp.offset}" for tp in assignments]})

    def _check_log(self, topic: str, key: str, cp: Checkpoint) -> None:
        """Stop (for good: no restart changes it) when `cp` was written against another Kafka log than the
        relay's now: its offsets would name other records there."""
        log_now = self.positions.logs.get(topic)
        if log_now and (changed := log_now.changed(cp)):
            raise ConsumerStopped(
                f"RelayChanged: {key}: {changed}; its offsets name other records there. Seek the consumer "
                "(spec.seek) to start over on this relay, or point it back at the Kafka it was reading",
                code=RELAY_GONE_EXIT,
            )

    def _resolve_starts(self, topic: str, partitions: list[int]) -> None:
        """Give the partitions with no position one, as startFrom says, and write it at once, before anything
        is read: "latest" is the end of the partition now, "earliest" (and a bootstrap's online partitions) the
        first offset Kafka keeps, a timestamp the first record at or after it. Resolved once, ever: a restart
        resumes from it like from any checkpoint."""
        resolved = []
        for partition in partitions:
            key = timeline_key(topic, partition)
            if self.positions.resume(key) is None:
                low, high = self.consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=KAFKA_METADATA_TIMEOUT_SECONDS
                )
                offset = self._start_offset(topic, partition, int(low), int(high))
                current = self.positions.get(key) or Checkpoint.initial()
                self.positions.put(key, current.with_values({NEXT_OFFSET: offset}))
                resolved.append(key)
        if resolved:
            self.positions.save(resolved, force=True)

    def _start_offset(self, topic: str, partition: int, low: int, high: int) -> int:
        start = self.config.start_from
        if start.timestamp_ms is None:
            return high if start.position == "latest" else low
        [found] = self.consumer.offsets_for_times(
            [TopicPartition(topic, partition, start.timestamp_ms)], timeout=KAFKA_METADATA_TIMEOUT_SECONDS
        )
        if before_retention(found.offset, low):
            message = retention_message(self.config.start_field, start.timestamp_ms, topic, partition, low)
            raise ConsumerStopped(message, code=RELAY_GONE_EXIT)
        return offset_at(found.offset, high)

    def _drop(self, key: str) -> None:
        """Forget a timeline taken but not consumed (its Lease lost, or a server away while it was being
        started): the next owner, or this instance at its next look, takes it again from its checkpoint."""
        self.positions.forget(key)
        self.leases.forget(key)
