"""The bootstrap store: a MongoDB-protocol database other consumers bootstrap from.

Per relay topic it keeps three collections (FerretDB-compatible: no transactions, no change
streams are needed):
  snapshot_<topic>  the latest row per key with its SCN (deleted rows are removed);
  log_<topic>       every change, keyed by partition and offset, with its SCN;
  applier_<topic>   per partition, the SCN and offset of the last window fully applied.
The applier document is written last, after the window's rows, so it never claims more than the
collections hold. Collection names keep only letters and digits of the topic's name, so two topics
can map to one set (`team-a.x` and `team_a.x`): the `topics` collection names the topic each set holds
(one document per set, `_id` its suffix), and a writer or reader of another topic is refused
(`StoreConflict`) instead of mixing two topics' rows, logs and positions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pymongo import ASCENDING, InsertOne
from pymongo.database import Database
from pymongo.errors import AutoReconnect, CursorNotFound

from fibers import failpoints
from fibers.consumer.events import ChangeEvent
from fibers.consumer.mongo_servers import MongoServer, Stored, Write, detect
from fibers.consumer.mongo_servers import bulk_write as bulk_write  # bench/databus_throughput.py's plain loop uses it

TOPICS = "topics"  # the collection naming the topic each set of collections holds (`_id`: the sets' suffix)


class StoreConflict(Exception):
    """The collections a topic maps to hold another topic: nothing of it is written or read there."""


def collection_suffix(topic: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in topic)


def log_id(partition: int, offset: int) -> str:
    """Log document ids sort by partition, then offset."""
    return f"{partition:05d}:{offset:020d}"


REMEMBERED_KEYS = 200_000  # keys a writer remembers; past that it forgets them all and learns again (bounded memory)


class GuardedCollection:
    """A collection written in SCN order per key: a change older than the one a key holds is skipped.

    What each key holds (its SCN, and whether a document exists) is remembered after every write,
    deletes included, so a replayed older insert cannot bring a deleted row back and a replay of
    what was applied writes nothing. Keys not remembered are learnt, and the writes sent, by the
    server's adapter (fibers.consumer.mongo_servers): FerretDB's inserts and reads, or MongoDB's
    guarded upserts. Remembering is safe because one consumer instance owns each key's partition
    exclusively; a new owner starts with an empty memory (`forget`, when the instance takes partitions),
    and replays from its checkpoint, which holds every delete it has not seen yet.
    """

    def __init__(
        self,
        collection: Any,
        extra: dict[str, Any] | None = None,
        remember: int = REMEMBERED_KEYS,
        server: MongoServer | None = None,
        reapply: bool = False,
    ) -> None:
        """`server` names the adapter; by default it is detected from the server on the first write.
        `reapply`: a change the key already holds is written again (a replay told to re-apply, see
        DatabusConsumer seek.sinks), so a document changed since by someone else is put right; an older
        change is still never written."""
        self.collection, self.extra, self.remember = collection, extra or {}, remember
        self._server, self.reapply = server, reapply
        self.known: dict[str, Stored] = {}

    @property
    def server(self) -> MongoServer:
        return self._server or detect(self.collection.database.client)

    def _write(self, event: ChangeEvent) -> Write:
        """The row as stored: its columns (a column named _id gives way to the key), extras, and its SCN."""
        if event.document is None:
            return Write(event.key, event.scn, None)
        doc = {**event.document, **self.extra, "_scn": event.scn}
        doc.pop("_id", None)
        return Write(event.key, event.scn, doc)

    def _superseded(self, write: Write) -> bool:
        """Already applied (a replay), or a newer change of the key is stored."""
        stored = self.known.get(write.key)
        if stored is None:
            return False
        return stored.scn > write.scn if self.reapply else stored.scn >= write.scn

    def forget(self) -> None:
        """Learn every key again: another writer may have changed them (see `Callback.on_timelines_taken`)."""
        self.known.clear()

    def apply(self, events: list[ChangeEvent]) -> None:
        latest: dict[str, ChangeEvent] = {}
        for event in events:
            latest[event.key] = event  # events of one key arrive in SCN order; the last one wins
        if len(self.known) + len(latest) > self.remember:
            self.known.clear()  # bounded memory; forgotten keys are learnt again
        writes = [self._write(e) for e in latest.values()]
        try:
            self.known.update(self.server.learn(self.collection, [w for w in writes if w.key not in self.known]))
            newer = [w for w in writes if not self._superseded(w)]
            self.server.write(self.collection, newer, self.known, reapply=self.reapply)
        except Exception:
            self.known.clear()  # what was written is unknown now: learn again on the replay
            raise
        self.known.update((w.key, Stored(w.scn, w.document is not None)) for w in newer)


def pages(collection: Any, query: dict[str, Any], after: str | None, size: int) -> Iterator[list[dict[str, Any]]]:
    """Matching documents in _id order, `size` at a time, after the _id `after`.

    One cursor serves every page: FerretDB cannot push `_id > x` down to SQLite, so a query per
    page would scan the whole collection each time. A cursor the server dropped is reopened
    after the last page handed out.
    """
    while True:
        failpoints.hit("bootstrap.read", AutoReconnect)
        cursor = collection.find({**query, **({"_id": {"$gt": after}} if after is not None else {})})
        cursor = cursor.sort("_id", ASCENDING).batch_size(max(size, 100))
        page: list[dict[str, Any]] = []
        try:
            for doc in cursor:
                page.append(doc)
                if len(page) == size:
                    yield page
                    after, page = str(page[-1]["_id"]), []
                    failpoints.hit("bootstrap.read", AutoReconnect)
        except CursorNotFound:
            continue
        finally:
            cursor.close()
        if page:
            yield page
        return


class BootstrapStore:
    def __init__(self, db: Database[dict[str, Any]], server: MongoServer | None = None) -> None:
        """`server` names the adapter writes go through; by default it is detected on the first write."""
        self.db, self._server = db, server
        self._snapshots: dict[tuple[str, int], GuardedCollection] = {}
        self._log_heads: dict[tuple[str, int], int] = {}
        self._held: set[str] = set()  # topics whose collections were found (or made) theirs

    def check_topic(self, topic: str, *, hold: bool = False) -> None:
        """Raise StoreConflict when the topic's collections hold another topic. `hold`: a writer names its
        topic in collections that name none yet (made now, or by a version without the marker)."""
        if topic in self._held:
            return
        topics, suffix = self.db[TOPICS], collection_suffix(topic)
        marker = topics.find_one({"_id": suffix})
        if marker is None and hold:
            topics.update_one({"_id": suffix}, {"$setOnInsert": {"name": topic}}, upsert=True)
            marker = topics.find_one({"_id": suffix})
        held = marker.get("name") if marker else None
        if held is not None and held != topic:
            raise StoreConflict(
                f"the bootstrap store's collections log_{suffix}, snapshot_{suffix} and applier_{suffix} in database "
                f"{self.db.name} hold topic {held}, not {topic}: topics whose names differ only in characters other "
                "than letters and digits need bootstrap stores in different databases"
            )
        if marker is not None:
            self._held.add(topic)

    @property
    def server(self) -> MongoServer:
        return self._server or detect(self.db.client)

    def forget(self) -> None:
        """Read log heads and learn snapshot keys again: another instance may have written the partitions
        since this one last held them (see `Callback.on_timelines_taken`)."""
        self._snapshots.clear()
        self._log_heads.clear()

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
            self.check_topic(topic, hold=True)
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
                self.server.bulk_write(self._log(topic), log_ops)
            except Exception:
                del self._log_heads[topic, partition]  # partly written: read the head again on the replay
                raise
            self._log_heads[topic, partition] = max([head] + [e.offset for e in batch])
            if (topic, partition) not in self._snapshots:
                self._snapshots[topic, partition] = GuardedCollection(
                    self._snapshot(topic), {"_partition": partition}, server=self.server
                )
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
            last = self._log_end(topic, partition, newest=True)
            self._log_heads[topic, partition] = int(last["offset"]) if last else -1
        return self._log_heads[topic, partition]

    def _log_end(self, topic: str, partition: int, *, newest: bool) -> dict[str, Any] | None:
        """The partition's first (or newest) logged change, by _id; None when it has none."""
        found = list(
            self._log(topic)
            .find({"_id": {"$gte": log_id(partition, 0), "$lt": log_id(partition + 1, 0)}}, {"offset": 1, "scn": 1})
            .sort("_id", -1 if newest else 1)
            .limit(1)
        )
        return found[0] if found else None

    # ----- read by bootstrapping consumers --------------------------------------------------------

    def applier_state(self, topic: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """Per partition, (SCN, offset) of the last window the store fully applied."""
        found = self._applier(topic).find({"_id": {"$in": partitions}})
        return {int(d["_id"]): (int(d["scn"]), int(d["offset"])) for d in found}

    def first_logged(self, topic: str, partitions: list[int]) -> dict[int, int]:
        """Per partition, the SCN of the first change its log holds (partitions with none are left out):
        every change after it is logged, since the log is append-only and never trimmed."""
        ends = {partition: self._log_end(topic, partition, newest=False) for partition in partitions}
        return {partition: int(end["scn"]) for partition, end in ends.items() if end is not None}

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
