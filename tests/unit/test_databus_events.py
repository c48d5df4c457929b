"""Decoding Kafka records into change events, and the window call order (pure, no servers)."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import orjson
import pytest

from fibers.consumer.callbacks import Callback, Result, Singles, WindowFailed, window_dispatcher
from fibers.consumer.events import (
    ChangeEvent,
    MalformedEvent,
    batch_parser,
    decode,
    has_long_integers,
    parse_json,
)


def debezium(op: str, after: dict[str, Any] | None, before: dict[str, Any] | None = None, **extra: Any) -> bytes:
    envelope = {
        "op": op,
        "after": after,
        "before": before,
        "source": {"lsn": 2400, "txId": 77},
        "ts_ms": 5,
        **extra,
    }
    return json.dumps(envelope).encode()


def test_parse_json_keeps_what_the_standard_parser_gives() -> None:
    huge = b'{"n": 123456789012345678901234567890}'
    assert parse_json(huge)["n"] == 123456789012345678901234567890  # not a float
    # Just outside 64 bits on either side: orjson would give floats.
    for edge in (b"[-9223372036854775809]", b"[18446744073709551616]", b"[18446744073709551615]"):
        assert parse_json(edge) == json.loads(edge) and type(parse_json(edge)[0]) is int, edge
    assert parse_json(b'{"x": NaN}')["x"] != parse_json(b'{"x": NaN}')["x"]  # NaN, as json.loads reads it
    assert parse_json(b'{"a": [1, 2.5, "s", null, true]}') == {"a": [1, 2.5, "s", None, True]}
    with pytest.raises(ValueError):
        parse_json(b"{not json")


def test_only_integers_orjson_cannot_hold_leave_the_fast_parser() -> None:
    """Debezium's envelope carries `ts_ns` (19 digits, below 2**64): it stays with orjson. The checked rule
    sent every Debezium record to json.loads, about four times slower."""
    record = debezium("c", {"id": 1}, ts_ns=1764300000123456789, ts_us=1764300000123456)
    assert not has_long_integers(record)
    assert parse_json(record)["ts_ns"] == 1764300000123456789
    # The integers orjson turns into floats: 20 digits or more, and negative ones of 19.
    for long in (b"[18446744073709551616]", b"[-9223372036854775809]", b'{"n": 123456789012345678901}'):
        assert has_long_integers(long), long
    for fits in (b"[9999999999999999999]", b"[-922337203685477580]", b'{"a": "x-1", "b": -1}'):
        assert not has_long_integers(fits), fits
        assert parse_json(fits) == json.loads(fits) == orjson.loads(fits)


def test_a_batch_is_checked_once_and_each_record_still_parses_as_json_loads_reads_it() -> None:
    clean = [b'{"id": 1}', None, b'{"id": 2, "n": 9999999999999999999}']
    assert batch_parser(clean, parse_json) is orjson.loads
    # One long integer anywhere in the batch: every record of it goes through the checked parser.
    assert batch_parser([*clean, b'{"id": 3, "n": 18446744073709551616}'], parse_json) is parse_json
    # Digits of two records never join into one run.
    assert batch_parser([b"[1234567890]", b"1234567890"], parse_json) is orjson.loads

    def avro(data: bytes) -> object:
        return data

    assert batch_parser(clean, avro) is avro  # only the JSON parser is replaced
    # What orjson refuses and json.loads reads (NaN) is read again by the checked parser.
    event = decode("t", 0, 5, b"1", b'{"id": 1, "x": NaN}', orjson.loads)
    assert event is not None and event.after is not None and event.after["x"] != event.after["x"]
    with pytest.raises(MalformedEvent):
        decode("t", 0, 5, b"1", b"{not json", orjson.loads)


def test_a_plain_record_is_its_own_window_with_the_offset_as_scn() -> None:
    event = decode("t", 0, 41, b"7", b'{"id": 7, "v": "x"}')
    assert event is not None
    assert (event.key, event.op, event.scn, event.window) == ("7", "u", 41, 41)
    assert event.document == {"id": 7, "v": "x"}


def test_keys_in_every_shape_give_the_same_text() -> None:
    value = b'{"id": 7}'
    shapes = [b"7", b'{"id": 7}', b'{"schema": {"type": "struct"}, "payload": {"id": 7}}', None]
    assert {decode("t", 0, 1, key, value).key for key in shapes} == {"7"}  # type: ignore[union-attr]
    assert decode("t", 0, 1, b"007", value).key == "007"  # type: ignore[union-attr]
    assert decode("t", 0, 1, b"not json", value).key == "not json"  # type: ignore[union-attr]
    composite = decode("t", 0, 1, b'{"b": 2, "a": 1}', value)
    assert composite is not None and composite.key == '{"a":1,"b":2}'


def test_a_debezium_event_carries_lsn_transaction_and_images() -> None:
    value = debezium("u", {"id": 1, "v": "new"}, {"id": 1, "v": "old"}, transaction={"id": "77:2400"})
    event = decode("t", 2, 9, b'{"id": 1}', value)
    assert event is not None
    assert (event.op, event.scn, event.window, event.partition, event.ts_ms) == ("u", 2400, "77:2400", 2, 5)
    assert event.before == {"id": 1, "v": "old"} and event.document == {"id": 1, "v": "new"}


def test_a_debezium_delete_has_no_document_and_is_keyed_by_its_before_image() -> None:
    event = decode("t", 0, 3, None, debezium("d", None, {"id": 4}))
    assert event is not None and event.key == "4" and event.document is None
    assert event.window == "77"  # no transaction metadata: the source transaction id


def test_schema_wrapped_values_are_unwrapped() -> None:
    inner = json.loads(debezium("c", {"id": 1}))
    event = decode("t", 0, 3, b"1", json.dumps({"schema": {}, "payload": inner}).encode())
    assert event is not None and event.op == "c" and event.scn == 2400


def test_tombstones_are_skipped_and_garbage_is_an_error() -> None:
    assert decode("t", 0, 1, b"1", None) is None
    with pytest.raises(MalformedEvent, match="t/0@1"):
        decode("t", 0, 1, b"1", b"\x00garbage")
    with pytest.raises(MalformedEvent, match="neither a key nor an id"):
        decode("t", 0, 1, None, b'{"v": 1}')


class Recorder(Callback):
    def __init__(self, fail: str = "") -> None:
        self.calls: list[str] = []
        self.fail = fail

    def _record(self, name: str) -> Result:
        self.calls.append(name)
        return Result.ERROR if name == self.fail else Result.SUCCESS

    def on_start_data_event_sequence(self, scn: int) -> Result:
        return self._record(f"start_seq:{scn}")

    def on_start_source(self, source: str) -> Result:
        return self._record(f"start_source:{source}")

    def on_data_event(self, event: ChangeEvent) -> Result:
        return self._record(f"event:{event.offset}")

    def on_end_source(self, source: str) -> Result:
        return self._record(f"end_source:{source}")

    def on_end_data_event_sequence(self, scn: int) -> Result:
        return self._record(f"end_seq:{scn}")

    def on_checkpoint(self, scn: int) -> Result:
        self.calls.append(f"checkpoint:{scn}")
        return Result.CHECKPOINT


def window(*offsets: int) -> list[ChangeEvent]:
    return [ChangeEvent("t", 0, o, str(o), "u", 100 + o, "w") for o in offsets]


def test_a_window_is_dispatched_in_the_databus_call_order() -> None:
    recorder, results = Recorder(), []
    window_dispatcher(recorder)(window(1, 2), results)
    assert results == [Result.CHECKPOINT]
    assert recorder.calls == [
        "start_seq:102",
        "start_source:t",
        "event:1",
        "event:2",
        "end_source:t",
        "end_seq:102",
        "checkpoint:102",
    ]


@pytest.mark.parametrize("fail", ["start_seq:102", "event:1", "end_seq:102"])
def test_an_error_result_fails_the_window_and_stops_its_calls(fail: str) -> None:
    recorder = Recorder(fail)
    with pytest.raises(WindowFailed, match="returned ERROR"):
        window_dispatcher(recorder)(window(1, 2), [])
    assert recorder.calls[-1] == fail


def test_a_consumer_implementing_only_some_callbacks_gets_those_and_its_result_counts() -> None:
    class EventsAndCheckpoint(Callback):
        def __init__(self) -> None:
            self.seen: list[int] = []

        def on_data_event(self, event: ChangeEvent) -> Result:
            self.seen.append(event.offset)
            return Result.SUCCESS

        def on_checkpoint(self, scn: int) -> Result:
            return Result.SKIP_CHECKPOINT

    sink, results = EventsAndCheckpoint(), []
    window_dispatcher(sink)(window(4, 5), results)
    assert results == [Result.SKIP_CHECKPOINT]
    assert sink.seen == [4, 5]
    window_dispatcher(Callback())(window(1), results)
    assert results == [Result.SKIP_CHECKPOINT, Result.SUCCESS]


def test_a_singles_run_is_a_window_per_record() -> None:
    recorder, results = Recorder(), []
    window_dispatcher(recorder)(Singles(window(1, 2)), results)
    assert results == [Result.CHECKPOINT, Result.CHECKPOINT]
    assert recorder.calls == [
        *("start_seq:101", "start_source:t", "event:1", "end_source:t", "end_seq:101", "checkpoint:101"),
        *("start_seq:102", "start_source:t", "event:2", "end_source:t", "end_seq:102", "checkpoint:102"),
    ]


@pytest.mark.parametrize("only_events", [True, False])
def test_a_failing_record_of_a_singles_run_leaves_the_records_before_it_done(only_events: bool) -> None:
    class FailsAtThree(Recorder):
        def on_data_event(self, event: ChangeEvent) -> Result:
            return Result.ERROR if event.offset == 3 else Result.SUCCESS

    class OnlyEvents(Callback):
        def on_data_event(self, event: ChangeEvent) -> Result:
            return Result.ERROR if event.offset == 3 else Result.SUCCESS

    results: list[Result] = []
    with pytest.raises(WindowFailed, match="offset 3"):
        window_dispatcher(OnlyEvents() if only_events else FailsAtThree())(Singles(window(1, 2, 3, 4)), results)
    assert len(results) == 2


@pytest.mark.parametrize(
    "value",
    [
        b'{"op": "c", "source": {"lsn": "x"}, "after": {"id": 1}}',  # an LSN that is no number
        b'{"op": "u", "source": "pg", "after": {"id": 1}}',  # a source that is no object
        b'{"op": "c", "source": {"lsn": 5}, "after": {"id": 1}, "ts_ms": "now"}',
    ],
)
def test_an_envelope_that_is_json_but_not_a_change_is_malformed_not_a_crash(value: bytes) -> None:
    """These raised ValueError or AttributeError out of decode, past the undecodable policy: a crash loop."""
    with pytest.raises(MalformedEvent, match="t/0@3: not JSON"):
        decode("t", 0, 3, b"1", value)


def test_keys_that_are_not_text_stay_apart() -> None:
    """Binary keys (a Java LongSerializer's, say) were read as text with the bytes UTF-8 cannot hold replaced:
    every key past 127 became one key, so their rows overwrote each other in a view, a Kafka sink and the
    bootstrap store. Such a key is now its bytes in base64; a key that is text reads as before."""
    value = b'{"qty": 1}'
    keys = [decode("t", 0, n, struct.pack(">q", n), value) for n in (128, 129, 255, 256)]
    assert len({event.key for event in keys if event is not None}) == 4
    assert (
        decode("t", 0, 1, struct.pack(">q", 128), value).key
        == "b64:" + base64.b64encode(struct.pack(">q", 128)).decode()
    )  # type: ignore[union-attr]
    assert decode("t", 0, 1, b"caf\xc3\xa9", value).key == "café"  # type: ignore[union-attr]
