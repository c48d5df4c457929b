"""Databus 2.0 checkpoints for one timeline (the per-partition set kept in a ConfigMap: `timelines`).

A checkpoint is the consumer's position on one timeline; in Fibers a timeline is one Kafka
topic-partition. The JSON form is the Databus client's, so checkpoints written by either side can be
read by the other. As in Databus, the whole key/value map is kept, which lets keys this module does not
know (Kafka offsets, snapshot generations, Databus V3 fields) survive a read and a write unchanged.

Everything here is pure: no I/O, no clock. Checkpoints are immutable; every transition returns a new,
validated checkpoint, so a failed step can never leave a half-updated position behind.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping

from fibers.databus import checkpoint_rules
from fibers.databus.checkpoint_format import (
    CATCHUP_INDEX,
    CATCHUP_SOURCE,
    INT_DEFAULTS,
    MODE,
    PREV_SCN,
    SERVER_INFO,
    SINCE_SCN,
    SNAPSHOT_INDEX,
    SNAPSHOT_OFFSET,
    SNAPSHOT_SOURCE,
    START_SCN,
    TARGET_SCN,
    TS_NSECS,
    WINDOW_OFFSET,
    WINDOW_SCN,
    CheckpointError,
    ConsumptionMode,
    normalize,
    reject_constant,
)

__all__ = ["Checkpoint", "CheckpointError", "ConsumptionMode"]


class Checkpoint:
    """The position of a consumer on one timeline (one Kafka topic-partition), Databus-compatible.

    Accessors give the hot fields typed, with the Databus defaults when a key is absent; absent keys
    are not added on output, so a checkpoint is written back exactly as it was read. Numbers given as
    floats or numeric strings are read as ints and written as JSON integers.
    """

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, object] | None = None) -> None:
        self._data = normalize(data or {})

    # --- reading and writing -------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        """Read checkpoint JSON leniently: missing fields default, ints may be floats or strings.

        It does not check the invariants (call `validate()`), so that a stored checkpoint can always be
        inspected; it does refuse anything it cannot represent faithfully.
        """
        try:
            decoded = json.loads(text.lstrip("\ufeff").strip(), parse_constant=reject_constant)
        except CheckpointError:
            raise
        except ValueError as err:
            raise CheckpointError(f"checkpoint is not valid JSON: {err}") from None
        if not isinstance(decoded, dict):
            raise CheckpointError(f"checkpoint must be a JSON object, got {type(decoded).__name__}")
        return cls(decoded)

    def to_json(self) -> str:
        """Compact JSON, keys in their original order, as the Databus client writes it."""
        return json.dumps(self._data, separators=(",", ":"), allow_nan=False)

    def as_dict(self) -> dict[str, object]:
        """A deep copy of the full map, unknown keys included."""
        return copy.deepcopy(self._data)

    def get(self, key: str, default: object = None) -> object:
        """Any key as stored, e.g. the Fibers extension keys (`kafka_next_offset`, ...)."""
        return copy.deepcopy(self._data.get(key, default))

    def with_values(self, values: Mapping[str, object]) -> Checkpoint:
        """A copy with some keys set; meant for extension keys, which Databus readers ignore."""
        return Checkpoint({**self._data, **values})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Checkpoint):
            return NotImplemented
        return self._data == other._data

    def __repr__(self) -> str:
        return f"Checkpoint({self.to_json()})"

    # --- typed fields ------------------------------------------------------------------------

    def _int(self, key: str) -> int:
        value = self._data.get(key, INT_DEFAULTS[key])
        assert isinstance(value, int)  # guaranteed by _normalize
        return value

    def _text(self, key: str) -> str | None:
        value = self._data.get(key)
        assert value is None or isinstance(value, str)  # guaranteed by _normalize
        return value

    @property
    def consumption_mode(self) -> ConsumptionMode:
        """INIT when absent: Databus starts every checkpoint as an empty INIT one."""
        return ConsumptionMode(str(self._data.get(MODE, ConsumptionMode.INIT)))

    @property
    def window_scn(self) -> int:
        """`windowScn`: online, the last fully consumed window (if window_offset is -1); -1 is flexible."""
        return self._int(WINDOW_SCN)

    @property
    def prev_scn(self) -> int:
        """`prevScn`: SCN of the last complete window, -1 if unknown."""
        return self._int(PREV_SCN)

    @property
    def window_offset(self) -> int:
        """`windowOffset`: events of window_scn already seen (-1: all); during catchup, a log row id."""
        return self._int(WINDOW_OFFSET)

    @property
    def snapshot_offset(self) -> int:
        """`snapshot_offset`: last snapshot row id delivered; 0 at the start, -1 when the source is done."""
        return self._int(SNAPSHOT_OFFSET)

    @property
    def ts_nsecs(self) -> int:
        """`tsNsecs`: timestamp of the last consumed end of window, -1 if unset."""
        return self._int(TS_NSECS)

    @property
    def bootstrap_since_scn(self) -> int:
        """`bootstrap_since_scn`: last window consumed before falling off the relay (0: full bootstrap)."""
        return self._int(SINCE_SCN)

    @property
    def bootstrap_start_scn(self) -> int:
        """`bootstrap_start_scn`: what the snapshot store had applied when the bootstrap began."""
        return self._int(START_SCN)

    @property
    def bootstrap_target_scn(self) -> int:
        """`bootstrap_target_scn`: where catchup stops, taken when a source's snapshot ended."""
        return self._int(TARGET_SCN)

    @property
    def snapshot_source(self) -> str | None:
        """`snapshot_source`: source being (or next to be) snapshotted; "" once none remain."""
        return self._text(SNAPSHOT_SOURCE)

    @property
    def catchup_source(self) -> str | None:
        """`catchup_source`: source being caught up, when known."""
        return self._text(CATCHUP_SOURCE)

    @property
    def bootstrap_snapshot_source_index(self) -> int:
        """Index of the snapshot source in the ordered subscription list."""
        return self._int(SNAPSHOT_INDEX)

    @property
    def bootstrap_catchup_source_index(self) -> int:
        """Index of the catchup source in the ordered subscription list."""
        return self._int(CATCHUP_INDEX)

    @property
    def bootstrap_server_info(self) -> str | None:
        """Which snapshot store issued the start SCN; row offsets only mean something there."""
        return self._text(SERVER_INFO)

    @property
    def is_flexible(self) -> bool:
        """No position at all (windowScn and tsNsecs unset): "serve whatever you have"."""
        return self.window_scn < 0 and self.ts_nsecs < 0

    # --- invariants --------------------------------------------------------------------------

    def validate(self) -> Checkpoint:
        """Check the Databus `assertCheckpoint` rules for the current mode; return self for chaining."""
        checkpoint_rules.check(self)
        return self

    # --- transitions -------------------------------------------------------------------------

    def _step(self, changes: Mapping[str, object], drop: Iterable[str] = ()) -> Checkpoint:
        dropped = set(drop)
        data = {key: value for key, value in self._data.items() if key not in dropped}
        data.update(changes)
        return Checkpoint(data).validate()

    def _require(self, step: str, *modes: ConsumptionMode) -> None:
        if self.consumption_mode not in modes:
            allowed = " or ".join(modes)
            raise CheckpointError(
                f"{step}: needs consumption_mode {allowed}, this checkpoint is {self.consumption_mode}"
            )

    @classmethod
    def initial(cls) -> Checkpoint:
        """An empty INIT checkpoint: no position yet (flexible), as Databus `init()` makes it."""
        return cls(
            {MODE: ConsumptionMode.INIT.value, WINDOW_SCN: -1, PREV_SCN: -1, WINDOW_OFFSET: -1, SNAPSHOT_OFFSET: -1}
        )

    def online(self, scn: int, ts_nsecs: int = -1, values: Mapping[str, object] | None = None) -> Checkpoint:
        """The window `scn` was consumed to its end: the only online position the dispatcher persists.

        windowScn = prevScn = scn and windowOffset = -1, so a restart re-delivers whole windows and never
        resumes inside one. A negative `ts_nsecs` leaves tsNsecs unset (the key is removed). `values`:
        extension keys set in the same step (the relay's next Kafka offset), one copy instead of two: the
        relay moves a checkpoint after every batch it hands on.
        """
        self._require("online", ConsumptionMode.INIT, ConsumptionMode.ONLINE_CONSUMPTION)
        if scn < 0:
            raise CheckpointError(f"online: the SCN of a consumed window must be >= 0, got {scn}")
        if not self.is_flexible and scn < self.window_scn:
            raise CheckpointError(
                f"online: SCN {scn} is behind windowScn {self.window_scn}; a persisted position never moves back"
            )
        changes: dict[str, object] = {
            MODE: ConsumptionMode.ONLINE_CONSUMPTION.value,
            WINDOW_SCN: scn,
            PREV_SCN: scn,
            WINDOW_OFFSET: -1,
            SNAPSHOT_OFFSET: -1,
        }
        if ts_nsecs >= 0:
            changes[TS_NSECS] = ts_nsecs
        if values:
            changes.update(values)
        return self._step(changes, drop=() if ts_nsecs >= 0 else (TS_NSECS,))

    def start_bootstrap(self, since_scn: int, first_source: str) -> Checkpoint:
        """Fell off the stream: begin snapshotting the first source of everything after `since_scn`.

        Mirrors Databus `createInitialBootstrapCheckpoint` followed by the reset done when no bootstrap
        server is pinned yet: start and target unset, both indexes 0, snapshot_offset 0, windowScn = since.
        """
        self._require("start_bootstrap", ConsumptionMode.INIT, ConsumptionMode.ONLINE_CONSUMPTION)
        if since_scn < 0:
            raise CheckpointError(f"start_bootstrap: since_scn must be >= 0 (0 = full bootstrap), got {since_scn}")
        if not first_source:
            raise CheckpointError("start_bootstrap: first_source must be a non-empty source name")
        changes: dict[str, object] = {
            MODE: ConsumptionMode.BOOTSTRAP_SNAPSHOT.value,
            WINDOW_SCN: since_scn,
            WINDOW_OFFSET: -1,
            SNAPSHOT_OFFSET: 0,
            SINCE_SCN: since_scn,
            START_SCN: -1,
            TARGET_SCN: -1,
            SNAPSHOT_INDEX: 0,
            CATCHUP_INDEX: 0,
            SERVER_INFO: None,
            SNAPSHOT_SOURCE: first_source,
        }
        # The catchup source is named when catchup starts; a stale name would contradict index 0.
        return self._step(changes, drop=(CATCHUP_SOURCE,))

    def with_start_scn(self, scn: int, server_info: str | None = None) -> Checkpoint:
        """Record the snapshot store's start SCN (and optionally which store issued it).

        Set exactly once per bootstrap, before any snapshot row: snapshot rows are those with an SCN below
        it, so changing it mid-snapshot would mix rows from two different cuts.
        """
        self._require("with_start_scn", ConsumptionMode.BOOTSTRAP_SNAPSHOT)
        if self.bootstrap_start_scn >= 0:
            raise CheckpointError(
                f"with_start_scn: {START_SCN} is already set to {self.bootstrap_start_scn}; it may be set only once"
            )
        if scn < 0:
            raise CheckpointError(f"with_start_scn: start SCN must be >= 0, got {scn}")
        changes: dict[str, object] = {START_SCN: scn}
        if server_info is not None:
            changes[SERVER_INFO] = server_info
        return self._step(changes)

    def snapshot_progress(self, row_offset: int) -> Checkpoint:
        """Snapshot rows up to id `row_offset` of the current source were delivered."""
        self._require("snapshot_progress", ConsumptionMode.BOOTSTRAP_SNAPSHOT)
        if self.bootstrap_start_scn < 0:
            raise CheckpointError("snapshot_progress: the start SCN must be set before any snapshot row is read")
        if self.snapshot_offset < 0:
            raise CheckpointError("snapshot_progress: the current source's snapshot is already complete")
        if row_offset < self.snapshot_offset:
            raise CheckpointError(
                f"snapshot_progress: row offset {row_offset} is behind snapshot_offset {self.snapshot_offset}"
            )
        return self._step({SNAPSHOT_OFFSET: row_offset})

    def end_snapshot_source(self, next_source: str | None) -> Checkpoint:
        """The current source's snapshot is complete: snapshot_offset -1 and point at the next source.

        `next_source` is the next name in the subscription list, or None after the last one (stored as
        "", which is how Databus marks "no more sources to snapshot").
        """
        self._require("end_snapshot_source", ConsumptionMode.BOOTSTRAP_SNAPSHOT)
        if self.bootstrap_start_scn < 0:
            raise CheckpointError("end_snapshot_source: the start SCN must be set before a snapshot can end")
        if self.snapshot_offset < 0:
            raise CheckpointError("end_snapshot_source: the current source's snapshot has already ended")
        return self._step(
            {
                SNAPSHOT_OFFSET: -1,
                SNAPSHOT_INDEX: self.bootstrap_snapshot_source_index + 1,
                SNAPSHOT_SOURCE: next_source or "",
            }
        )

    def start_catchup(self, target_scn: int, source: str | None = None) -> Checkpoint:
        """Replay the change log of every snapshotted source from the start SCN up to `target_scn`.

        Catchup starts over at source index 0 with windowScn = start SCN and windowOffset 0 (a log row id).
        `source` is the name of source 0; without it the `catchup_source` key is left out (the index
        alone identifies the source).
        """
        self._require("start_catchup", ConsumptionMode.BOOTSTRAP_SNAPSHOT)
        if self.snapshot_offset != -1:
            raise CheckpointError("start_catchup: call end_snapshot_source() first; the snapshot is still running")
        start = self.bootstrap_start_scn
        if target_scn < start:
            raise CheckpointError(f"start_catchup: target SCN {target_scn} is below the start SCN {start}")
        if target_scn < self.bootstrap_target_scn:
            raise CheckpointError(
                f"start_catchup: target SCN {target_scn} is behind the previous target {self.bootstrap_target_scn}"
            )
        changes: dict[str, object] = {
            MODE: ConsumptionMode.BOOTSTRAP_CATCHUP.value,
            TARGET_SCN: target_scn,
            CATCHUP_INDEX: 0,
            WINDOW_SCN: start,
            WINDOW_OFFSET: 0,
        }
        if source is not None:
            changes[CATCHUP_SOURCE] = source
        return self._step(changes, drop=() if source is not None else (CATCHUP_SOURCE,))

    def catchup_progress(self, window_scn: int, row_id: int) -> Checkpoint:
        """Log rows were delivered up to row `row_id`, whose window is `window_scn`."""
        self._require("catchup_progress", ConsumptionMode.BOOTSTRAP_CATCHUP)
        start, target = self.bootstrap_start_scn, self.bootstrap_target_scn
        if not start <= window_scn <= target:
            raise CheckpointError(f"catchup_progress: window SCN {window_scn} is outside [{start}, {target}]")
        if window_scn < self.window_scn:
            raise CheckpointError(f"catchup_progress: window SCN {window_scn} is behind windowScn {self.window_scn}")
        if row_id < 0:
            raise CheckpointError(f"catchup_progress: row id must be >= 0, got {row_id}")
        return self._step({WINDOW_SCN: window_scn, WINDOW_OFFSET: row_id})

    def end_catchup_source(self, next_source: str | None = None) -> Checkpoint:
        """The current catchup source reached the target; move on as Databus `advanceAfterCatchup` does.

        - another snapshotted source still needs catchup: catch it up from the start SCN (`next_source`
          names it);
        - otherwise, if a source is left to snapshot: back to BOOTSTRAP_SNAPSHOT for it, offset 0;
        - otherwise every source is consistent at the target: the result awaits `finish_bootstrap()`.
        """
        self._require("end_catchup_source", ConsumptionMode.BOOTSTRAP_CATCHUP)
        index = self.bootstrap_catchup_source_index + 1
        if index > self.bootstrap_snapshot_source_index:
            raise CheckpointError("end_catchup_source: every snapshotted source is already caught up")
        if index < self.bootstrap_snapshot_source_index:
            changes: dict[str, object] = {
                CATCHUP_INDEX: index,
                WINDOW_SCN: self.bootstrap_start_scn,
                WINDOW_OFFSET: 0,
            }
            if next_source is not None:
                changes[CATCHUP_SOURCE] = next_source
            return self._step(changes, drop=() if next_source is not None else (CATCHUP_SOURCE,))
        if next_source is not None:
            raise CheckpointError("end_catchup_source: next_source given, but this was the last catchup source")
        if self.snapshot_source:
            return self._step(
                {
                    MODE: ConsumptionMode.BOOTSTRAP_SNAPSHOT.value,
                    SNAPSHOT_OFFSET: 0,
                    CATCHUP_INDEX: 0,
                    WINDOW_OFFSET: -1,
                },
                drop=(CATCHUP_SOURCE,),
            )
        return self._step({CATCHUP_INDEX: index, WINDOW_OFFSET: -1})

    def finish_bootstrap(self) -> Checkpoint:
        """Every source is consistent at the target SCN: resume online from there.

        windowScn = prevScn = target and windowOffset -1; the bootstrap fields go back to their unset
        values (as Databus `resetBootstrap`, which also leaves the source names in place), and tsNsecs is
        dropped since no window was timed.
        """
        self._require("finish_bootstrap", ConsumptionMode.BOOTSTRAP_CATCHUP)
        if self.bootstrap_catchup_source_index != self.bootstrap_snapshot_source_index or self.snapshot_source:
            raise CheckpointError(
                "finish_bootstrap: sources remain to snapshot or catch up "
                f"({CATCHUP_INDEX}={self.bootstrap_catchup_source_index}, "
                f"{SNAPSHOT_INDEX}={self.bootstrap_snapshot_source_index}, {SNAPSHOT_SOURCE}={self.snapshot_source!r})"
            )
        target = self.bootstrap_target_scn
        return self._step(
            {
                MODE: ConsumptionMode.ONLINE_CONSUMPTION.value,
                WINDOW_SCN: target,
                PREV_SCN: target,
                WINDOW_OFFSET: -1,
                SNAPSHOT_OFFSET: -1,
                SINCE_SCN: -1,
                START_SCN: -1,
                TARGET_SCN: -1,
                SNAPSHOT_INDEX: 0,
                CATCHUP_INDEX: 0,
                SERVER_INFO: None,
            },
            drop=(TS_NSECS,),
        )
