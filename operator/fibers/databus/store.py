"""The bootstrap store: a MongoDB-protocol database other consumers bootstrap from.

Per relay topic it keeps three collections (FerretDB-compatible: no transactions, no change
streams are needed):
  snapshot_<topic>  the latest row per key with its SCN (deleted rows are removed);
  log_<topic>       every change, keyed by partition and offset, with its SCN;
  applier_<topic>   per partition, the SCN and offset of the last window fully applied.
The applier document is written last, after the window's rows, so it never claims more than the
collections hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pymongo import ASCENDING, DeleteOne, InsertOne, ReplaceOne
from pymongo.database import Database
from pymongo.errors import BulkWriteError, CursorNotFound

from fibers.databus.events import ChangeEvent


def collection_suffix(topic: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in topic)


def log_id(partition: int, offset: int) -> str:
    """Log document ids sort by partition, then offset."""
    return f"{partition:05d}:{offset:020d}"


FEW_KEYS = 8  # unknown keys read one by one; more are read with one $in query
DUPLICATE_KEY = 11000  # MongoDB's error code for an insert of an _id that exists
BULK_LIMIT = 50  # FerretDB v1 (SQLite) stops answering when one bulk replaces ~100 existing documents


def bulk_write(collection: Any, operations: list[Any], *, ordered: bool = True) -> None:
    """bulk_write in chunks small enough for every MongoDB-protocol server we support."""
    for start in range(0, len(operations), BULK_LIMIT):
        collection.bulk_write(operations[start : start + BULK_LIMIT], ordered=ordered)


class GuardedCollection:
    """A collection written in SCN order per key: a change older than the stored one is skipped.

    What each key holds (its SCN, and whether a document exists) is remembered after every write,
    deletes included, so a replayed older insert cannot bring a deleted row back. A key not
    remembered is first inserted as a new row (see `_insert_unknown`); only the keys that turn out
    to exist, and deletes, are read (see `_learn`). Both serve FerretDB on SQLite, which scans the
    whole collection for every update or delete and for every read of an absent `_id`.
    Remembering is safe because one consumer instance owns each key's partition exclusively; a
    new owner starts with an empty memory and reads.
    """

    def __init__(self, collection: Any, extra: dict[str, Any] | None = None, remember: int = 200_000) -> None:
        self.collection, self.extra, self.remember = collection, extra or {}, remember
        self.known: dict[str, tuple[int, bool]] = {}  # key → (SCN stored or deleted last, document exists)

    def _learn(self, keys: list[str]) -> None:
        """Read what the store holds for keys not remembered.

        FerretDB finds a present `_id` from its index but scans for an absent one, and `$in`
        is one scan for the lot: a few keys are read one by one, more in one query.
        """
        unknown = [k for k in keys if k not in self.known]
        if len(unknown) <= FEW_KEYS:
            found = [d for k in unknown if (d := self.collection.find_one({"_id": k}, {"_scn": 1}))]
        else:
            found = list(self.collection.find({"_id": {"$in": unknown}}, {"_scn": 1}))
        for key in unknown:
            self.known[key] = (-1, False)
        for doc in found:
            self.known[str(doc["_id"])] = (int(doc.get("_scn", -1)), True)

    def _insert_unknown(self, latest: dict[str, ChangeEvent]) -> None:
        """Insert the rows of keys not remembered, as if new; the keys that exist fail and are learnt.

        Change streams are mostly new rows: this writes them without reading first (reading an absent
        `_id` is a collection scan on FerretDB, and a round trip anywhere). An insert never overwrites,
        so a key the store holds keeps its document, and goes through the SCN guard in `apply`.
        """
        fresh = [e for key, e in latest.items() if key not in self.known and e.document is not None]
        for start in range(0, len(fresh), BULK_LIMIT):
            chunk = fresh[start : start + BULK_LIMIT]
            operations = [InsertOne({"_id": e.key, **self._document(e)}) for e in chunk]
            exists: set[int] = set()
            try:
                self.collection.bulk_write(operations, ordered=False)
            except BulkWriteError as exc:
                errors = exc.details.get("writeErrors") or []
                if any(error.get("code") != DUPLICATE_KEY for error in errors) or not errors:
                    self.known.clear()
                    raise
                exists = {int(error["index"]) for error in errors}
            for index, event in enumerate(chunk):
                if index not in exists:
                    self.known[event.key] = (event.scn, True)

    def _document(self, event: ChangeEvent) -> dict[str, Any]:
        """The row as stored: its columns (a column named _id gives way to the key), extras, and its SCN."""
        doc = {**(event.document or {}), **self.extra, "_scn": event.scn}
        doc.pop("_id", None)
        return doc

    def apply(self, events: list[ChangeEvent]) -> None:
        latest: dict[str, ChangeEvent] = {}
        for event in events:
            latest[event.key] = event  # events of one key arrive in SCN order; the last one wins
        if len(self.known) + len(latest) > self.remember:
            self.known.clear()  # bounded memory; forgotten keys are read again
        operations: list[Any] = []
        applied: list[ChangeEvent] = []
        self._insert_unknown(latest)
        self._learn(list(latest))
        for key, event in latest.items():
            scn, exists = self.known[key]
            if scn >= event.scn:
                continue  # already applied (a replay), or a newer change is stored
            if event.document is None:
                if not exists:
                    self.known[key] = (event.scn, False)
                    continue
                operations.append(DeleteOne({"_id": key}))
            else:
                doc = self._document(event)
                operations.append(
                    ReplaceOne({"_id": key}, doc, upsert=True) if exists else InsertOne({"_id": key, **doc})
                )
            applied.append(event)
        for start in range(0, len(operations), BULK_LIMIT):
            try:
                self.collection.bulk_write(operations[start : start + BULK_LIMIT], ordered=True)
            except Exception:
                self.known.clear()  # what was written is unknown now: read again on the replay
                raise
            for event in applied[start : start + BULK_LIMIT]:
                self.known[event.key] = (event.scn, event.document is not None)


def pages(collection: Any, query: dict[str, Any], after: str | None, size: int) -> Iterator[list[dict[str, Any]]]:
    """Matching documents in _id order, `size` at a time, after the _id `after`.

    One cursor serves every page: FerretDB cannot push `_id > x` down to SQLite, so a query per
    page would scan the whole collection each time. A cursor the server dropped is reopened
    after the last page handed out.
    """
    while True:
        cursor = collection.find({**query, **({"_id": {"$gt": after}} if after is not None else {})})
        cursor = cursor.sort("_id", ASCENDING).batch_size(max(size, 100))
        page: list[dict[str, Any]] = []
        try:
            for doc in cursor:
                page.append(doc)
                if len(page) == size:
                    yield page
                    after, page = str(page[-1]["_id"]), []
        except CursorNotFound:
            continue
        finally:
            cursor.close()
        if page:
            yield page
        return


class BootstrapStore:
    def __init__(self, db: Database[dict[str, Any]]) -> None:
        self.db = db
        self._snapshots: dict[tuple[str, int], GuardedCollection] = {}
        self._log_heads: dict[tuple[str, int], int] = {}

    def _snapshot(self, topic: str) -> Any:
        return self.db[f"snapshot_{collection_suffix(topic)}"]

    def _log(self, topic: str) -> Any:
        return self.db[f"log_{collection_suffix(topic)}"]

    def _applier(self, topic: str) -> Any:
        return self.db[f"applier_{collection_suffix(topic)}"]

    # ----- written by the consumer whose sink is the store ----------------------------------------

    def apply_window(self, events: list[ChangeEvent]) -> None:
        by_timeline: dict[tuple[str, int], list[ChangeEvent]] = {}
        for event in events:
            by_timeline.setdefault((event.topic, event.partition), []).append(event)
        for (topic, partition), batch in by_timeline.items():
            head = self._logged_offset(topic, partition)
            log_ops = [
                InsertOne(
                    {
                        "_id": log_id(e.partition, e.offset),
                        "scn": e.scn,
                        "partition": e.partition,
                        "offset": e.offset,
                        "key": e.key,
                        "op": e.op,
                        "doc": e.document,
                    }
                )
                for e in batch
                if e.offset > head  # a replay: logged already
            ]
            try:
                bulk_write(self._log(topic), log_ops)
            except Exception:
                del self._log_heads[topic, partition]  # partly written: read the head again on the replay
                raise
            self._log_heads[topic, partition] = max([head] + [e.offset for e in batch])
            if (topic, partition) not in self._snapshots:
                self._snapshots[topic, partition] = GuardedCollection(self._snapshot(topic), {"_partition": partition})
            self._snapshots[topic, partition].apply(batch)
            self._applier(topic).update_one(
                {"_id": partition},
                {"$max": {"scn": max(e.scn for e in batch), "offset": max(e.offset for e in batch)}},
                upsert=True,
            )

    def _logged_offset(self, topic: str, partition: int) -> int:
        """The highest offset of this partition in the log (read once, then kept: we own the partition).

        The log is append-only, so a replayed change is recognised by its offset and never
        written twice — plain inserts, which FerretDB does without scanning the collection.
        """
        if (topic, partition) not in self._log_heads:
            last = list(
                self._log(topic)
                .find({"_id": {"$gte": log_id(partition, 0), "$lt": log_id(partition + 1, 0)}}, {"offset": 1})
                .sort("_id", -1)
                .limit(1)
            )
            self._log_heads[topic, partition] = int(last[0]["offset"]) if last else -1
        return self._log_heads[topic, partition]

    # ----- read by bootstrapping consumers --------------------------------------------------------

    def applier_state(self, topic: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """Per partition, (SCN, offset) of the last window the store fully applied."""
        found = self._applier(topic).find({"_id": {"$in": partitions}})
        return {int(d["_id"]): (int(d["scn"]), int(d["offset"])) for d in found}

    def snapshot_pages(
        self, topic: str, partitions: list[int], after_key: str | None, size: int
    ) -> Iterator[list[dict[str, Any]]]:
        """The snapshot rows of these partitions in key order, after `after_key` (where a bootstrap resumes)."""
        return pages(self._snapshot(topic), {"_partition": {"$in": partitions}}, after_key, size)

    def log_pages(
        self, topic: str, partitions: list[int], start_scn: int, target_scn: int, after_id: str | None, size: int
    ) -> Iterator[list[dict[str, Any]]]:
        """The logged changes with start_scn < SCN <= target_scn, in partition/offset order, after `after_id`."""
        query = {"partition": {"$in": partitions}, "scn": {"$gt": start_scn, "$lte": target_scn}}
        return pages(self._log(topic), query, after_id, size)
