"""The schema registry's wire format, and change events decoded from Avro (a tiny local HTTP server plays the
registry where its answers matter)."""

from __future__ import annotations

import http.server
import io
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import fastavro
import pytest

from fibers.consumer.events import MalformedEvent, decode
from fibers.wire import HEADER, AvroDecoder, Registry, RegistryUnavailable, WireFormatError, split

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


def test_a_truncated_avro_body_is_malformed_not_a_crash() -> None:
    """fastavro raises EOFError on a cut body, which is no ValueError: it escaped decode and ended the consumer."""
    whole = framed(7, {"before": None, "after": {"id": 4, "item": "tea"}, "op": "c", "ts_ms": 1, "source": {"lsn": 1}})
    with pytest.raises(MalformedEvent, match="not decodable"):
        decode("t", 0, 1, None, whole[:8], parse)


class _Registry(http.server.BaseHTTPRequestHandler):
    """A schema registry that answers with the status the test gives it."""

    status = 503

    def do_GET(self) -> None:
        body = json.dumps({"schema": '"string"'} if self.status == 200 else {"message": "busy"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def registry_server() -> Iterator[tuple[str, type[_Registry]]]:
    handler = type("Handler", (_Registry,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("status", [401, 403, 429, 500, 503])
def test_a_registry_that_is_busy_or_failing_is_unavailable_not_a_bad_record(
    registry_server: tuple[str, type[_Registry]], status: int
) -> None:
    """A registry outage used to read as MalformedEvent (WireFormatError is a ValueError): the consumer
    stopped on good records (or, with onUndecodable skip, would pass them all while its credentials were
    wrong). It is RegistryUnavailable now, which decode hands on for the runtime to wait out."""
    url, handler = registry_server
    handler.status = status
    decoder = AvroDecoder(Registry(url))
    with pytest.raises(RegistryUnavailable):
        decode("t", 0, 1, None, HEADER.pack(0, 9) + b"\x02", decoder)
    handler.status = 200
    assert decode("t", 0, 1, b"k", HEADER.pack(0, 9) + b"\x02a", decoder).after == {"value": "a"}  # type: ignore[union-attr]


def test_a_registry_that_does_not_answer_is_unavailable() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(RegistryUnavailable):
        Registry(f"http://127.0.0.1:{port}", timeout=2).schema_text(1)


def test_a_schema_the_registry_does_not_have_is_the_records_fault(registry_server: tuple[str, type[_Registry]]) -> None:
    url, handler = registry_server
    handler.status = 404
    with pytest.raises(MalformedEvent, match="HTTP 404"):
        decode("t", 0, 1, None, HEADER.pack(0, 9) + b"\x02", AvroDecoder(Registry(url)))
