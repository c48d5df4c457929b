from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

from fibers.databus.checkpoint import Checkpoint, CheckpointError, ConsumptionMode
from fibers.databus.timelines import (
    SOURCES_HASH_KEY,
    Checkpoints,
    min_scn,
    parse_timeline_key,
    sources_hash,
    timeline_key,
)

ONLINE_SAMPLE = (
    '{"windowOffset":-1,"snapshot_offset":-1,"prevScn":-1,"windowScn":5984508975840,'
    '"consumption_mode":"ONLINE_CONSUMPTION"}'
)
BOOTSTRAP_SAMPLE = (
    '{"snapshot_offset":0,"prevScn":5984488321377,"windowScn":5984488321377,"consumption_mode":"BOOTSTRAP_SNAPSHOT",'
    '"windowOffset":-1,"bootstrap_since_scn":5984488321377,"bootstrap_start_scn":-1,"bootstrap_target_scn":-1,'
    '"bootstrap_snapshot_source_index":0,"bootstrap_catchup_source_index":0,"bootstrap_server_info":null,'
    '"snapshot_source":"com.linkedin.databus.example.Person"}'
)
PERSON = "com.linkedin.databus.example.Person"


# --- parsing and round trips -------------------------------------------------------------------


def test_online_sample_parses_with_databus_defaults() -> None:
    cp = Checkpoint.parse(ONLINE_SAMPLE)
    assert cp.consumption_mode is ConsumptionMode.ONLINE_CONSUMPTION
    assert cp.window_scn == 5984508975840
    assert cp.prev_scn == -1
    assert cp.window_offset == -1
    assert cp.snapshot_offset == -1
    assert cp.ts_nsecs == -1  # absent in the sample
    assert cp.bootstrap_since_scn == -1
    assert cp.snapshot_source is None
    assert not cp.is_flexible
    assert cp.validate() is cp


def test_bootstrap_sample_parses() -> None:
    cp = Checkpoint.parse(BOOTSTRAP_SAMPLE)
    assert cp.consumption_mode is ConsumptionMode.BOOTSTRAP_SNAPSHOT
    assert (cp.window_scn, cp.prev_scn, cp.window_offset) == (5984488321377, 5984488321377, -1)
    assert cp.snapshot_offset == 0
    assert cp.bootstrap_since_scn == 5984488321377
    assert (cp.bootstrap_start_scn, cp.bootstrap_target_scn) == (-1, -1)
    assert (cp.bootstrap_snapshot_source_index, cp.bootstrap_catchup_source_index) == (0, 0)
    assert cp.bootstrap_server_info is None
    assert cp.snapshot_source == PERSON
    assert cp.catchup_source is None
    cp.validate()


@pytest.mark.parametrize("sample", [ONLINE_SAMPLE, BOOTSTRAP_SAMPLE], ids=["online", "bootstrap"])
def test_samples_round_trip(sample: str) -> None:
    written = Checkpoint.parse(sample).to_json()
    assert json.loads(written) == json.loads(sample)
    assert list(json.loads(written)) == list(json.loads(sample))  # key order kept too
    assert written == sample  # compact, like the Databus writer
    assert Checkpoint.parse(written) == Checkpoint.parse(sample)


def test_missing_fields_default_and_are_not_added_on_output() -> None:
    cp = Checkpoint.parse("{}")
    assert cp.consumption_mode is ConsumptionMode.INIT
    assert (cp.window_scn, cp.prev_scn, cp.window_offset, cp.snapshot_offset, cp.ts_nsecs) == (-1, -1, -1, -1, -1)
    assert (cp.bootstrap_since_scn, cp.bootstrap_start_scn, cp.bootstrap_target_scn) == (-1, -1, -1)
    assert (cp.bootstrap_snapshot_source_index, cp.bootstrap_catchup_source_index) == (0, 0)
    assert (cp.snapshot_source, cp.catchup_source, cp.bootstrap_server_info) == (None, None, None)
    assert cp.is_flexible
    assert cp.to_json() == "{}"


