"""The MongoDB writers of the Databus sinks against the real MongoDB-protocol server (FerretDB).

The guard's scenarios run through both server adapters: FerretDB's own, and MongoDB's guarded
upserts, which reach FerretDB one statement at a time (see `OneStatementAtATime`).
"""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import DeleteOne, InsertOne, MongoClient, ReplaceOne
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import BulkWriteError, DuplicateKeyError

from fibers.consumer.events import ChangeEvent
from fibers.consumer.mongo_servers import FERRETDB_SQLITE, MONGODB, MongoServer, detect
from fibers.consumer.store import BootstrapStore, GuardedCollection, pages

pytestmark = pytest.mark.databus


def change(key: str, scn: int, op: str = "u", **row: Any) -> ChangeEvent:
    return ChangeEvent("t", 0, scn, key, op, scn, scn, None if op == "d" else {"id": key, **row})


class OneStatementAtATime:
    """A collection whose bulk writes are sent one statement each and answered as MongoDB answers them.

    FerretDB v1, the stack's server, answers a bulk in which a guarded upsert meets an existing `_id`
    with one error at index 0, drops the statements after it, and leaves out the counts pymongo
    reads (a KeyError). MongoDB runs every statement of an unordered bulk and names each one it
    refused. Sending the statements one by one gives MongoDB's answer, so the MongoDB adapter's
    filters, upserts and duplicate-key handling run on a real server's query engine here.
    """

    def __init__(self, collection: Collection[dict[str, Any]]) -> None:
        self.collection = collection

    def __getattr__(self, name: str) -> Any:
        return getattr(self.collection, name)

    def bulk_write(self, operations: list[Any], ordered: bool = True) -> None:
        errors: list[dict[str, Any]] = []
        for index, op in enumerate(operations):
            try:
                if isinstance(op, InsertOne):
                    self.collection.insert_one(op._doc)
                elif isinstance(op, ReplaceOne):
                    self.collection.replace_one(op._filter, op._doc, upsert=op._upsert)
                elif isinstance(op, DeleteOne):
                    self.collection.delete_one(op._filter)
                else:
                    raise TypeError(f"no single-statement form for {op!r}")
            except DuplicateKeyError as exc:
                errors.append({"index": index, "code": exc.code, "errmsg": str(exc)})
                if ordered:
                    break
        if errors:
            raise BulkWriteError({"writeErrors": errors, "writeConcernErrors": []})


class OneStatementAtATimeDatabase:
    """A database whose collections are `OneStatementAtATime`."""

    def __init__(self, db: Database[dict[str, Any]]) -> None:
        self.db = db

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)

    def __getitem__(self, name: str) -> OneStatementAtATime:
        return OneStatementAtATime(self.db[name])


@pytest.fixture(params=[FERRETDB_SQLITE, MONGODB], ids=lambda server: server.name)
def server(request: pytest.FixtureRequest) -> MongoServer:
    adapter: MongoServer = request.param
    return adapter


def guarded(collection: Collection[dict[str, Any]], server: MongoServer, **kw: Any) -> GuardedCollection:
    """A writer of the collection through this adapter (MongoDB's one statement at a time, see above)."""
    return GuardedCollection(OneStatementAtATime(collection) if server is MONGODB else collection, server=server, **kw)


def test_the_stacks_server_is_detected_as_ferretdb(mongo: MongoClient[dict[str, Any]]) -> None:
    assert detect(mongo) is FERRETDB_SQLITE
    assert GuardedCollection(mongo["guarded"]["any"]).server is FERRETDB_SQLITE


def test_a_replay_never_moves_a_document_back(
    mongo: MongoClient[dict[str, Any]], unique: str, server: MongoServer
) -> None:
    collection = mongo["guarded"][unique]
    writer = guarded(collection, server)
    writer.apply([change("a", 10, v=1), change("b", 11, v=1), change("a", 12, v=2)])
    writer.apply([change("b", 13, "d")])
    assert {d["_id"]: (d["v"], d["_scn"]) for d in collection.find()} == {"a": (2, 12)}

    writer.apply([change("a", 10, v=1), change("b", 11, v=1)])  # older changes delivered again: skipped,
    assert {d["_id"]: (d["v"], d["_scn"]) for d in collection.find()} == {"a": (2, 12)}  # b stays deleted
    # A new owner remembers nothing and reads what is stored; its replay runs up to the delete again.
    guarded(collection, server).apply([change("a", 10, v=1), change("b", 11, v=1), change("b", 13, "d")])
    assert {d["_id"]: (d["v"], d["_scn"]) for d in collection.find()} == {"a": (2, 12)}

    writer.apply([change("b", 20, v=3)])  # a newer change of a deleted key is applied
    assert collection.find_one({"_id": "b"}) == {"_id": "b", "id": "b", "v": 3, "_scn": 20}


