"""The MongoDB sink's SCN guard and its server adapters, without a server (the real one: tests/integration)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from pymongo import DeleteOne, InsertOne, ReplaceOne
from pymongo.errors import BulkWriteError

from fibers.consumer.events import ChangeEvent
from fibers.consumer.mongo_servers import (
    DUPLICATE_KEY,
    FERRETDB_SQLITE,
    FEW_REPLACES,
    MONGODB,
    Stored,
    Write,
    at_most,
    duplicate_indexes,
    older_than,
    server_for,
)
from fibers.consumer.store import GuardedCollection
from fibers.mongodb import BULK_LIMIT

# buildInfo as the local stack's FerretDB v1.24.2 (a wrapper-module build) answers it, trimmed.
FERRETDB_V1 = {"version": "7.0.42", "gitVersion": "unknown", "ferretdbVersion": "unknown", "ok": 1.0}
# FerretDB v2 names itself in a document of its own.
FERRETDB_V2 = {"version": "7.0.77", "gitVersion": "abc", "ferretdb": {"version": "v2.7.0"}, "ok": 1.0}
MONGOD = {"version": "8.0.4", "gitVersion": "<commit>", "modules": [], "versionArray": [8, 0, 4, 0], "ok": 1.0}


@pytest.mark.parametrize(
    ("build_info", "expected"), [(FERRETDB_V1, FERRETDB_SQLITE), (FERRETDB_V2, FERRETDB_SQLITE), (MONGOD, MONGODB)]
)
def test_the_adapter_is_chosen_by_what_buildinfo_names(build_info: dict[str, Any], expected: object) -> None:
    assert server_for(build_info) is expected


def bulk_error(*codes: int, concern: bool = False) -> BulkWriteError:
    errors = [{"index": i, "code": code, "errmsg": "e"} for i, code in enumerate(codes)]
    return BulkWriteError({"writeErrors": errors, "writeConcernErrors": [{"code": 64}] if concern else []})


def test_only_duplicate_keys_count_as_refusals() -> None:
    assert duplicate_indexes(bulk_error(DUPLICATE_KEY, DUPLICATE_KEY)) == {0, 1}
    assert duplicate_indexes(bulk_error(DUPLICATE_KEY, 2)) is None
    assert duplicate_indexes(bulk_error()) is None
    assert duplicate_indexes(bulk_error(DUPLICATE_KEY, concern=True)) is None


def test_the_mongodb_guard_matches_only_an_older_or_unversioned_document() -> None:
    assert older_than(Write("k", 7, {"_scn": 7})) == {
        "_id": "k",
        "$or": [{"_scn": {"$lt": 7}}, {"_scn": {"$exists": False}}],
    }


def test_a_replay_told_to_reapply_matches_the_same_change_too() -> None:
    assert at_most(Write("k", 7, {"_scn": 7})) == {
        "_id": "k",
        "$or": [{"_scn": {"$lte": 7}}, {"_scn": {"$exists": False}}],
    }


class FakeCollection:
    """Records bulk writes; raises `fail` (once) instead of writing when it is set."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.bulks: list[tuple[list[Any], bool]] = []
        self.fail = fail

    def bulk_write(self, operations: list[Any], ordered: bool = True) -> None:
        self.bulks.append((operations, ordered))
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail


def test_mongodb_writes_guarded_upserts_and_deletes_in_one_unordered_bulk() -> None:
    collection = FakeCollection()
    writes = [Write(f"k{i}", i, {"v": i, "_scn": i}) for i in range(120)] + [Write("gone", 500, None)]
    MONGODB.write(collection, writes, {})
    [(operations, ordered)] = collection.bulks
    assert not ordered
    assert operations[0] == ReplaceOne(older_than(writes[0]), {"v": 0, "_scn": 0}, upsert=True)
    assert operations[-1] == DeleteOne(older_than(writes[-1]))
    assert len(operations) == 121  # no FerretDB-sized chunks


def test_mongodb_takes_a_duplicate_key_as_a_newer_change_and_raises_anything_else() -> None:
    MONGODB.write(FakeCollection(fail=bulk_error(DUPLICATE_KEY)), [Write("k", 1, {"_scn": 1})], {})
    with pytest.raises(BulkWriteError):
        MONGODB.write(FakeCollection(fail=bulk_error(DUPLICATE_KEY, 121)), [Write("k", 1, {"_scn": 1})], {})


def test_ferretdb_writes_by_what_is_known_in_chunks() -> None:
    collection = FakeCollection()
    known = {"new": Stored(-1, False), "old": Stored(3, True), "absent": Stored(-1, False), "there": Stored(2, True)}
    known.update({f"k{i}": Stored(-1, False) for i in range(BULK_LIMIT)})
    writes = [
        Write("new", 5, {"_scn": 5}),
        Write("old", 5, {"_scn": 5}),
        Write("absent", 5, None),
        Write("there", 5, None),
        *(Write(f"k{i}", 5, {"_scn": 5}) for i in range(BULK_LIMIT)),
    ]
    FERRETDB_SQLITE.write(collection, writes, known)
    assert [len(operations) for operations, _ in collection.bulks] == [BULK_LIMIT, 3]
    assert collection.bulks[0][0][:3] == [
        InsertOne({"_id": "new", "_scn": 5}),
        ReplaceOne({"_id": "old"}, {"_scn": 5}, upsert=True),
        DeleteOne({"_id": "there"}),  # the delete of an absent row sends nothing
    ]


