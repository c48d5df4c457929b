"""Change events as the consumer sees them, decoded from Kafka records (pure).

The SCN orders changes the way the source database does. For Debezium PostgreSQL events it is
`source.lsn` (the WAL position of the change), and a window is one source transaction
(`transaction.id`, present when the connector sets provide.transaction.metadata=true). For other
records (no Debezium envelope) the SCN is the Kafka offset and each record is its own window.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ChangeEvent:
    topic: str
    partition: int
    offset: int
    key: str  # the row key, as a string (the record key, or the primary-key columns)
    op: str  # c (create), u (update), d (delete), r (snapshot read)
    scn: int
    window: str  # events with the same window id belong to one source transaction
    after: dict[str, Any] | None = None
    before: dict[str, Any] | None = None
    ts_ms: int = 0
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def document(self) -> dict[str, Any] | None:
        """The row image to store: the after image, or None for a delete."""
        return None if self.op == "d" else self.after


class MalformedEvent(ValueError):
    pass


def _key_text(key: bytes | None, row: dict[str, Any] | None) -> str:
    if key:
        try:
            decoded = json.loads(key)
        except ValueError:
            return key.decode(errors="replace")
        if isinstance(decoded, dict):
            return (
                json.dumps(decoded, sort_keys=True, separators=(",", ":"))
                if len(decoded) != 1
                else str(next(iter(decoded.values())))
            )
        return str(decoded)
    if row and "id" in row:
        return str(row["id"])
    raise MalformedEvent("record has neither a key nor an id column")


def decode(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None) -> ChangeEvent | None:
    """A ChangeEvent, or None for a tombstone (Kafka's null value after a delete, which carries nothing)."""
    if value is None:
        return None
    try:
        payload = json.loads(value)
    except ValueError as exc:
        raise MalformedEvent(f"{topic}/{partition}@{offset}: value is not JSON: {exc}") from None
    if isinstance(payload, dict) and "payload" in payload and "schema" in payload:
        payload = payload["payload"]  # JsonConverter with schemas.enable=true
    if isinstance(payload, dict) and "op" in payload and "source" in payload:
        source = payload.get("source") or {}
        tx = payload.get("transaction") or {}
        lsn = source.get("lsn")
        scn = int(lsn) if lsn is not None else offset
        row = payload.get("after") or payload.get("before")
        return ChangeEvent(
            topic=topic,
            partition=partition,
            offset=offset,
            key=_key_text(key, row),
            op=payload["op"],
            scn=scn,
            window=str(tx.get("id") or source.get("txId") or f"offset:{offset}"),
            after=payload.get("after"),
            before=payload.get("before"),
            ts_ms=int(payload.get("ts_ms") or 0),
            raw=payload,
        )
    row = payload if isinstance(payload, dict) else {"value": payload}
    return ChangeEvent(
        topic=topic,
        partition=partition,
        offset=offset,
        key=_key_text(key, row),
        op="u",
        scn=offset,
        window=f"offset:{offset}",
        after=row,
        raw=row,
    )