def test_numbers_may_be_strings_or_floats() -> None:
    cp = Checkpoint.parse(
        '{"consumption_mode":"ONLINE_CONSUMPTION","windowScn":"5984508975840","prevScn":5984508975840.0,'
        '"windowOffset":" -1 ","tsNsecs":"1.7e9","bootstrap_snapshot_source_index":"2"}'
    )
    assert cp.window_scn == 5984508975840 and type(cp.window_scn) is int
    assert cp.prev_scn == 5984508975840 and type(cp.prev_scn) is int
    assert cp.window_offset == -1
    assert cp.ts_nsecs == 1_700_000_000
    assert cp.bootstrap_snapshot_source_index == 2
    assert json.loads(cp.to_json()) == {
        "consumption_mode": "ONLINE_CONSUMPTION",
        "windowScn": 5984508975840,
        "prevScn": 5984508975840,
        "windowOffset": -1,
        "tsNsecs": 1_700_000_000,
        "bootstrap_snapshot_source_index": 2,
    }
    cp.validate()


def test_big_scn_in_a_string_keeps_every_digit() -> None:
    assert Checkpoint.parse('{"windowScn":"9007199254740993"}').window_scn == 9007199254740993


def test_unknown_keys_survive_parse_transition_and_write() -> None:
    text = ONLINE_SAMPLE[:-1] + ',"kafka_next_offset":42,"storage_cluster_name":"","extra":{"a":[1,null,true]}}'
    cp = Checkpoint.parse(text)
    assert cp.get("kafka_next_offset") == 42
    assert json.loads(cp.to_json()) == json.loads(text)
    after = cp.online(5984508975841)
    assert after.get("extra") == {"a": [1, None, True]}
    assert after.get("storage_cluster_name") == ""


def test_checkpoint_is_not_changed_through_its_accessors() -> None:
    cp = Checkpoint({"extra": {"a": [1]}})
    cp.as_dict()["extra"] = "x"
    got = cp.get("extra")
    assert isinstance(got, dict)
    got["a"] = "y"
    assert cp.get("extra") == {"a": [1]}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("not json", "not valid JSON"),
        ("", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('"ONLINE_CONSUMPTION"', "JSON object"),
        ('{"windowScn": NaN}', "NaN"),
        ('{"consumption_mode":"STREAMING"}', "'consumption_mode'"),
        ('{"consumption_mode":"online_consumption"}', "'consumption_mode'"),
        ('{"consumption_mode":null}', "'consumption_mode'"),
        ('{"windowScn":"abc"}', "'windowScn'"),
        ('{"prevScn":true}', "'prevScn'"),
        ('{"windowOffset":null}', "'windowOffset'"),
        ('{"snapshot_offset":1.5}', "'snapshot_offset'"),
        ('{"tsNsecs":"12.5"}', "'tsNsecs'"),
        ('{"bootstrap_target_scn":[1]}', "'bootstrap_target_scn'"),
        ('{"bootstrap_since_scn":"Infinity"}', "'bootstrap_since_scn'"),
        ('{"bootstrap_catchup_source_index":{}}', "'bootstrap_catchup_source_index'"),
        ('{"snapshot_source":5}', "'snapshot_source'"),
        ('{"bootstrap_server_info":["h",1]}', "'bootstrap_server_info'"),
    ],
)
def test_malformed_input_raises_naming_the_problem(text: str, named: str) -> None:
    with pytest.raises(CheckpointError, match=re.escape(named)) as info:
        Checkpoint.parse(text)
    assert isinstance(info.value, ValueError)


def test_values_that_are_not_json_are_refused() -> None:
    with pytest.raises(CheckpointError, match="plain JSON"):
        Checkpoint({"when": object()})


# --- invariants ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"consumption_mode": "ONLINE_CONSUMPTION", "windowScn": -1},  # flexible
        {"consumption_mode": "ONLINE_CONSUMPTION", "windowScn": -5, "prevScn": 3},  # flexible, stray prevScn
        {"consumption_mode": "ONLINE_CONSUMPTION", "windowScn": 7, "prevScn": 7, "windowOffset": -1},
        {"consumption_mode": "ONLINE_CONSUMPTION", "windowScn": 7, "prevScn": 5, "windowOffset": 3},  # mid-window
        {"consumption_mode": "INIT"},
        {
            "consumption_mode": "BOOTSTRAP_SNAPSHOT",
            "bootstrap_since_scn": 0,
            "bootstrap_start_scn": 10,
            "snapshot_offset": 55,
            "bootstrap_snapshot_source_index": 1,
            "bootstrap_target_scn": 20,
        },
        {
            "consumption_mode": "BOOTSTRAP_CATCHUP",
            "bootstrap_since_scn": 0,
            "bootstrap_start_scn": 10,
            "bootstrap_target_scn": 10,
            "bootstrap_snapshot_source_index": 2,
            "bootstrap_catchup_source_index": 2,
        },
    ],
)
def test_valid_checkpoints_pass(fields: dict[str, object]) -> None:
    Checkpoint(fields).validate()


