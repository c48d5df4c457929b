"""The schema registry's wire format, and change events decoded from Avro (pure: no registry)."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest

from fibers.databus.events import MalformedEvent, decode
from fibers.wire import HEADER, WireFormatError, split

ROW = {"type": "record", "name": "Row", "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}]}
ENVELOPE = {
    "type": "record",
    "name": "Envelope",
    "fields": [
        {"name": "before", "type": ["null", ROW], "default": None},
        {"name": "after", "type": ["null", "Row"], "default": None},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": "long"},
        {
            "name": "source",
            "type": {"type": "record", "name": "Source", "fields": [{"name": "lsn", "type": ["null", "long"]}]},
        },
    ],
}
PARSED = fastavro.parse_schema(ENVELOPE)


def framed(schema_id: int, record: dict[str, Any]) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, PARSED, record)
    return HEADER.pack(0, schema_id) + body.getvalue()


def parse(data: bytes) -> Any:
    """What AvroDecoder does once the registry has answered for id 7."""
    schema_id, body = split(data)
    assert schema_id == 7
    return fastavro.schemaless_reader(io.BytesIO(body), PARSED, None)


def test_split_reads_the_id_and_leaves_the_body() -> None:
    assert split(b"\x00\x00\x00\x01\x02rest") == (258, b"rest")


@pytest.mark.parametrize("data", [b"", b"\x00\x00", b'{"id": 1}', b"\x01\x00\x00\x00\x01x"])
def test_split_refuses_what_is_not_framed(data: bytes) -> None:
    with pytest.raises(WireFormatError):
        split(data)


def test_a_debezium_envelope_in_avro_decodes_like_json() -> None:
    record = {"before": None, "after": {"id": 4, "item": "tea"}, "op": "c", "ts_ms": 99, "source": {"lsn": 1234}}
    event = decode("shop.public.orders", 0, 17, b'{"id": 4}', framed(7, record), parse)
    assert event is not None
    assert (event.op, event.scn, event.key, event.document, event.ts_ms) == (
        "c",
        1234,
        "4",
        {"id": 4, "item": "tea"},
        99,
    )


def test_a_value_that_is_not_framed_is_malformed_and_says_so() -> None:
    with pytest.raises(MalformedEvent, match="not decodable"):
        decode("t", 0, 1, None, b'{"id": 1}', parse)
