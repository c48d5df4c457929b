"""Change events as the consumer sees them, decoded from Kafka records (pure).

The SCN orders changes the way the source database does. For Debezium PostgreSQL events it is
`source.lsn` (the WAL position of the change), and a window is one source transaction
(`transaction.id`, present when the connector sets provide.transaction.metadata=true). For other
records (no Debezium envelope) the SCN is the Kafka offset and each record is its own window.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

# orjson reads integers outside [-2**63, 2**64) as floats. Such an integer has 20 digits or more, or is
# negative with 19: a record holding such a run goes to the exact parser. A positive 19-digit run is
# always below 2**64 and stays with orjson: Debezium's `ts_ns` has 19 digits, so the old rule (any 19)
# sent every Debezium record to json.loads. The runs are found by mapping every digit to "0", the minus
# sign to itself and anything else to " ": one pass in C, where a regular expression took ~13 ns a byte.
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= b <= 0x39 else b if b == 0x2D else 0x20 for b in range(256))
_LONG_DIGIT_RUN = b"0" * 20
_LONG_NEGATIVE_RUN = b"-" + b"0" * 19


@dataclass(slots=True)
class ChangeEvent:
    """One change, as callbacks receive it. Slotted and built once per record: this is the hot path."""

    topic: str
    partition: int
    offset: int
    key: str  # the row key, as a string (the record key, or the primary-key columns)
    op: str  # c (create), u (update), d (delete), r (snapshot read)
    scn: int
    window: str | int  # events with the same window id are one source transaction; else the offset
    after: dict[str, Any] | None = None
    before: dict[str, Any] | None = None
    ts_ms: int = 0
    raw: dict[str, Any] | None = field(default=None, compare=False, repr=False)  # the decoded record value

    @property
    def document(self) -> dict[str, Any] | None:
        """The row image to store: the after image, or None for a delete."""
        return None if self.op == "d" else self.after


class MalformedEvent(ValueError):
    pass


Parser = Callable[[bytes], Any]  # record bytes → Python values: parse_json, or fibers.wire.AvroDecoder


def has_long_integers(data: bytes) -> bool:
    """True when `data` may hold an integer orjson reads as a float (see _LONG_DIGIT_RUN). Records joined
    by a space can be checked in one call: no run crosses from one record into the next."""
    digits = data.translate(_DIGITS_AS_ZEROS)
    return _LONG_DIGIT_RUN in digits or _LONG_NEGATIVE_RUN in digits


def parse_json(data: bytes) -> Any:
    """json.loads, about four times faster: orjson, falling back to the standard parser where
    orjson differs — integers beyond 64 bits (orjson turns them into floats) and NaN/Infinity."""
    if not has_long_integers(data):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def batch_parser(values: list[bytes | None], parse: Parser) -> Parser:
    """The parser for a batch of record values: orjson itself when `parse` is parse_json and no value of
    the batch holds a long integer (one check for the batch instead of one per record), else `parse`.

    orjson refuses what json.loads reads and it does not (NaN, Infinity): `decode` reads such a record
    again with parse_json."""
    if parse is parse_json and not has_long_integers(b" ".join(filter(None, values))):
        return orjson.loads
    return parse


def _unwrap(decoded: Any) -> Any:
    """JsonConverter with schemas.enable=true wraps keys and values as {"schema": …, "payload": …}."""
    if type(decoded) is dict and len(decoded) == 2 and "schema" in decoded and "payload" in decoded:
        return decoded["payload"]
    return decoded


def _raw_key_text(key: bytes) -> str:
    """A key that is neither JSON nor a registry's: its text, or, when it is not UTF-8 (a Java serializer's
    long, say), its bytes in base64. Replacing the bytes UTF-8 cannot hold made every such key past 127 one
    key, and their rows one row."""
    try:
        return key.decode()
    except UnicodeDecodeError:
        return "b64:" + base64.b64encode(key).decode()


def _key_text(key: bytes | None, row: dict[str, Any] | None, parse: Parser = parse_json) -> str:
    if key:
        if key.isdigit():  # the common plain numeric key; json.loads would give the same text, slower
            return key.decode()
        try:  # a key the registry framed (magic byte 0) goes through `parse`; any other is JSON or text
            decoded = _unwrap((parse if key[:1] == b"\x00" else parse_json)(key))
        except Exception as exc:  # a decoder's errors vary; its server away is no reason to take the key as text
            if getattr(exc, "transient", False):
                raise
            return _raw_key_text(key)
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


def decode(
    topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None, parse: Parser = parse_json
) -> ChangeEvent | None:
    """A ChangeEvent, or None for a tombstone (Kafka's null value after a delete, which carries nothing).

    Called for every record the consumer reads: one parse (JSON, or Avro from the schema registry), and
    the event built positionally. Debezium's envelope reads the same either way.
    """
    if value is None:
        return None
    try:  # one try around it all: free while nothing raises, and every way a record can be bad is caught
        payload = parse(value)
        if type(payload) is dict and "payload" in payload and len(payload) == 2 and "schema" in payload:
            payload = payload["payload"]  # _unwrap, inline: this runs for every record
        if type(payload) is dict:
            if "op" in payload and "source" in payload:
                return _debezium(topic, partition, offset, key, payload, parse)
            row = payload
        elif payload is None:
            return None
        else:
            row = {"value": payload}
        text = key.decode() if key and key.isdigit() else _key_text(key, row, parse)  # the common key, inline
        return ChangeEvent(topic, partition, offset, text, "u", offset, offset, row, None, 0, row)
    except MalformedEvent:
        raise
    except Exception as exc:  # a decoder's errors vary (ValueError, EOFError, …), and so do an envelope's
        if parse is orjson.loads:  # a batch's fast parser (batch_parser): what it refuses, json.loads may read
            return decode(topic, partition, offset, key, value, parse_json)
        if getattr(exc, "transient", False):  # the decoder's server is away: not the record's fault
            raise
        what = "JSON" if parse is parse_json else "decodable"
        raise MalformedEvent(f"{topic}/{partition}@{offset}: not {what}: {type(exc).__name__}: {exc}") from None


def _debezium(
    topic: str, partition: int, offset: int, key: bytes | None, payload: dict[str, Any], parse: Parser
) -> ChangeEvent:
    source = payload.get("source") or {}
    tx = payload.get("transaction") or {}
    lsn = source.get("lsn")
    after, before = payload.get("after"), payload.get("before")
    return ChangeEvent(
        topic,
        partition,
        offset,
        _key_text(key, after or before, parse),
        payload["op"],
        int(lsn) if lsn is not None else offset,
        str(tx.get("id") or source.get("txId") or "") or offset,
        after,
        before,
        int(payload.get("ts_ms") or 0),
        payload,
    )