ONLINE = {"consumption_mode": "ONLINE_CONSUMPTION"}
SNAPSHOT = {"consumption_mode": "BOOTSTRAP_SNAPSHOT", "bootstrap_since_scn": 5, "snapshot_offset": 0}
CATCHUP = {
    "consumption_mode": "BOOTSTRAP_CATCHUP",
    "bootstrap_since_scn": 5,
    "bootstrap_start_scn": 10,
    "bootstrap_target_scn": 20,
    "bootstrap_snapshot_source_index": 1,
}


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({**ONLINE, "windowScn": -1, "tsNsecs": 123}, "windowScn >= 0 unless flexible"),
        ({**ONLINE, "windowScn": 7, "windowOffset": -2}, "windowOffset >= 0 or == -1"),
        (
            {**ONLINE, "windowScn": 7, "prevScn": 6, "windowOffset": -1},
            "prevScn is -1 or windowScn when windowOffset == -1",
        ),
        ({**ONLINE, "windowScn": 7, "prevScn": 8, "windowOffset": 2}, "prevScn <= windowScn"),
        ({**SNAPSHOT, "bootstrap_catchup_source_index": 1}, "catchup index is 0"),
        ({**SNAPSHOT, "bootstrap_since_scn": -1}, "since-SCN is set"),
        ({**SNAPSHOT, "bootstrap_snapshot_source_index": 1}, "snapshot index is 0 until start-SCN is set"),
        ({**SNAPSHOT, "snapshot_offset": 3}, "snapshot_offset is 0 until start-SCN is set"),
        ({**SNAPSHOT, "snapshot_offset": -1}, "snapshot_offset is 0 until start-SCN is set"),
        ({**SNAPSHOT, "bootstrap_target_scn": 9}, "target-SCN is unset until start-SCN is set"),
        ({**CATCHUP, "bootstrap_since_scn": -1}, "since-SCN is set"),
        ({**CATCHUP, "bootstrap_start_scn": -1}, "start-SCN is set"),
        ({**CATCHUP, "bootstrap_target_scn": -1}, "target-SCN is set"),
        ({**CATCHUP, "snapshot_offset": 0}, "snapshot_offset is -1"),
        ({**CATCHUP, "bootstrap_target_scn": 9}, "target-SCN >= start-SCN"),
        ({**CATCHUP, "bootstrap_catchup_source_index": 2}, "0 <= catchup index <= snapshot index"),
        ({**CATCHUP, "bootstrap_catchup_source_index": -1}, "0 <= catchup index <= snapshot index"),
    ],
)
def test_invariant_violations_are_detected(fields: dict[str, object], rule: str) -> None:
    cp = Checkpoint(fields)
    with pytest.raises(CheckpointError, match=re.escape(f"rule '{rule}' violated")):
        cp.validate()


def test_parse_does_not_validate_so_a_bad_checkpoint_can_be_inspected() -> None:
    cp = Checkpoint.parse('{"consumption_mode":"BOOTSTRAP_CATCHUP"}')
    assert cp.consumption_mode is ConsumptionMode.BOOTSTRAP_CATCHUP
    with pytest.raises(CheckpointError, match="since-SCN is set"):
        cp.validate()


# --- transitions --------------------------------------------------------------------------------


def test_initial_is_an_empty_flexible_init_checkpoint() -> None:
    cp = Checkpoint.initial()
    assert cp.consumption_mode is ConsumptionMode.INIT
    assert cp.is_flexible
    assert json.loads(cp.to_json()) == {
        "consumption_mode": "INIT",
        "windowScn": -1,
        "prevScn": -1,
        "windowOffset": -1,
        "snapshot_offset": -1,
    }


