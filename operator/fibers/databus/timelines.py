"""A consumer's checkpoint ConfigMap: one Databus checkpoint per timeline (topic-partition), the hash of the
source list they were written for, and the annotations its instances leave for the operator.

Pure: no I/O. Shared by the operator (which mirrors the checkpoints into status) and the consumer pods
(which write them through `fibers.consumer.checkpoint_store`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence

from fibers.databus.checkpoint import Checkpoint, CheckpointError, ConsumptionMode

# The ConfigMap's annotations, each written by the consumer's instances.
STATS_ANNOTATION = "fibers.dev/stats-"  # + instance: that instance's figures, mirrored into status (`stats`)
OWNERS_ANNOTATION = "fibers.dev/owners"  # {timeline key: fencing token of its owner}
STOPPED_ANNOTATION = "fibers.dev/stopped-"  # + instance: why that instance stopped for good (it waits, not restarts)

SOURCES_HASH_KEY = "sources.sha256"
"""ConfigMap key holding `sources_hash()` of the subscription list the checkpoints were written for."""

_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")  # Kafka's legal topic names
_TIMELINE_KEY = re.compile(r"(?P<topic>[a-zA-Z0-9._-]{1,249})\.(?P<partition>0|[1-9][0-9]*)")
_CONFIGMAP_KEY_MAX = 253


def timeline_key(topic: str, partition: int) -> str:
    """The key of a topic-partition, `<topic>.<partition>` (e.g. `orders.0`).

    Kafka topic names use only `[a-zA-Z0-9._-]`, so the key is a legal ConfigMap data key, and since the
    partition is all digits the last dot splits it back unambiguously.
    """
    if not _TOPIC.fullmatch(topic):
        raise CheckpointError(f"timeline: {topic!r} is not a legal Kafka topic name")
    if partition < 0:
        raise CheckpointError(f"timeline: partition must be >= 0, got {partition}")
    key = f"{topic}.{partition}"
    if len(key) > _CONFIGMAP_KEY_MAX:
        raise CheckpointError(f"timeline: key {key!r} is longer than {_CONFIGMAP_KEY_MAX} characters")
    return key


def parse_timeline_key(key: str) -> tuple[str, int]:
    """Split a `<topic>.<partition>` key back into topic and partition."""
    match = _TIMELINE_KEY.fullmatch(key)
    if match is None or len(key) > _CONFIGMAP_KEY_MAX:
        raise CheckpointError(f"timeline key {key!r} is not of the form <topic>.<partition>")
    return match["topic"], int(match["partition"])


def sources_hash(sources: Sequence[str]) -> str:
    """SHA-256 of the ordered source list.

    Bootstrap checkpoints refer to sources by index, and Databus does not store the list, so a reordered
    subscription would silently resume the wrong source. Encoded as JSON so names cannot run together.
    """
    encoded = json.dumps(list(sources), separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


class Checkpoints(Mapping[str, Checkpoint]):
    """The checkpoints of one consumer, one per topic-partition, for one ordered source list.

    The Fibers counterpart of Databus `CheckpointMult`, laid out for a ConfigMap: one data key per
    timeline (see `timeline_key`) holding the Databus checkpoint JSON unchanged, plus `sources.sha256`.
    Immutable: `with_checkpoint` returns a new set.
    """

    __slots__ = ("_checkpoints", "_sources")

    def __init__(self, sources: Sequence[str], checkpoints: Mapping[str, Checkpoint] | None = None) -> None:
        names = tuple(sources)
        if not names or not all(names) or len(set(names)) != len(names):
            raise CheckpointError(f"sources must be a non-empty list of distinct, non-empty names, got {list(names)}")
        self._sources = names
        self._checkpoints: dict[str, Checkpoint] = {}
        for key, checkpoint in (checkpoints or {}).items():
            parse_timeline_key(key)
            self._checkpoints[key] = checkpoint

    @property
    def sources(self) -> tuple[str, ...]:
        """The ordered subscription list the bootstrap indexes refer to."""
        return self._sources

    def __getitem__(self, key: str) -> Checkpoint:
        return self._checkpoints[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._checkpoints)

    def __len__(self) -> int:
        return len(self._checkpoints)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Checkpoints):
            return NotImplemented
        return self._sources == other._sources and self._checkpoints == other._checkpoints

    def __repr__(self) -> str:
        return f"Checkpoints(sources={list(self._sources)}, checkpoints={self._checkpoints})"

    def with_checkpoint(self, key: str, checkpoint: Checkpoint) -> Checkpoints:
        """A copy with the checkpoint of timeline `key` added or replaced."""
        return Checkpoints(self._sources, {**self._checkpoints, key: checkpoint})

    def to_configmap_data(self) -> dict[str, str]:
        """ConfigMap `data`: one checkpoint JSON per timeline key, plus the source-list hash."""
        data = {key: checkpoint.to_json() for key, checkpoint in self._checkpoints.items()}
        data[SOURCES_HASH_KEY] = sources_hash(self._sources)
        return data

    @classmethod
    def from_configmap_data(cls, data: Mapping[str, str] | None, sources: Sequence[str]) -> Checkpoints:
        """Read ConfigMap `data` written for `sources`; each checkpoint is parsed leniently (not validated).

        An empty or missing `data` is a consumer with no checkpoints yet. Checkpoints without a source
        hash, or written for a different list or order of sources, are refused rather than resumed.
        """
        entries = dict(data or {})
        stored_hash = entries.pop(SOURCES_HASH_KEY, None)
        expected_hash = sources_hash(sources)
        if stored_hash is None and entries:
            raise CheckpointError(
                f"ConfigMap has checkpoints but no {SOURCES_HASH_KEY!r}: cannot tell which sources they were for"
            )
        if stored_hash is not None and stored_hash != expected_hash:
            raise CheckpointError(
                f"{SOURCES_HASH_KEY} mismatch: stored {stored_hash!r}, expected {expected_hash!r} for sources "
                f"{list(sources)}; the subscription list or its order changed, so bootstrap indexes would "
                "point at the wrong sources"
            )
        checkpoints: dict[str, Checkpoint] = {}
        for key, text in entries.items():
            try:
                parse_timeline_key(key)
                if not isinstance(text, str):
                    raise CheckpointError(f"value must be a string, got {type(text).__name__}")
                checkpoints[key] = Checkpoint.parse(text)
            except CheckpointError as err:
                raise CheckpointError(f"ConfigMap key {key!r}: {err}") from None
        return cls(sources, checkpoints)


def progressed(checkpoints: Iterable[Checkpoint]) -> list[Checkpoint]:
    """The checkpoints that say how far a consumer is: those past INIT.

    A timeline taken with no checkpoint gets an INIT one at once holding its resolved start offset (so
    "latest" is resolved once, ever); until its first window it tells nothing of the consumer's progress.
    """
    return [cp for cp in checkpoints if cp.consumption_mode is not ConsumptionMode.INIT]


def min_scn(checkpoints: Iterable[Checkpoint] | Mapping[str, Checkpoint]) -> int | None:
    """The lowest windowScn over the timelines, for lag; timelines without a position are skipped.

    None when no timeline has a position yet.
    """
    values = checkpoints.values() if isinstance(checkpoints, Mapping) else checkpoints
    scns = [checkpoint.window_scn for checkpoint in values if checkpoint.window_scn >= 0]
    return min(scns, default=None)
