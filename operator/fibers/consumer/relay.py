"""The relay puller and dispatcher: records from Kafka cut into windows (source transactions, or single
records), handed to the sinks a batch at a time, and each timeline's checkpoint moved past a window only
once every sink applied it. A failed window is rolled back: its timelines are sought back to their
checkpoints and read again, after a growing pause, until the retries run out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from fibers import failpoints
from fibers.consumer.assignment import Assignment, Timeline
from fibers.consumer.batches import Progress, window_starts
from fibers.consumer.checkpoint_store import CheckpointStore
from fibers.consumer.events import ChangeEvent, MalformedEvent, Parser, batch_parser, decode
from fibers.consumer.positions import NEXT_OFFSET, Positions
from fibers.consumer.sinkset import SinkSet
from fibers.consumer.stops import RELAY_LOST_EXIT, UNDECODABLE_EXIT, ConsumerStopped, StoppedWaiting, Stopping
from fibers.consumer.tuning import BATCH_RECORDS, IDLE_WAIT_SECONDS, QUIET_SECONDS
from fibers.consumer.undecodable import UndecodablePolicy
from fibers.consumer.windows import Windows
from fibers.databus.checkpoint import Checkpoint
from fibers.databus.config import ConsumerConfig
from fibers.databus.timelines import timeline_key
from fibers.wire import RegistryUnavailable

log = logging.getLogger("fibers.consumer")
_INITIAL = Checkpoint.initial()  # where a timeline with no checkpoint yet starts (checkpoints are immutable)
Attempts = dict[tuple[str, int, int], int]  # (topic, partition, offset) of a failing window → its attempts


def _kafka_transport_error(message: str) -> KafkaException:
    """What a poll raises when the broker is away, for the kafka.poll failpoint."""
    return KafkaException(KafkaError(KafkaError._TRANSPORT, message, retriable=True))


class Relay:
    def __init__(
        self,
        config: ConsumerConfig,
        consumer: Consumer,
        parse: Parser,
        assignment: Assignment,
        sinks: SinkSet,
        positions: Positions,
        progress: Progress,
        stopping: Stopping,
        *,
        store: CheckpointStore,
        undecodable: UndecodablePolicy,
        looked: Callable[[], object],
        applied: Callable[[Iterable[int]], None] | None,
        mask: Callable[[BaseException], str],
    ) -> None:
        self.config, self.consumer, self._parse = config, consumer, parse
        self.assignment, self.sinks, self.positions, self.progress = assignment, sinks, positions, progress
        self.stopping, self.store, self.undecodable = stopping, store, undecodable
        self._looked = looked  # after each ownership look (the metrics' lag is measured then)
        self._applied = applied  # the source timestamps (ms) of windows just checkpointed, for latency
        self._mask = mask

    def consume(self) -> None:
        """Read, window and dispatch until the consumer is asked to stop."""
        windows = Windows(self.config.max_window_events, QUIET_SECONDS)  # each timeline's open window
        attempts: Attempts = {}
        polls_failed = 0
        while not self.stopping.requested:
            if self.assignment.due():
                gone = self.assignment.look()
                self._looked()
                windows.drop(gone)  # their next owner reads them again from the checkpoint
            try:
                messages = self._poll(waiting=bool(windows))
            except KafkaException as exc:  # the broker away: the same poll again, after a pause
                if not exc.args[0].retriable():
                    raise ConsumerStopped(f"Kafka error: {exc.args[0].str()}") from None
                polls_failed += 1
                log.warning(
                    "Kafka poll failed; polling again", extra={"attempt": polls_failed, "error": self._mask(exc)}
                )
                self.stopping.transient(polls_failed)
                continue
            polls_failed = 0
            ready: list[list[ChangeEvent]] = []
            events: list[ChangeEvent] = []
            values = [message.value() for message in messages]
            parse = batch_parser(values, self._parse)
            for message, value in zip(messages, values, strict=True):  # the hot loop: keep it lean
                if (error := message.error()) is not None:
                    _relay_error(error)
                    continue
                try:
                    event = decode(message.topic(), message.partition(), message.offset(), message.key(), value, parse)
                except (MalformedEvent, RegistryUnavailable) as exc:
                    try:
                        event = self._undecodable(message, exc)
                    except ConsumerStopped:
                        windows.cut(events, ready)
                        if ready:  # the complete windows before it are applied: the checkpoint stops at the record
                            self._dispatch(ready, attempts)
                        raise
                if event is not None:
                    events.append(event)
            windows.cut(events, ready)
            windows.close_quiet(time.monotonic(), ready, relay_quiet=not messages)
            if ready:
                windows.drop(self._dispatch(ready, attempts))  # rewound: read again from the checkpoint
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
                "schema registry unavailable; decoding again", extra={"attempt": attempt, "error": self._mask(error)}
            )
            self.stopping.transient(attempt)
            if self.stopping.requested:
                raise StoppedWaiting("for the schema registry")
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

    def _dispatch(self, windows: list[list[ChangeEvent]], attempts: Attempts) -> set[Timeline]:
        """Dispatch complete windows in order, in one hand-off to the callback threads.

        Each window still gets its own callbacks and checkpoint decision; only the checkpoint of the
        last successful window of each timeline is computed and (throttled) persisted. When a window
        fails, the timelines with windows not yet dispatched are sought back to their checkpoints
        and read again: that is the rollback. Returns those timelines.
        """
        outcome = self.sinks.windows(windows, max(len(self.assignment.held), 1))
        self.progress.events += sum(map(len, outcome.applied))
        if attempts:
            for event in window_starts(outcome.applied):
                attempts.pop((event.topic, event.partition, event.offset), None)
        checkpoints = self.positions.checkpoints
        keys = []
        for (topic, partition), event in outcome.last.items():
            key = timeline_key(topic, partition)
            keys.append(key)
            previous = checkpoints.get(key) or _INITIAL
            scn = event.scn if previous.is_flexible else max(event.scn, previous.window_scn)
            checkpoints[key] = previous.online(scn, values={NEXT_OFFSET: event.offset + 1})
        if keys:
            self.positions.save(keys, force=outcome.force)
            if self._applied:
                self._applied(event.ts_ms for event in outcome.last.values())
        if outcome.error is None:
            self.progress.attempt = 0
            return set()
        self._rollback(outcome.failed, attempts, outcome.error)
        rewound: set[Timeline] = set()
        for event in window_starts(outcome.pending):
            timeline = (event.topic, event.partition)
            if timeline not in rewound:
                rewound.add(timeline)
                resume = self.positions.resume(timeline_key(*timeline))
                self.consumer.seek(TopicPartition(*timeline, resume if resume is not None else event.offset))
        return rewound

    def _rollback(self, window: list[ChangeEvent], attempts: Attempts, exc: BaseException) -> None:
        """Count the attempt, tell the callbacks, and pause before the replay (or give up)."""
        first = window[0]
        key = timeline_key(first.topic, first.partition)
        tries = attempts.get((first.topic, first.partition, first.offset), 0) + 1
        attempts[(first.topic, first.partition, first.offset)] = tries
        self.progress.rollbacks["online"] += 1
        self.progress.attempt = tries
        cp = self.positions.get(key)
        log.warning(
            "window failed; rolling back",
            extra={"timeline": key, "scn": window[-1].scn, "attempt": tries, "error": self._mask(exc)},
        )
        self.sinks.tell("on_error", exc)
        self.sinks.tell("on_rollback", cp.window_scn if cp else -1)
        if tries > self.config.retries:
            raise ConsumerStopped(f"window at SCN {window[-1].scn} of {key} failed {tries} times: {exc}")
        self.stopping.replay(self.config.retry_backoff, tries)


def _relay_error(error: KafkaError) -> None:
    if error.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        raise ConsumerStopped(f"RelayFallOff: {error.str()} (restart to bootstrap)", code=RELAY_LOST_EXIT)
    if not (error.retriable() or error.code() == KafkaError._PARTITION_EOF):
        raise ConsumerStopped(f"Kafka error: {error.str()}")