def test_online_persists_whole_windows_only() -> None:
    first = Checkpoint.initial().online(100, ts_nsecs=1_000)
    assert first.consumption_mode is ConsumptionMode.ONLINE_CONSUMPTION
    assert (first.window_scn, first.prev_scn, first.window_offset, first.ts_nsecs) == (100, 100, -1, 1_000)
    second = first.online(105)
    assert (second.window_scn, second.prev_scn, second.window_offset) == (105, 105, -1)
    assert second.ts_nsecs == -1 and second.get("tsNsecs") is None  # unset, not stale
    assert first.window_scn == 100  # transitions never change the original
    # An empty window can be checkpointed again at the same SCN; going back cannot.
    assert second.online(105) == second
    with pytest.raises(CheckpointError, match="behind windowScn 105"):
        second.online(104)
    with pytest.raises(CheckpointError, match=">= 0"):
        second.online(-1)


def test_online_after_the_online_sample_keeps_its_shape() -> None:
    cp = Checkpoint.parse(ONLINE_SAMPLE).online(5984508975845)
    assert json.loads(cp.to_json()) == {
        "windowOffset": -1,
        "snapshot_offset": -1,
        "prevScn": 5984508975845,
        "windowScn": 5984508975845,
        "consumption_mode": "ONLINE_CONSUMPTION",
    }


def test_start_bootstrap_from_an_online_checkpoint_gives_the_sample() -> None:
    scn = 5984488321377
    cp = Checkpoint.initial().online(scn).start_bootstrap(scn, PERSON)
    assert cp.as_dict() == json.loads(BOOTSTRAP_SAMPLE)


def test_full_walk_init_snapshot_catchup_online() -> None:
    sources = ["db.orders"]
    cp = Checkpoint.initial().online(90)
    assert (cp.window_scn, cp.prev_scn, cp.window_offset) == (90, 90, -1)

    # Fell off the relay after window 90.
    cp = cp.start_bootstrap(since_scn=90, first_source=sources[0])
    assert cp.consumption_mode is ConsumptionMode.BOOTSTRAP_SNAPSHOT
    assert (cp.window_scn, cp.window_offset, cp.snapshot_offset) == (90, -1, 0)
    assert (cp.bootstrap_since_scn, cp.bootstrap_start_scn, cp.bootstrap_target_scn) == (90, -1, -1)
    assert (cp.bootstrap_snapshot_source_index, cp.bootstrap_catchup_source_index) == (0, 0)
    assert cp.snapshot_source == "db.orders"

    cp = cp.with_start_scn(120, server_info="mongo-gen-7")
    assert (cp.bootstrap_start_scn, cp.bootstrap_server_info, cp.snapshot_offset) == (120, "mongo-gen-7", 0)

    cp = cp.snapshot_progress(500).snapshot_progress(1_000)
    assert cp.snapshot_offset == 1_000
    assert cp.window_scn == 90  # the snapshot leaves windowScn at since

    cp = cp.end_snapshot_source(None)
    assert cp.consumption_mode is ConsumptionMode.BOOTSTRAP_SNAPSHOT
    assert (cp.snapshot_offset, cp.bootstrap_snapshot_source_index, cp.snapshot_source) == (-1, 1, "")

    cp = cp.start_catchup(150, source="db.orders")
    assert cp.consumption_mode is ConsumptionMode.BOOTSTRAP_CATCHUP
    assert (cp.bootstrap_target_scn, cp.bootstrap_catchup_source_index, cp.catchup_source) == (150, 0, "db.orders")
    assert (cp.window_scn, cp.window_offset, cp.snapshot_offset) == (120, 0, -1)

    cp = cp.catchup_progress(window_scn=130, row_id=77).catchup_progress(window_scn=150, row_id=81)
    assert (cp.window_scn, cp.window_offset) == (150, 81)

    cp = cp.end_catchup_source()
    assert cp.consumption_mode is ConsumptionMode.BOOTSTRAP_CATCHUP
    assert (cp.bootstrap_catchup_source_index, cp.window_offset) == (1, -1)

    cp = cp.finish_bootstrap()
    assert cp.consumption_mode is ConsumptionMode.ONLINE_CONSUMPTION
    assert (cp.window_scn, cp.prev_scn, cp.window_offset, cp.snapshot_offset) == (150, 150, -1, -1)
    assert (cp.bootstrap_since_scn, cp.bootstrap_start_scn, cp.bootstrap_target_scn) == (-1, -1, -1)
    assert (cp.bootstrap_snapshot_source_index, cp.bootstrap_catchup_source_index) == (0, 0)
    assert cp.bootstrap_server_info is None
    assert not cp.is_flexible
    assert cp.online(151).window_scn == 151


