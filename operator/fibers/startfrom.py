"""Where reading a stream starts: one vocabulary, `startFrom`, with one meaning on every kind.

    startFrom: {position: earliest}           the oldest record Kafka keeps
    startFrom: {position: latest}             the end of the stream when the position is taken
    startFrom: {position: bootstrap}          a DatabusConsumer's bootstrap store, then the stream
    startFrom: {timestamp: 2026-11-27T09:00:00Z}
                                              the first record at or after that time (Kafka's offsets for
                                              times); none yet: the end

A position is taken once, when a reader has none (at creation) or is told to move (a seek); after that
it resumes from its own checkpoints like from any other. A timestamp older than what Kafka still keeps
is refused rather than silently moved up to the oldest record (`before_retention`): the records between
would be lost unseen. Pure: parsing and checking here, the lookup in Kafka with each reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

POSITIONS = ("earliest", "latest", "bootstrap")
NO_OFFSET = -1  # Kafka's answer to an offsets-for-times lookup past the last record


class StartFromError(ValueError):
    """The startFrom cannot be used; the message names the field."""


@dataclass(frozen=True)
class StartFrom:
    position: str | None = None  # one of POSITIONS
    timestamp_ms: int | None = None  # milliseconds since the epoch, as Kafka's record timestamps

    @classmethod
    def parse(cls, value: Any, where: str, positions: tuple[str, ...] = POSITIONS) -> StartFrom:
        """From a resource's `startFrom` (exactly one of position, timestamp); StartFromError names `where`."""
        if not isinstance(value, dict) or len(value) != 1 or not {"position", "timestamp"} & value.keys():
            raise StartFromError(f"{where}: exactly one of position, timestamp")
        if "position" in value:
            if value["position"] not in positions:
                raise StartFromError(f"{where}.position must be one of {', '.join(positions)}")
            return cls(position=str(value["position"]))
        return cls(timestamp_ms=parse_time(value["timestamp"], f"{where}.timestamp"))

    def check(self, now_ms: int, where: str) -> StartFrom:
        """A time still to come has no records yet: refused, so a typo in the year is not a silent `latest`."""
        if self.timestamp_ms is not None and self.timestamp_ms > now_ms:
            raise StartFromError(f"{where}.timestamp {format_time(self.timestamp_ms)} is in the future")
        return self

    def to_dict(self) -> dict[str, str]:
        if self.timestamp_ms is not None:
            return {"timestamp": format_time(self.timestamp_ms)}
        return {"position": str(self.position)}

    def describe(self) -> str:
        return f"from {format_time(self.timestamp_ms)}" if self.timestamp_ms is not None else f"from {self.position}"


def parse_time(value: Any, where: str) -> int:
    """An RFC 3339 time (`Z` or an offset; a time without one is refused: whose 09:00?) in milliseconds."""
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise StartFromError(f"{where}: {value!r} is not an RFC 3339 time (2026-11-27T09:00:00Z)") from None
    if parsed.tzinfo is None:
        raise StartFromError(f"{where}: {value!r} has no time zone (end it in Z or +hh:mm)")
    return int(parsed.timestamp() * 1000)


def format_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def offset_at(found: int, high: int) -> int:
    """The offset to start from, given Kafka's offsets-for-times answer and the partition's watermarks:
    the first record at or after the time, or the end when there is none."""
    return high if found == NO_OFFSET else found


def before_retention(found: int, low: int) -> bool:
    """Whether the time is older than what Kafka keeps: the first record at or after it is the oldest kept,
    and records were deleted before that one (some of them may have been at or after the time)."""
    return found != NO_OFFSET and found == low and low > 0


def retention_message(where: str, timestamp_ms: int, topic: str, partition: int, low: int) -> str:
    """What a reader says when `before_retention` holds (the consumer's stop, the Transform run's failure)."""
    return (
        f"StartBeforeRetention: {where}.timestamp {format_time(timestamp_ms)} is older than what Kafka keeps of "
        f"{topic}/{partition} (offsets from {low}): records since then may be gone. Start from a later time, "
        "or from position earliest to take what is kept"
    )
