"""The Databus `assertCheckpoint` rules, per consumption mode: what a checkpoint must hold to be resumed
from (pure). `Checkpoint.validate` applies them after every transition."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fibers.databus.checkpoint_format import (
    CATCHUP_INDEX,
    SINCE_SCN,
    SNAPSHOT_INDEX,
    START_SCN,
    TARGET_SCN,
    CheckpointError,
    ConsumptionMode,
)

if TYPE_CHECKING:
    from fibers.databus.checkpoint import Checkpoint


def check(cp: Checkpoint) -> None:
    """Raise CheckpointError naming the first rule the checkpoint breaks (INIT: nothing to check)."""
    mode = cp.consumption_mode
    if mode is ConsumptionMode.ONLINE_CONSUMPTION:
        _validate_online(cp)
    elif mode is ConsumptionMode.BOOTSTRAP_SNAPSHOT:
        _validate_snapshot(cp)
    elif mode is ConsumptionMode.BOOTSTRAP_CATCHUP:
        _validate_catchup(cp)


def _violated(cp: Checkpoint, rule: str, detail: str) -> CheckpointError:
    return CheckpointError(f"invalid {cp.consumption_mode} checkpoint: rule '{rule}' violated ({detail})")


def _validate_online(cp: Checkpoint) -> None:
    if cp.is_flexible:
        return
    scn, prev, offset = cp.window_scn, cp.prev_scn, cp.window_offset
    if scn < 0:
        raise _violated(cp, "windowScn >= 0 unless flexible", f"windowScn={scn}, tsNsecs={cp.ts_nsecs}")
    if offset < -1:
        raise _violated(cp, "windowOffset >= 0 or == -1", f"windowOffset={offset}")
    if offset == -1 and prev not in (-1, scn):
        raise _violated(cp, "prevScn is -1 or windowScn when windowOffset == -1", f"prevScn={prev}, windowScn={scn}")
    if prev > scn:
        raise _violated(cp, "prevScn <= windowScn", f"prevScn={prev}, windowScn={scn}")


def _validate_snapshot(cp: Checkpoint) -> None:
    if cp.bootstrap_catchup_source_index != 0:
        raise _violated(cp, "catchup index is 0", f"{CATCHUP_INDEX}={cp.bootstrap_catchup_source_index}")
    if cp.bootstrap_since_scn < 0:
        raise _violated(cp, "since-SCN is set", f"{SINCE_SCN}={cp.bootstrap_since_scn}")
    if cp.bootstrap_start_scn >= 0:
        return
    if cp.bootstrap_snapshot_source_index != 0:
        raise _violated(
            cp, "snapshot index is 0 until start-SCN is set", f"{SNAPSHOT_INDEX}={cp.bootstrap_snapshot_source_index}"
        )
    if cp.snapshot_offset != 0:
        raise _violated(cp, "snapshot_offset is 0 until start-SCN is set", f"snapshot_offset={cp.snapshot_offset}")
    if cp.bootstrap_target_scn >= 0:
        raise _violated(cp, "target-SCN is unset until start-SCN is set", f"{TARGET_SCN}={cp.bootstrap_target_scn}")


def _validate_catchup(cp: Checkpoint) -> None:
    since, start, target = cp.bootstrap_since_scn, cp.bootstrap_start_scn, cp.bootstrap_target_scn
    for rule, key, value in (
        ("since-SCN is set", SINCE_SCN, since),
        ("start-SCN is set", START_SCN, start),
        ("target-SCN is set", TARGET_SCN, target),
    ):
        if value < 0:
            raise _violated(cp, rule, f"{key}={value}")
    if cp.snapshot_offset != -1:
        raise _violated(cp, "snapshot_offset is -1", f"snapshot_offset={cp.snapshot_offset}")
    if target < start:
        raise _violated(cp, "target-SCN >= start-SCN", f"{TARGET_SCN}={target}, {START_SCN}={start}")
    catchup, snapshot = cp.bootstrap_catchup_source_index, cp.bootstrap_snapshot_source_index
    if not 0 <= catchup <= snapshot:
        raise _violated(
            cp, "0 <= catchup index <= snapshot index", f"{CATCHUP_INDEX}={catchup}, {SNAPSHOT_INDEX}={snapshot}"
        )
