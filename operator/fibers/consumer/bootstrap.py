"""The bootstrap puller: a timeline with no usable relay position is brought up from the bootstrap store —
the snapshot first, then the changes logged while it was taken (catch-up) — and goes online at the
offset the store had applied up to.

Each page (snapshot rows or logged changes) goes through the sinks as relay windows do, with the same
timeout, rollback and retries, and a checkpoint after it: a failure replays the page, never the whole
snapshot. Between pages the bootstrap stops when the consumer stops or another instance owns the
timelines now (`still_ours`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from pymongo import MongoClient
from pymongo.errors import ConnectionFailure

from fibers.consumer.batches import Progress
from fibers.consumer.events import ChangeEvent
from fibers.consumer.positions import NEXT_OFFSET, Positions
from fibers.consumer.sinkset import SinkSet
from fibers.consumer.stops import RELAY_GONE_EXIT, ConsumerStopped, Stopping
from fibers.consumer.store import BootstrapStore, StoreConflict
from fibers.consumer.tuning import BOOTSTRAP_PAGE_ROWS
from fibers.databus.checkpoint import Checkpoint, ConsumptionMode
from fibers.databus.checkpoint_format import BOOTSTRAP_MODES
from fibers.databus.config import ConsumerConfig
from fibers.databus.timelines import Checkpoints, parse_timeline_key, timeline_key
from fibers.mongodb import SELECTION_TIMEOUT_MS

log = logging.getLogger("fibers.consumer")
SNAPSHOT_LAST_KEY = "fibers_snapshot_last_key"  # the _id of the last snapshot row delivered
CATCHUP_LAST_ID = "fibers_catchup_last_id"  # the _id of the last logged change delivered
TARGET_OFFSETS = "fibers_target_offsets"  # {partition: the offset the store had applied}: where online starts


class Bootstrap:
    def __init__(
        self,
        config: ConsumerConfig,
        positions: Positions,
        sinks: SinkSet,
        progress: Progress,
        stopping: Stopping,
        *,
        low_watermark: Callable[[str, int], int],
        still_ours: Callable[[list[str]], None],
        mask: Callable[[BaseException], str],
    ) -> None:
        self.config, self.positions, self.sinks, self.progress = config, positions, sinks, progress
        self.stopping = stopping
        self._low_watermark, self._still_ours, self._mask = low_watermark, still_ours, mask

    def plan(self, topic: str, partitions: list[int], stored: Checkpoints) -> list[tuple[list[int], str]]:
        """The bootstraps to run before these partitions of `topic` go online: (partitions, why) each.

        Partitions whose checkpoints record the same interrupted bootstrap resume it together (one
        instance may take partitions from two earlier owners, each bootstrapping its own set).
        """
        keys = {p: timeline_key(topic, p) for p in partitions}
        interrupted: dict[str, list[int]] = {}
        for p, key in keys.items():
            cp = self.positions.get(key)
            if cp and cp.consumption_mode in BOOTSTRAP_MODES:
                interrupted.setdefault(cp.to_json(), []).append(p)
        if interrupted:
            return [(group, "resuming an interrupted bootstrap") for group in interrupted.values()]
        if self._fell_off(topic, partitions):
            return [(partitions, "fell off the relay")]
        # No checkpoint: bootstrap, unless the topic is consumed online already (another partition's
        # checkpoint says so): then this partition has had no changes yet and starts at the relay's start.
        fresh = [p for p, key in keys.items() if key not in self.positions.checkpoints]
        online = any(
            parse_timeline_key(k)[0] == topic and cp.consumption_mode is ConsumptionMode.ONLINE_CONSUMPTION
            for k, cp in stored.items()
        )
        if fresh and self.config.start_position == "bootstrap" and not online:
            return [(fresh, "no checkpoint (startPosition: bootstrap)")]
        return []

    def _fell_off(self, topic: str, partitions: list[int]) -> bool:
        for partition in partitions:
            resume = self.positions.resume(timeline_key(topic, partition))
            if resume is None:
                continue
            low = self._low_watermark(topic, partition)
            if resume < low:
                if not self.config.bootstrap:
                    raise ConsumerStopped(
                        f"RelayFallOff: {topic}/{partition} resumes at offset {resume} but Kafka only keeps "
                        f"offsets from {low}; configure a bootstrap store or seek explicitly",
                        code=RELAY_GONE_EXIT,
                    )
                log.warning("fell off the relay", extra={"topic": topic, "partition": partition, "next_offset": resume})
                return True
        return False

    def run(self, topic: str, partitions: list[int], *, reason: str) -> None:
        """Snapshot (unless a catch-up is under way), then catch-up; the partitions end online."""
        if not self.config.bootstrap:
            raise ConsumerStopped(
                f"cannot bootstrap {topic} ({reason}): no bootstrap store configured", code=RELAY_GONE_EXIT
            )
        uri = os.environ.get(self.config.bootstrap["uriEnv"], "")
        mongo: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=SELECTION_TIMEOUT_MS)
        store = BootstrapStore(mongo[self.config.bootstrap["database"]])
        keys = [timeline_key(topic, p) for p in partitions]
        log.info("bootstrap starting", extra={"topic": topic, "reason": reason})
        try:
            try:
                store.check_topic(topic)
            except StoreConflict as exc:  # another topic's rows are not this one's
                raise ConsumerStopped(f"cannot bootstrap {topic}: {exc}", code=RELAY_GONE_EXIT) from None
            cp = self._start(topic, keys, store, partitions)
            self.sinks.hook("on_start_bootstrap")
            if cp.consumption_mode is ConsumptionMode.BOOTSTRAP_SNAPSHOT:
                cp = self._snapshot(topic, partitions, keys, store, cp)
            self._catchup(topic, partitions, keys, store, cp)
            self.sinks.hook("on_stop_bootstrap")
        finally:
            mongo.close()

    def _start(self, topic: str, keys: list[str], store: BootstrapStore, partitions: list[int]) -> Checkpoint:
        """The bootstrap checkpoint: the one under way, or a new one from the online position (if any)."""
        current = self.positions.get(keys[0])
        if current and current.consumption_mode in BOOTSTRAP_MODES:
            return current
        base = current if current and current.consumption_mode is ConsumptionMode.ONLINE_CONSUMPTION else None
        since = max(base.window_scn, 0) if base else 0
        applied = store.applier_state(topic, partitions)
        start = min((scn for scn, _ in applied.values()), default=0)
        if 0 < since < start:
            # The snapshot holds no deleted rows: a consumer that fell off the relay with rows in its sinks
            # must hear of the deletes since its last window, so the catch-up starts there when the log
            # holds every change after it (Databus' snapshot bypass; here whatever the delta's size).
            first = store.first_logged(topic, partitions)
            if all(first.get(p, since) <= since for p in applied):
                start = since
            else:
                log.warning(
                    "the bootstrap store's log begins after this consumer's last window: rows deleted "
                    "in between stay in its sinks",
                    extra={"topic": topic, "since_scn": since, "start_scn": start},
                )
        cp = (base or Checkpoint.initial()).start_bootstrap(since, topic).with_start_scn(start)
        self.positions.set(keys, cp, force=True)
        return cp

    def _deliver(self, events: list[ChangeEvent], scn: int, checkpoint: Checkpoint, keys: list[str]) -> None:
        """One page through the sinks, as relay windows go.

        On ERROR, an exception or a timeout the callbacks hear `on_bootstrap_error`, then
        `on_bootstrap_rollback` with the SCN of the last bootstrap checkpoint (`checkpoint`, persisted
        after the page before), and the page is delivered again from that checkpoint after a growing
        pause — never from the start of the snapshot. Past the retries the consumer stops, naming the
        source, the phase, the SCN and the error (the termination message the resource shows).
        """
        tries = 0
        while exc := self.sinks.page(events, scn):  # any failure of a page rolls it back, as for windows
            tries += 1
            self.progress.rollbacks["bootstrap"] += 1
            self.progress.attempt = tries
            first = events[0]
            where = {"topic": first.topic, "phase": first.window, "scn": scn, "attempt": tries}
            log.warning("bootstrap page failed; rolling back", extra=where | {"error": self._mask(exc)})
            self.sinks.tell("on_bootstrap_error", exc)
            self.sinks.tell("on_bootstrap_rollback", checkpoint.window_scn)
            if tries > self.config.retries:
                raise ConsumerStopped(
                    f"bootstrap {first.window} of {first.topic} failed at SCN {scn} {tries} times: {exc}"
                ) from exc
            self.stopping.replay(self.config.retry_backoff, tries)
            self._still_ours(keys)
        self.progress.events += len(events)
        self.progress.attempt = 0

    def _snapshot(
        self, topic: str, partitions: list[int], keys: list[str], store: BootstrapStore, cp: Checkpoint
    ) -> Checkpoint:
        last = cp.get(SNAPSHOT_LAST_KEY)
        delivered = max(cp.snapshot_offset, 0)

        def read(after: str | None) -> Iterator[list[dict[str, Any]]]:
            return store.snapshot_pages(topic, partitions, after, BOOTSTRAP_PAGE_ROWS)

        for rows in self._pages(read, last if isinstance(last, str) else None, keys):
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
            self.positions.set(keys, cp)
        cp = cp.end_snapshot_source(None)
        self.positions.set(keys, cp, force=True)
        log.info("bootstrap snapshot done", extra={"topic": topic, "rows": delivered})
        return cp

    def _catchup(
        self, topic: str, partitions: list[int], keys: list[str], store: BootstrapStore, cp: Checkpoint
    ) -> None:
        applied = store.applier_state(topic, partitions)
        if cp.consumption_mode is ConsumptionMode.BOOTSTRAP_SNAPSHOT:
            target = max([scn for scn, _ in applied.values()] + [cp.bootstrap_start_scn, 0])
            cp = cp.start_catchup(target, topic).with_values(
                {TARGET_OFFSETS: {str(p): offset for p, (_, offset) in applied.items()}}
            )
            self.positions.set(keys, cp, force=True)
        after = cp.get(CATCHUP_LAST_ID)
        rows_done = 0
        start, target = cp.bootstrap_start_scn, cp.bootstrap_target_scn

        def read(after: str | None) -> Iterator[list[dict[str, Any]]]:
            return store.log_pages(topic, partitions, start, target, after, BOOTSTRAP_PAGE_ROWS)

        for rows in self._pages(read, after if isinstance(after, str) else None, keys):
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
            self.positions.set(keys, cp)
        targets = cp.get(TARGET_OFFSETS) or {}
        online = cp.end_catchup_source(None).finish_bootstrap()
        for partition, key in zip(partitions, keys, strict=True):
            offset = int(targets.get(str(partition), -1)) + 1 if isinstance(targets, dict) else 0
            self.positions.put(
                key,
                online.with_values(
                    {NEXT_OFFSET: offset, SNAPSHOT_LAST_KEY: None, CATCHUP_LAST_ID: None, TARGET_OFFSETS: None}
                ),
            )
        self.positions.save(keys, force=True)
        log.info(
            "bootstrap done; consuming online",
            extra={"topic": topic, "catchup_rows": rows_done, "scn": online.window_scn},
        )

    def _pages(
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
                    "bootstrap store unreachable; reading again", extra={"attempt": attempt, "error": self._mask(exc)}
                )
                self.stopping.transient(attempt)
                self._still_ours(keys)
