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

from typing import Any

from pymongo import ASCENDING, DeleteOne, ReplaceOne, UpdateOne
from pymongo.database import Database

from fibers.databus.events import ChangeEvent


def collection_suffix(topic: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in topic)


BULK_LIMIT = 50  # FerretDB v1 (SQLite) stops answering when one bulk replaces ~100 existing documents


def bulk_write(collection: Any, operations: list[Any], *, ordered: bool = True) -> None:
    """bulk_write in chunks small enough for every MongoDB-protocol server we support."""
    for start in range(0, len(operations), BULK_LIMIT):
        collection.bulk_write(operations[start : start + BULK_LIMIT], ordered=ordered)


def apply_guarded(collection: Any, events: list[ChangeEvent], extra: dict[str, Any] | None = None) -> None:
    """Apply a window's changes, never moving a document back to an older SCN.

    The stored SCNs of the window's keys are read first, then one ordered bulk write replaces or
    deletes only the keys whose change is newer. That is safe because one consumer instance owns
    each key's partition exclusively; it avoids relying on duplicate-key errors from conditional
    upserts, which FerretDB reports in a form the driver cannot merge.
    """
    latest: dict[str, ChangeEvent] = {}
    for event in events:
        latest[event.key] = event  # events of one key arrive in SCN order; the last one wins
    if not latest:
        return
    stored = {d["_id"]: int(d.get("_scn", -1)) for d in collection.find({"_id": {"$in": list(latest)}}, {"_scn": 1})}
    operations: list[Any] = []
    for key, event in latest.items():
        if key in stored and stored[key] >= event.scn:
            continue  # already applied (a replay), or a newer copy is stored
        if event.document is None:
            if key in stored:
                operations.append(DeleteOne({"_id": key}))
        else:
            doc = {**event.document, **(extra or {}), "_scn": event.scn}
            doc.pop("_id", None)
            operations.append(ReplaceOne({"_id": key}, doc, upsert=True))
    if operations:
        bulk_write(collection, operations)


class BootstrapStore:
    def __init__(self, db: Database[dict[str, Any]]) -> None:
        self.db = db

    def _snapshot(self, topic: str) -> Any:
        return self.db[f"snapshot_{collection_suffix(topic)}"]

    def _log(self, topic: str) -> Any:
        return self.db[f"log_{collection_suffix(topic)}"]

    def _applier(self, topic: str) -> Any:
        return self.db[f"applier_{collection_suffix(topic)}"]

    # ----- written by the consumer whose sink is the store ----------------------------------------

    def apply_window(self, events: list[ChangeEvent]) -> None:
        by_topic: dict[str, list[ChangeEvent]] = {}
        for event in events:
            by_topic.setdefault(event.topic, []).append(event)
        for topic, batch in by_topic.items():
            log_ops = [
                ReplaceOne(
                    {"_id": f"{e.partition:05d}:{e.offset:020d}"},
                    {
                        "scn": e.scn,
                        "partition": e.partition,
                        "offset": e.offset,
                        "key": e.key,
                        "op": e.op,
                        "doc": e.document,
                    },
                    upsert=True,
                )
                for e in batch
            ]
            bulk_write(self._log(topic), log_ops)
            for partition in {e.partition for e in batch}:
                apply_guarded(
                    self._snapshot(topic), [e for e in batch if e.partition == partition], {"_partition": partition}
                )
            applied: dict[int, tuple[int, int]] = {}
            for e in batch:
                scn, offset = applied.get(e.partition, (-1, -1))
                applied[e.partition] = (max(scn, e.scn), max(offset, e.offset))
            bulk_write(
                self._applier(topic),
                [
                    UpdateOne({"_id": p}, {"$max": {"scn": scn, "offset": offset}}, upsert=True)
                    for p, (scn, offset) in applied.items()
                ],
            )

    # ----- read by bootstrapping consumers --------------------------------------------------------

    def applier_state(self, topic: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """Per partition, (SCN, offset) of the last window the store fully applied."""
        found = self._applier(topic).find({"_id": {"$in": partitions}})
        return {int(d["_id"]): (int(d["scn"]), int(d["offset"])) for d in found}

    def snapshot_rows(
        self, topic: str, partitions: list[int], after_key: str | None, batch: int
    ) -> list[dict[str, Any]]:
        query: dict[str, Any] = {"_partition": {"$in": partitions}}
        if after_key is not None:
            query["_id"] = {"$gt": after_key}
        return list(self._snapshot(topic).find(query).sort("_id", ASCENDING).limit(batch))

    def log_rows(
        self, topic: str, partitions: list[int], start_scn: int, target_scn: int, after_id: str | None, batch: int
    ) -> list[dict[str, Any]]:
        query: dict[str, Any] = {"partition": {"$in": partitions}, "scn": {"$gt": start_scn, "$lte": target_scn}}
        if after_id is not None:
            query["_id"] = {"$gt": after_id}
        return list(self._log(topic).find(query).sort("_id", ASCENDING).limit(batch))