def test_ferretdb_replaces_many_documents_with_one_delete_and_inserts() -> None:
    """A replace is a scan of the collection there: past FEW_REPLACES, the stored ones go in one delete."""
    collection = FakeCollection()
    deleted: list[dict[str, Any]] = []
    collection.delete_many = deleted.append  # type: ignore[attr-defined]
    count = FEW_REPLACES + 1
    known = {f"k{i}": Stored(1, True) for i in range(count)} | {"new": Stored(-1, False), "gone": Stored(1, True)}
    writes = [Write(f"k{i}", 5, {"_scn": 5}) for i in range(count)] + [
        Write("new", 5, {"_scn": 5}),
        Write("gone", 5, None),
    ]
    FERRETDB_SQLITE.write(collection, writes, known)
    assert deleted == [{"_id": {"$in": [f"k{i}" for i in range(count)] + ["gone"]}}]
    [(operations, _)] = collection.bulks
    assert operations == [InsertOne({"_id": f"k{i}", "_scn": 5}) for i in range(count)] + [
        InsertOne({"_id": "new", "_scn": 5})
    ]


class FakeServer:
    """An adapter that answers `learn` from a dict and records what it is asked to write."""

    name = "fake"

    def __init__(self, holds: dict[str, Stored] | None = None, fail: Exception | None = None) -> None:
        self.holds = holds or {}
        self.fail = fail
        self.asked: list[list[str]] = []
        self.written: list[list[Write]] = []
        self.reapplied: list[bool] = []

    def learn(self, collection: Any, writes: list[Write]) -> dict[str, Stored]:
        self.asked.append([w.key for w in writes])
        return {w.key: self.holds[w.key] for w in writes if w.key in self.holds}

    def write(
        self, collection: Any, writes: list[Write], known: Mapping[str, Stored], *, reapply: bool = False
    ) -> None:
        self.written.append(writes)
        self.reapplied.append(reapply)
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail

    def bulk_write(self, collection: Any, operations: list[Any], *, ordered: bool = True) -> None:
        raise AssertionError("the guard writes through `write`")


def change(key: str, scn: int, op: str = "u", **row: Any) -> ChangeEvent:
    return ChangeEvent("t", 0, scn, key, op, scn, scn, None if op == "d" else {"id": key, **row})


def test_the_guard_sends_the_last_change_per_key_and_skips_what_is_stored() -> None:
    server = FakeServer(holds={"b": Stored(20, True)})
    writer = GuardedCollection(None, {"_partition": 3}, server=server)
    writer.apply([change("a", 10, v=1, _id="x"), change("b", 11), change("a", 12, v=2)])
    assert server.asked == [["a", "b"]]
    assert server.written == [[Write("a", 12, {"id": "a", "v": 2, "_partition": 3, "_scn": 12})]]
    assert writer.known == {"a": Stored(12, True), "b": Stored(20, True)}


def test_the_guard_remembers_deletes_so_a_replay_neither_resurrects_nor_rewrites() -> None:
    server = FakeServer()
    writer = GuardedCollection(None, server=server)
    writer.apply([change("a", 10, v=1), change("b", 11, v=1)])
    writer.apply([change("b", 13, "d")])
    assert server.written[-1] == [Write("b", 13, None)]
    writer.apply([change("a", 10, v=1), change("b", 11, v=1)])  # a replay: nothing asked, nothing sent
    assert server.asked[-1] == [] and server.written[-1] == []
    writer.apply([change("b", 20, v=3)])  # a newer change of a deleted key goes through
    assert server.written[-1] == [Write("b", 20, {"id": "b", "v": 3, "_scn": 20})]


def test_the_guard_forgets_everything_when_a_write_fails() -> None:
    server = FakeServer(fail=RuntimeError("server gone"))
    writer = GuardedCollection(None, server=server)
    writer.known["z"] = Stored(1, True)
    with pytest.raises(RuntimeError):
        writer.apply([change("a", 10)])
    assert writer.known == {}
    writer.apply([change("a", 10)])  # the replay learns and writes again
    assert server.asked[-1] == ["a"] and server.written[-1] == [Write("a", 10, {"id": "a", "_scn": 10})]


def test_the_guard_forgets_when_its_memory_is_full() -> None:
    server = FakeServer()
    writer = GuardedCollection(None, remember=2, server=server)
    writer.apply([change("a", 1), change("b", 2)])
    writer.apply([change("c", 3)])
    assert writer.known == {"c": Stored(3, True)}


def test_a_guard_told_to_reapply_writes_again_what_a_key_holds_but_never_an_older_change() -> None:
    """seek.sinks: reapply puts right a document changed by hand since its change was applied (same SCN)."""
    server = FakeServer(holds={"a": Stored(12, True), "b": Stored(20, True)})
    writer = GuardedCollection(None, server=server, reapply=True)
    writer.apply([change("a", 12, v=2), change("b", 11, v=1)])
    assert server.written == [[Write("a", 12, {"id": "a", "v": 2, "_scn": 12})]] and server.reapplied == [True]
    skipping = FakeServer(holds={"a": Stored(12, True)})
    GuardedCollection(None, server=skipping).apply([change("a", 12, v=2)])
    assert skipping.written == [[]] and skipping.reapplied == [False]