def test_two_sources_follow_the_databus_order() -> None:
    """Snap(A), Catch(A), Snap(B), Catch(A), Catch(B), online."""
    cp = Checkpoint.initial().start_bootstrap(0, "A").with_start_scn(10)
    cp = cp.snapshot_progress(3).end_snapshot_source("B").start_catchup(20, source="A")
    assert (cp.bootstrap_catchup_source_index, cp.bootstrap_snapshot_source_index, cp.snapshot_source) == (0, 1, "B")
    cp = cp.catchup_progress(20, 9)

    cp = cp.end_catchup_source()  # A caught up; B still needs its snapshot
    assert cp.consumption_mode is ConsumptionMode.BOOTSTRAP_SNAPSHOT
    assert (cp.snapshot_offset, cp.bootstrap_snapshot_source_index, cp.bootstrap_catchup_source_index) == (0, 1, 0)
    assert (cp.snapshot_source, cp.catchup_source, cp.bootstrap_start_scn) == ("B", None, 10)
    with pytest.raises(CheckpointError, match="already set to 10"):
        cp.with_start_scn(11)  # the start SCN is reused for every source

    cp = cp.snapshot_progress(4).end_snapshot_source(None).start_catchup(30, source="A")
    assert (cp.window_scn, cp.window_offset, cp.bootstrap_target_scn) == (10, 0, 30)
    assert (cp.bootstrap_catchup_source_index, cp.bootstrap_snapshot_source_index) == (0, 2)

    cp = cp.catchup_progress(25, 4).end_catchup_source("B")  # Catch(A) done, Catch(B) starts over at start SCN
    assert cp.consumption_mode is ConsumptionMode.BOOTSTRAP_CATCHUP
    assert (cp.bootstrap_catchup_source_index, cp.catchup_source, cp.window_scn, cp.window_offset) == (1, "B", 10, 0)
    with pytest.raises(CheckpointError, match="sources remain"):
        cp.finish_bootstrap()

    cp = cp.catchup_progress(30, 2).end_catchup_source()
    assert cp.bootstrap_catchup_source_index == 2
    done = cp.finish_bootstrap()
    assert (done.consumption_mode, done.window_scn, done.prev_scn) == (ConsumptionMode.ONLINE_CONSUMPTION, 30, 30)
    with pytest.raises(CheckpointError, match="already caught up"):
        cp.end_catchup_source()


def test_start_scn_can_be_set_only_once() -> None:
    cp = Checkpoint.initial().start_bootstrap(5, PERSON).with_start_scn(10)
    with pytest.raises(CheckpointError, match="bootstrap_start_scn is already set to 10; it may be set only once"):
        cp.with_start_scn(12)
    with pytest.raises(CheckpointError, match="already set"):
        cp.with_start_scn(10)


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (lambda cp: cp.online(10), "online: needs consumption_mode INIT or ONLINE_CONSUMPTION"),
        (lambda cp: cp.start_bootstrap(5, "A"), "start_bootstrap: needs"),
        (lambda cp: cp.snapshot_progress(3), "start SCN must be set before any snapshot row"),
        (lambda cp: cp.end_snapshot_source(None), "start SCN must be set before a snapshot can end"),
        (lambda cp: cp.start_catchup(10), "call end_snapshot_source() first"),
        (lambda cp: cp.with_start_scn(-3), "start SCN must be >= 0"),
        (lambda cp: cp.catchup_progress(10, 1), "catchup_progress: needs consumption_mode BOOTSTRAP_CATCHUP"),
        (lambda cp: cp.finish_bootstrap(), "finish_bootstrap: needs consumption_mode BOOTSTRAP_CATCHUP"),
    ],
)
def test_steps_refused_at_the_start_of_a_snapshot(step: Callable[[Checkpoint], Checkpoint], message: str) -> None:
    cp = Checkpoint.initial().start_bootstrap(5, "A")
    with pytest.raises(CheckpointError, match=re.escape(message)):
        step(cp)


