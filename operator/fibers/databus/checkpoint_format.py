"""The Databus 2.0 checkpoint's JSON: its field names as the Databus client spells them, the consumption
modes, and the reading of a map into checked, normalised fields (pure; `checkpoint.Checkpoint` holds one).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from enum import StrEnum


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, breaks an invariant, or cannot take the requested step.

    Raised instead of falling back to a default position: silently restarting from "flexible" or
    "latest" would skip or replay data without anyone noticing.
    """


class ConsumptionMode(StrEnum):
    """The `consumption_mode` values of Databus (`DbusClientMode`)."""

    INIT = "INIT"
    BOOTSTRAP_SNAPSHOT = "BOOTSTRAP_SNAPSHOT"
    BOOTSTRAP_CATCHUP = "BOOTSTRAP_CATCHUP"
    ONLINE_CONSUMPTION = "ONLINE_CONSUMPTION"


# JSON keys, spelled as the Databus client writes them.
MODE = "consumption_mode"
WINDOW_SCN = "windowScn"
PREV_SCN = "prevScn"
WINDOW_OFFSET = "windowOffset"
SNAPSHOT_OFFSET = "snapshot_offset"
TS_NSECS = "tsNsecs"
SINCE_SCN = "bootstrap_since_scn"
START_SCN = "bootstrap_start_scn"
TARGET_SCN = "bootstrap_target_scn"
SNAPSHOT_SOURCE = "snapshot_source"
CATCHUP_SOURCE = "catchup_source"
SNAPSHOT_INDEX = "bootstrap_snapshot_source_index"
CATCHUP_INDEX = "bootstrap_catchup_source_index"
SERVER_INFO = "bootstrap_server_info"

# Integer fields and their value when absent (Databus `mapToInternalState` / `resetBootstrap`).
INT_DEFAULTS: dict[str, int] = {
    WINDOW_SCN: -1,
    PREV_SCN: -1,
    WINDOW_OFFSET: -1,
    SNAPSHOT_OFFSET: -1,
    TS_NSECS: -1,
    SINCE_SCN: -1,
    START_SCN: -1,
    TARGET_SCN: -1,
    SNAPSHOT_INDEX: 0,
    CATCHUP_INDEX: 0,
}
# Text fields that may also be null.
TEXT_FIELDS = frozenset({SNAPSHOT_SOURCE, CATCHUP_SOURCE, SERVER_INFO})

BOOTSTRAP_MODES = frozenset({ConsumptionMode.BOOTSTRAP_SNAPSHOT, ConsumptionMode.BOOTSTRAP_CATCHUP})


def reject_constant(name: str) -> object:
    # Python's json accepts NaN/Infinity, which are not JSON and could not be written back.
    raise CheckpointError(f"checkpoint is not valid JSON: {name} is not a JSON number")


def _as_int(key: str, value: object) -> int:
    """Read a whole number the way Databus does (`Number.longValue()`), also from numeric strings."""
    if isinstance(value, bool):  # bool is an int subclass in Python, but true is no SCN
        raise CheckpointError(f"checkpoint field {key!r} must be a number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise CheckpointError(f"checkpoint field {key!r} must be a whole number, got {value!r}")
    if isinstance(value, str):
        try:
            number = Decimal(value.strip())  # Decimal, not float: SCNs can exceed 2**53
        except InvalidOperation:
            raise CheckpointError(f"checkpoint field {key!r} must be a number, got {value!r}") from None
        if not number.is_finite() or number != number.to_integral_value():
            raise CheckpointError(f"checkpoint field {key!r} must be a whole number, got {value!r}")
        return int(number)
    raise CheckpointError(f"checkpoint field {key!r} must be a number, got {type(value).__name__} {value!r}")


def normalize(data: Mapping[str, object]) -> dict[str, object]:
    """Copy the map, check the known fields' types and store integers as ints; other keys stay verbatim."""
    try:
        # A JSON round trip is both the deep copy and the proof that the map can be written back.
        copied = json.loads(json.dumps(dict(data), allow_nan=False))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint values must be plain JSON: {err}") from None
    if not isinstance(copied, dict):  # pragma: no cover - dict(data) always dumps as an object
        raise CheckpointError("checkpoint must be a JSON object")
    for key, value in copied.items():
        if key in INT_DEFAULTS:
            copied[key] = _as_int(key, value)
        elif key == MODE:
            if not isinstance(value, str) or value not in ConsumptionMode.__members__:
                allowed = ", ".join(ConsumptionMode.__members__)
                raise CheckpointError(f"checkpoint field {MODE!r} must be one of {allowed}; got {value!r}")
        elif key in TEXT_FIELDS and value is not None and not isinstance(value, str):
            raise CheckpointError(f"checkpoint field {key!r} must be a string or null, got {value!r}")
    return copied
