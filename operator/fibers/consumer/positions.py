"""Where each timeline this instance consumes stands: its Databus checkpoint in memory, plus the Kafka
offset to resume from, written through the throttled checkpoint store."""

from __future__ import annotations

from fibers.consumer.checkpoint_store import CheckpointStore
from fibers.consumer.relay_log import RelayLog
from fibers.databus.checkpoint import Checkpoint
from fibers.databus.timelines import parse_timeline_key, progressed

NEXT_OFFSET = "kafka_next_offset"  # the Fibers key beside the SCNs: the offset a timeline resumes from


def next_offset(cp: Checkpoint | None) -> int | None:
    """The Kafka offset a timeline resumes from, kept in its checkpoint next to the SCNs."""
    value = cp.get(NEXT_OFFSET) if cp is not None else None
    return value if isinstance(value, int) else None


class Positions:
    """The checkpoints of the timelines held here (timeline key → checkpoint), and their writes."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.checkpoints: dict[str, Checkpoint] = {}
        # Each relay topic's Kafka log, as the run found it: every checkpoint put here records it, and the
        # relay's steps (`Checkpoint.online`, the bootstrap's) keep what a checkpoint records.
        self.logs: dict[str, RelayLog] = {}

    def get(self, key: str) -> Checkpoint | None:
        return self.checkpoints.get(key)

    def resume(self, key: str) -> int | None:
        """The offset timeline `key` resumes from (None: it has no position yet)."""
        return next_offset(self.checkpoints.get(key))

    def save(self, keys: list[str], force: bool = False) -> None:
        """Hand these timelines' checkpoints to the store (written now when `force`, else when the throttle allows)."""
        self.store.save({k: self.checkpoints[k] for k in keys}, force=force)

    def put(self, key: str, cp: Checkpoint) -> None:
        """Timeline `key` stands at `cp` (taken from the ConfigMap, or given a first position), recording the
        Kafka log its offsets count in; not saved."""
        log = self.logs.get(parse_timeline_key(key)[0])
        self.checkpoints[key] = log.stamp(cp) if log else cp

    def set(self, keys: list[str], cp: Checkpoint, force: bool = False) -> None:
        """One checkpoint for several timelines (a bootstrap moves them together), saved."""
        for key in keys:
            self.put(key, cp)
        self.save(keys, force=force)

    def forget(self, key: str) -> None:
        """A timeline no longer consumed here: nothing of it is written any more."""
        self.checkpoints.pop(key, None)
        self.store.forget(key)

    def mode(self) -> str:
        """The instance's consumption mode: the earliest of its timelines' (INIT when none has progressed).
        Read from the metrics server's thread too: the values are copied in one step."""
        modes = {cp.consumption_mode.value for cp in progressed(list(self.checkpoints.values()))}
        for mode in ("BOOTSTRAP_SNAPSHOT", "BOOTSTRAP_CATCHUP", "ONLINE_CONSUMPTION"):
            if mode in modes:
                return mode
        return "INIT"