def test_out_of_order_bootstrap_steps_are_refused() -> None:
    started = Checkpoint.initial().start_bootstrap(5, "A").with_start_scn(10)
    with pytest.raises(CheckpointError, match="since_scn must be >= 0"):
        Checkpoint.initial().start_bootstrap(-1, "A")
    with pytest.raises(CheckpointError, match="first_source"):
        Checkpoint.initial().start_bootstrap(0, "")
    with pytest.raises(CheckpointError, match="behind snapshot_offset 8"):
        started.snapshot_progress(8).snapshot_progress(7)
    ended = started.end_snapshot_source(None)
    with pytest.raises(CheckpointError, match="already complete"):
        ended.snapshot_progress(9)
    with pytest.raises(CheckpointError, match="already ended"):
        ended.end_snapshot_source(None)
    with pytest.raises(CheckpointError, match="target SCN 9 is below the start SCN 10"):
        ended.start_catchup(9)
    catching = ended.start_catchup(20)
    assert catching.catchup_source is None
    with pytest.raises(CheckpointError, match=re.escape("outside [10, 20]")):
        catching.catchup_progress(21, 1)
    with pytest.raises(CheckpointError, match=re.escape("outside [10, 20]")):
        catching.catchup_progress(9, 1)
    with pytest.raises(CheckpointError, match="behind windowScn 15"):
        catching.catchup_progress(15, 3).catchup_progress(14, 4)
    with pytest.raises(CheckpointError, match="row id must be >= 0"):
        catching.catchup_progress(15, -1)
    with pytest.raises(CheckpointError, match="last catchup source"):
        catching.end_catchup_source("B")


def test_a_later_target_may_not_go_back() -> None:
    cp = Checkpoint.initial().start_bootstrap(0, "A").with_start_scn(10).end_snapshot_source("B")
    cp = cp.start_catchup(30).end_catchup_source().end_snapshot_source(None)
    assert cp.bootstrap_target_scn == 30
    with pytest.raises(CheckpointError, match="behind the previous target 30"):
        cp.start_catchup(25)


def test_with_values_sets_extension_keys_and_keeps_types_checked() -> None:
    cp = Checkpoint.parse(ONLINE_SAMPLE).with_values({"kafka_next_offset": 43})
    assert cp.get("kafka_next_offset") == 43
    assert cp.window_scn == 5984508975840
    with pytest.raises(CheckpointError, match="'windowScn'"):
        cp.with_values({"windowScn": "soon"})


# --- many timelines in a ConfigMap --------------------------------------------------------------


def test_timeline_keys() -> None:
    assert timeline_key("orders", 0) == "orders.0"
    assert timeline_key("dbz.shop.orders", 12) == "dbz.shop.orders.12"
    assert parse_timeline_key("dbz.shop.orders.12") == ("dbz.shop.orders", 12)
    assert parse_timeline_key("my-topic-3.1") == ("my-topic-3", 1)
    for key in ("orders", "orders.", ".0", "orders.-1", "orders.01", "or/ders.0", SOURCES_HASH_KEY):
        with pytest.raises(CheckpointError, match=re.escape(repr(key))):
            parse_timeline_key(key)
    with pytest.raises(CheckpointError, match="legal Kafka topic"):
        timeline_key("orders/x", 0)
    with pytest.raises(CheckpointError, match="partition must be >= 0"):
        timeline_key("orders", -1)


def test_sources_hash_depends_on_order() -> None:
    assert sources_hash(["a", "b"]) == sources_hash(("a", "b"))
    assert sources_hash(["a", "b"]) != sources_hash(["b", "a"])
    assert sources_hash(["a,b"]) != sources_hash(["a", "b"])
    assert re.fullmatch(r"[0-9a-f]{64}", sources_hash(["a"]))


