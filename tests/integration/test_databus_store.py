"""The MongoDB writers of the Databus sinks against the real MongoDB-protocol server (FerretDB)."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import MongoClient

from fibers.databus.events import ChangeEvent
from fibers.databus.store import BootstrapStore, GuardedCollection, pages

pytestmark = pytest.mark.databus


def change(key: str, scn: int, op: str = "u", **row: Any) -> ChangeEvent:
    return ChangeEvent("t", 0, scn, key, op, scn, scn, None if op == "d" else {"id": key, **row})


def test_a_replay_never_moves_a_document_back(mongo: MongoClient[dict[str, Any]], unique: str) -> None:
    collection = mongo["guarded"][unique]
    writer = GuardedCollection(collection)
    writer.apply([change("a", 10, v=1), change("b", 11, v=1), change("a", 12, v=2)])
    writer.apply([change("b", 13, "d")])
    assert {d["_id"]: (d["v"], d["_scn"]) for d in collection.find()} == {"a": (2, 12)}

    writer.apply([change("a", 10, v=1), change("b", 11, v=1)])  # older changes delivered again: skipped,
    assert {d["_id"]: (d["v"], d["_scn"]) for d in collection.find()} == {"a": (2, 12)}  # b stays deleted
    # A new owner remembers nothing and reads what is stored; its replay runs up to the delete again.
    GuardedCollection(collection).apply([change("a", 10, v=1), change("b", 11, v=1), change("b", 13, "d")])
    assert {d["_id"]: (d["v"], d["_scn"]) for d in collection.find()} == {"a": (2, 12)}

    writer.apply([change("b", 20, v=3)])  # a newer change of a deleted key is applied
    assert collection.find_one({"_id": "b"}) == {"_id": "b", "id": "b", "v": 3, "_scn": 20}


def test_a_new_owner_inserts_new_rows_and_keeps_newer_stored_ones(
    mongo: MongoClient[dict[str, Any]], unique: str
) -> None:
    """New rows are inserted without a read; a stored row the insert collides with goes through the guard."""
    collection = mongo["guarded"][unique]
    GuardedCollection(collection).apply([change(f"k{i:03d}", 100 + i, v="stored") for i in range(0, 120, 2)])
    # More keys than one bulk and than FEW_KEYS, half of them stored (with newer SCNs than the replay's).
    replay = [change(f"k{i:03d}", 50 + i, v="replayed") for i in range(120)]
    GuardedCollection(collection).apply(replay)
    docs = {d["_id"]: (d["v"], d["_scn"]) for d in collection.find()}
    assert len(docs) == 120
    assert all(docs[f"k{i:03d}"] == ("stored", 100 + i) for i in range(0, 120, 2))
    assert all(docs[f"k{i:03d}"] == ("replayed", 50 + i) for i in range(1, 120, 2))
    # A newer change of a stored key, unknown to a third owner, replaces it.
    GuardedCollection(collection).apply([change("k000", 500, v="newer"), change("k001", 10, v="older")])
    assert collection.find_one({"_id": "k000"}) == {"_id": "k000", "id": "k000", "v": "newer", "_scn": 500}
    assert collection.find_one({"_id": "k001"})["v"] == "replayed"


def test_more_changes_than_one_bulk_write_are_all_applied(mongo: MongoClient[dict[str, Any]], unique: str) -> None:
    collection = mongo["guarded"][unique]
    GuardedCollection(collection, {"_partition": 0}).apply([change(f"k{i:03d}", i + 1, v=i) for i in range(180)])
    assert collection.count_documents({"_partition": 0}) == 180


def test_pages_walk_a_collection_in_id_order_and_resume_after_a_key(
    mongo: MongoClient[dict[str, Any]], unique: str
) -> None:
    collection = mongo["paged"][unique]
    collection.insert_many([{"_id": f"{i:04d}", "p": i % 2} for i in range(230)])
    walked = [[d["_id"] for d in page] for page in pages(collection, {"p": 0}, None, 50)]
    assert [len(page) for page in walked] == [50, 50, 15]
    assert [key for page in walked for key in page] == [f"{i:04d}" for i in range(0, 230, 2)]
    resumed = [d["_id"] for page in pages(collection, {"p": 0}, "0100", 50) for d in page]
    assert resumed == [f"{i:04d}" for i in range(102, 230, 2)]


def test_the_bootstrap_store_logs_each_change_once_even_when_replayed(
    mongo: MongoClient[dict[str, Any]], unique: str
) -> None:
    db = mongo[f"{unique}store"]
    first = [change(f"k{i}", i + 1, v=i) for i in range(120)]
    BootstrapStore(db).apply_window(first)
    writer = BootstrapStore(db)  # a restarted consumer: knows nothing, replays from its checkpoint
    writer.apply_window([*first[100:], change("k0", 200, "d")])
    writer.apply_window(first[110:])
    log = db["log_t"]
    assert log.count_documents({}) == 121
    assert [d["offset"] for d in log.find({}, {"offset": 1}).sort("_id", 1)] == [*range(1, 121), 200]
    assert db["snapshot_t"].count_documents({}) == 119  # k0 deleted
    assert db["applier_t"].find_one({"_id": 0}) == {"_id": 0, "scn": 200, "offset": 200}