def test_a_new_owner_inserts_new_rows_and_keeps_newer_stored_ones(
    mongo: MongoClient[dict[str, Any]], unique: str, server: MongoServer
) -> None:
    """New rows are inserted without a read; a stored row the insert collides with goes through the guard."""
    collection = mongo["guarded"][unique]
    guarded(collection, server).apply([change(f"k{i:03d}", 100 + i, v="stored") for i in range(0, 120, 2)])
    # More keys than one bulk and than FEW_KEYS, half of them stored (with newer SCNs than the replay's).
    replay = [change(f"k{i:03d}", 50 + i, v="replayed") for i in range(120)]
    guarded(collection, server).apply(replay)
    docs = {d["_id"]: (d["v"], d["_scn"]) for d in collection.find()}
    assert len(docs) == 120
    assert all(docs[f"k{i:03d}"] == ("stored", 100 + i) for i in range(0, 120, 2))
    assert all(docs[f"k{i:03d}"] == ("replayed", 50 + i) for i in range(1, 120, 2))
    # A newer change of a stored key, unknown to a third owner, replaces it.
    guarded(collection, server).apply([change("k000", 500, v="newer"), change("k001", 10, v="older")])
    assert collection.find_one({"_id": "k000"}) == {"_id": "k000", "id": "k000", "v": "newer", "_scn": 500}
    assert collection.find_one({"_id": "k001"})["v"] == "replayed"


def test_more_changes_than_one_bulk_write_are_all_applied(
    mongo: MongoClient[dict[str, Any]], unique: str, server: MongoServer
) -> None:
    collection = mongo["guarded"][unique]
    guarded(collection, server, extra={"_partition": 0}).apply([change(f"k{i:03d}", i + 1, v=i) for i in range(180)])
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
    mongo: MongoClient[dict[str, Any]], unique: str, server: MongoServer
) -> None:
    db = mongo[f"{unique}store"]
    written: Any = OneStatementAtATimeDatabase(db) if server is MONGODB else db
    first = [change(f"k{i}", i + 1, v=i) for i in range(120)]
    BootstrapStore(written, server).apply_window(first)
    writer = BootstrapStore(written, server)  # a restarted consumer: knows nothing, replays from its checkpoint
    writer.apply_window([*first[100:], change("k0", 200, "d")])
    writer.apply_window(first[110:])
    log = db["log_t"]
    assert log.count_documents({}) == 121
    assert [d["offset"] for d in log.find({}, {"offset": 1}).sort("_id", 1)] == [*range(1, 121), 200]
    assert db["snapshot_t"].count_documents({}) == 119  # k0 deleted
    assert db["applier_t"].find_one({"_id": 0}) == {"_id": 0, "scn": 200, "offset": 200}


def test_a_history_replayed_writes_nothing_again_and_a_changed_document_is_put_right(
    mongo: MongoClient[dict[str, Any]], unique: str, server: MongoServer
) -> None:
    """History documents are keyed by the change's position: a replayed window finds them stored as they
    are and replaces none (on FerretDB a thousand replaces outlasted a callback's timeout), while one
    stored with other content (a topic made again under its name) is replaced."""
    collection = mongo["history"][unique]
    documents = [{"_id": f"t/0/{i}", "op": "c", "_offset": i} for i in range(120)]
    server.insert_absent(collection, documents)
    collection.update_one({"_id": "t/0/7"}, {"$set": {"op": "stale"}})
    replaced: list[Any] = []

    class Recording(OneStatementAtATime):
        def bulk_write(self, operations: list[Any], ordered: bool = True) -> None:
            replaced.extend(op._filter["_id"] for op in operations if isinstance(op, ReplaceOne))
            super().bulk_write(operations, ordered)

    server.insert_absent(Recording(collection), [*documents, {"_id": "t/0/120", "op": "c", "_offset": 120}])
    assert replaced == ["t/0/7"]
    assert collection.count_documents({}) == 121 and collection.find_one({"_id": "t/0/7"})["op"] == "c"