def _two_timelines() -> Checkpoints:
    sources = ["dbz.shop.orders", "dbz.shop.customers"]
    online = Checkpoint.parse(ONLINE_SAMPLE)
    bootstrapping = Checkpoint.parse(BOOTSTRAP_SAMPLE)
    return (
        Checkpoints(sources)
        .with_checkpoint(timeline_key("orders", 0), online)
        .with_checkpoint(timeline_key("orders", 1), bootstrapping)
    )


def test_configmap_data_round_trip() -> None:
    checkpoints = _two_timelines()
    data = checkpoints.to_configmap_data()
    assert set(data) == {"orders.0", "orders.1", SOURCES_HASH_KEY}
    assert all(re.fullmatch(r"[-._a-zA-Z0-9]+", key) for key in data)
    assert data["orders.0"] == ONLINE_SAMPLE
    assert json.loads(data["orders.1"]) == json.loads(BOOTSTRAP_SAMPLE)
    assert data[SOURCES_HASH_KEY] == sources_hash(["dbz.shop.orders", "dbz.shop.customers"])

    back = Checkpoints.from_configmap_data(data, ["dbz.shop.orders", "dbz.shop.customers"])
    assert back == checkpoints
    assert back["orders.1"].snapshot_source == PERSON
    assert back.to_configmap_data() == data
    assert len(back) == 2 and list(back) == ["orders.0", "orders.1"]


def test_with_checkpoint_replaces_and_leaves_the_original_alone() -> None:
    checkpoints = _two_timelines()
    updated = checkpoints.with_checkpoint("orders.0", checkpoints["orders.0"].online(5984508975999))
    assert updated["orders.0"].window_scn == 5984508975999
    assert checkpoints["orders.0"].window_scn == 5984508975840
    assert updated != checkpoints


def test_configmap_written_for_other_source_order_is_refused() -> None:
    data = _two_timelines().to_configmap_data()
    with pytest.raises(CheckpointError, match=re.escape(f"{SOURCES_HASH_KEY} mismatch")):
        Checkpoints.from_configmap_data(data, ["dbz.shop.customers", "dbz.shop.orders"])
    with pytest.raises(CheckpointError, match="mismatch"):
        Checkpoints.from_configmap_data(data, ["dbz.shop.orders"])


def test_configmap_without_hash_is_refused_unless_empty() -> None:
    data = _two_timelines().to_configmap_data()
    del data[SOURCES_HASH_KEY]
    with pytest.raises(CheckpointError, match=re.escape("no 'sources.sha256'")):
        Checkpoints.from_configmap_data(data, ["dbz.shop.orders", "dbz.shop.customers"])
    empty = Checkpoints.from_configmap_data({}, ["a"])
    assert len(empty) == 0 and empty.sources == ("a",)
    assert len(Checkpoints.from_configmap_data(None, ["a"])) == 0


def test_malformed_configmap_entry_names_the_key() -> None:
    data = _two_timelines().to_configmap_data()
    data["orders.1"] = '{"windowScn":"later"}'
    with pytest.raises(CheckpointError, match=r"ConfigMap key 'orders\.1': .*'windowScn'"):
        Checkpoints.from_configmap_data(data, ["dbz.shop.orders", "dbz.shop.customers"])
    data = _two_timelines().to_configmap_data()
    data["notes"] = "hello"
    with pytest.raises(CheckpointError, match="ConfigMap key 'notes'"):
        Checkpoints.from_configmap_data(data, ["dbz.shop.orders", "dbz.shop.customers"])


@pytest.mark.parametrize("sources", [[], ["a", "a"], ["a", ""]])
def test_source_list_must_be_usable(sources: list[str]) -> None:
    with pytest.raises(CheckpointError, match="sources must be"):
        Checkpoints(sources)


def test_min_scn_ignores_timelines_without_a_position() -> None:
    online = Checkpoint.initial().online(100)
    later = Checkpoint.initial().online(250)
    assert min_scn([later, online, Checkpoint.initial()]) == 100
    assert min_scn([Checkpoint.initial(), Checkpoint.parse('{"windowScn":-1}')]) is None
    assert min_scn([]) is None
    checkpoints = Checkpoints(["a"]).with_checkpoint("t.0", later).with_checkpoint("t.1", online)
    assert min_scn(checkpoints) == 100
