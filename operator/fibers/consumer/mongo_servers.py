"""How guarded writes reach a MongoDB-protocol server: one adapter per kind of server.

`GuardedCollection` (fibers.consumer.store) decides which changes are newer than what their keys
hold; an adapter here decides how those changes are sent so that none of them overwrites a newer
document. The servers differ enough to want different ways:

  FerretDBOnSQLite  FerretDB v1 on SQLite (the local stack's server): insert first, read only the keys
                    that exist, write in small bulks, many replaces as one delete and inserts. Every
                    update, delete and read by `_id` scans the collection there (a read stops at
                    the key); only an insert of a new `_id` is cheap.
  PlainMongoDB      MongoDB itself: one bulk of guarded upserts and deletes per batch, no reads; its
                    `_id` index answers every filter.

Which one a writer gets is read from the server's `buildInfo` at its first write (see `server_for`;
a sink has one client and one writer, so once per client); tests and callers may name one instead.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from pymongo import DeleteOne, InsertOne, ReplaceOne
from pymongo.errors import BulkWriteError

from fibers.mongodb import BULK_LIMIT

DUPLICATE_KEY = 11000  # MongoDB's error code for a write of an _id that exists
FEW_KEYS = 8  # FerretDB: unknown keys read one by one; more are read with one $in query (one scan for the lot)
FEW_REPLACES = 8  # FerretDB: documents replaced one by one (a scan each); more are deleted at once and inserted


class Write(NamedTuple):
    """The change one key is to get: its document as stored (SCN included as `_scn`), or None for a delete."""

    key: str
    scn: int
    document: dict[str, Any] | None


class Stored(NamedTuple):
    """What a key holds as far as its writer knows: the SCN of the last change applied to it, deletes
    included (the server holds that change or a newer one), and whether that change left a document."""

    scn: int
    exists: bool


class MongoServer(Protocol):
    """How one kind of server is written to; the SCN guard itself stays with the caller."""

    name: str

    def learn(self, collection: Any, writes: list[Write]) -> dict[str, Stored]:
        """What the server holds for the keys of these writes, which the caller does not remember.

        An adapter may write to find out (an insert that succeeds is both the write and the answer),
        or tell nothing and leave the guard to the server (see `write`).
        """
        ...

    def write(
        self, collection: Any, writes: list[Write], known: Mapping[str, Stored], *, reapply: bool = False
    ) -> None:
        """Send writes, each newer than what `known` holds for its key where it holds anything.

        A write whose key the caller knows nothing of must still never replace or delete a newer
        document. Raises when a write may not have been applied for any reason but a newer change
        holding its key (the caller then forgets what it knew).
        """
        ...

    def bulk_write(self, collection: Any, operations: list[Any], *, ordered: bool = True) -> None:
        """Plain bulk write (no guard), in the bulks this server answers."""
        ...

    def insert_absent(self, collection: Any, documents: list[dict[str, Any]]) -> None:
        """Write documents whose `_id` determines their content (a history's) without replacing one that
        is stored as it is (a replayed window): see `insert_absent`."""
        ...


def duplicate_indexes(exc: BulkWriteError) -> set[int] | None:
    """The operations a bulk write refused only because their `_id` exists; None if anything else failed."""
    errors = exc.details.get("writeErrors") or []
    if not errors or exc.details.get("writeConcernErrors") or any(e.get("code") != DUPLICATE_KEY for e in errors):
        return None
    return {int(e["index"]) for e in errors}


def insert_absent(collection: Any, documents: list[dict[str, Any]], limit: int | None) -> None:
    """Insert in bulks of `limit` (None: one), unordered; documents whose `_id` exists are read back (one
    query) and replaced only where they differ (a topic deleted and made again under its name).

    A replayed window finds all of its documents written and replaces none: on FerretDB (SQLite) a
    replace scans the collection, and a replayed window of a thousand upserts took longer than a
    callback's timeout, every time."""
    step = limit or max(len(documents), 1)
    present: list[Any] = []
    for start in range(0, len(documents), step):
        chunk = documents[start : start + step]
        try:
            collection.bulk_write([InsertOne(d) for d in chunk], ordered=False)
        except BulkWriteError as exc:
            if (refused := duplicate_indexes(exc)) is None:
                raise
            present.extend(chunk[i]["_id"] for i in refused)
    if not present:
        return
    stored = {d["_id"]: d for d in collection.find({"_id": {"$in": present}})}
    wanted = {d["_id"]: d for d in documents}
    replaces = [ReplaceOne({"_id": k}, wanted[k], upsert=False) for k in present if stored.get(k) != wanted[k]]
    for start in range(0, len(replaces), step):
        collection.bulk_write(replaces[start : start + step], ordered=False)


def bulk_write(collection: Any, operations: list[Any], *, ordered: bool = True) -> None:
    """bulk_write in chunks small enough for every MongoDB-protocol server we support (FerretDB v1's limit)."""
    for start in range(0, len(operations), BULK_LIMIT):
        collection.bulk_write(operations[start : start + BULK_LIMIT], ordered=ordered)


class FerretDBOnSQLite:
    """For FerretDB v1 on its SQLite backend: the local stack's server, and the one the tests run on.

    There every update, delete and read by `_id` scans the collection (a read stops at the key it finds:
    27 ms at 10 k documents, 401 ms at 100 k, for a key in the middle), only an insert of a new `_id` is
    cheap (its uniqueness check is indexed), and a bulk replacing ~100 existing documents never answers.
    So keys are learnt the cheap way and remembered by the caller: a key not remembered is first inserted
    as a new row (an insert never overwrites; one of a key that exists fails and that key is read), an
    insert serves every key known to be absent, a delete is sent only for a document that exists, and
    bulks stay at BULK_LIMIT. The caller's memory is what makes the writes safe without a guard in their
    filters, so this is correct only for a writer that owns its keys (one consumer per partition). It
    works on any MongoDB-protocol server, only slower than needed.
    """

    name = "ferretdb-sqlite"

    def learn(self, collection: Any, writes: list[Write]) -> dict[str, Stored]:
        learnt = self._insert_new(collection, [w for w in writes if w.document is not None])
        learnt.update(self._read(collection, [w.key for w in writes if w.key not in learnt]))
        return learnt

    def _insert_new(self, collection: Any, writes: list[Write]) -> dict[str, Stored]:
        """Insert the rows as if new; the keys that exist fail (duplicate key) and are left to `_read`.

        Change streams are mostly new rows: this writes them without reading first (reading an absent
        `_id` is a collection scan here). A key the store holds keeps its document, and goes through
        the caller's SCN guard once it is read.
        """
        inserted: dict[str, Stored] = {}
        for start in range(0, len(writes), BULK_LIMIT):
            chunk = writes[start : start + BULK_LIMIT]
            exists: set[int] = set()
            try:
                collection.bulk_write([InsertOne({"_id": w.key, **(w.document or {})}) for w in chunk], ordered=False)
            except BulkWriteError as exc:
                if (refused := duplicate_indexes(exc)) is None:
                    raise
                exists = refused
            inserted.update((w.key, Stored(w.scn, True)) for i, w in enumerate(chunk) if i not in exists)
        return inserted

    def _read(self, collection: Any, keys: list[str]) -> dict[str, Stored]:
        """What the store holds for these keys: a few are read one by one, more with one `$in` query
        (every read by `_id` scans the collection there until it finds the key: 27 ms at 10 k documents,
        400 ms at 100 k, measured; `$in` is one scan for the lot: 1.3 s and 15.6 s for 1,000 keys)."""
        if len(keys) <= FEW_KEYS:
            found = [d for k in keys if (d := collection.find_one({"_id": k}, {"_scn": 1}))]
        else:
            found = list(collection.find({"_id": {"$in": keys}}, {"_scn": 1}))
        held = dict.fromkeys(keys, Stored(-1, False))
        held.update((str(d["_id"]), Stored(int(d.get("_scn", -1)), True)) for d in found)
        return held

    def write(
        self, collection: Any, writes: list[Write], known: Mapping[str, Stored], *, reapply: bool = False
    ) -> None:
        """Unguarded writes, chosen by what `known` says (it knows every key once `learn` has run)."""
        present = [w.key for w in writes if known[w.key].exists]
        if len(present) > FEW_REPLACES:
            self._delete_then_insert(collection, writes, present)
            return
        operations: list[Any] = []
        for write in writes:
            exists = known[write.key].exists
            if write.document is None:
                if exists:  # a delete of an absent row sends nothing: the caller remembers it
                    operations.append(DeleteOne({"_id": write.key}))
            elif exists:
                operations.append(ReplaceOne({"_id": write.key}, write.document, upsert=True))
            else:
                operations.append(InsertOne({"_id": write.key, **write.document}))
        self.bulk_write(collection, operations)

    def _delete_then_insert(self, collection: Any, writes: list[Write], present: list[str]) -> None:
        """Many stored documents changed at once (a window of updates, a replay told to re-apply): one
        delete of them all (one scan), then inserts, instead of a scan per replace (a replayed window of
        ten thousand took minutes, past a callback's timeout). For that moment a reader of the view does
        not see them; if the inserts fail, the caller forgets what it knew, the window is not
        checkpointed and its redelivery inserts them again (they are absent then)."""
        collection.delete_many({"_id": {"$in": present}})
        inserts = [InsertOne({"_id": w.key, **w.document}) for w in writes if w.document is not None]
        self.bulk_write(collection, inserts)

    def bulk_write(self, collection: Any, operations: list[Any], *, ordered: bool = True) -> None:
        bulk_write(collection, operations, ordered=ordered)

    def insert_absent(self, collection: Any, documents: list[dict[str, Any]]) -> None:
        insert_absent(collection, documents, BULK_LIMIT)


class PlainMongoDB:
    """For MongoDB itself (and any server that answers a bulk write as it does): guarded writes, one bulk.

    MongoDB finds any `_id` from its index, so nothing is read or inserted first: each change is an
    upsert, or a delete, whose filter matches its key only while the key holds an older SCN (or none,
    a document written by someone else). Where a newer or the same change is stored the filter matches
    nothing; the upsert then tries to insert the `_id`, the unique `_id` index refuses it (duplicate key)
    and that refusal is the guard saying no: an older change never overwrites a document and never adds
    a second one. A delete is guarded the same way, but leaves nothing behind to guard with: a
    replayed older upsert would insert the row again. The caller's memory of deletes stops that, as
    on FerretDB, rather than a tombstone document, which readers of the view, its counts and the
    bootstrap snapshot pages would all see.

    Not for FerretDB v1: it answers a bulk whose upsert meets an existing `_id` with one error at
    index 0, drops the rest of the bulk and leaves out the counts pymongo needs (seen on v1.24.2).
    """

    name = "mongodb"

    def learn(self, collection: Any, writes: list[Write]) -> dict[str, Stored]:
        return {}  # nothing to read: every write carries its own guard

    def write(
        self, collection: Any, writes: list[Write], known: Mapping[str, Stored], *, reapply: bool = False
    ) -> None:
        guard = at_most if reapply else older_than
        operations = [
            DeleteOne(guard(w)) if w.document is None else ReplaceOne(guard(w), w.document, upsert=True) for w in writes
        ]
        try:
            self.bulk_write(collection, operations, ordered=False)  # keys are distinct: order does not matter
        except BulkWriteError as exc:
            if duplicate_indexes(exc) is None:
                raise  # refused as duplicates: a newer change of that key is stored

    def bulk_write(self, collection: Any, operations: list[Any], *, ordered: bool = True) -> None:
        if operations:
            collection.bulk_write(operations, ordered=ordered)  # pymongo splits what exceeds the server's limits

    def insert_absent(self, collection: Any, documents: list[dict[str, Any]]) -> None:
        insert_absent(collection, documents, None)


def older_than(write: Write) -> dict[str, Any]:
    """The filter of the key's document while it holds an older change than this write (or no SCN at all)."""
    return {"_id": write.key, "$or": [{"_scn": {"$lt": write.scn}}, {"_scn": {"$exists": False}}]}


def at_most(write: Write) -> dict[str, Any]:
    """As `older_than`, but also while the key holds this very change: a replay asked to re-apply (a seek
    with sinks: reapply) writes it again, so a document changed by hand since is put right."""
    return {"_id": write.key, "$or": [{"_scn": {"$lte": write.scn}}, {"_scn": {"$exists": False}}]}


FERRETDB_SQLITE = FerretDBOnSQLite()
MONGODB = PlainMongoDB()


def server_for(build_info: Mapping[str, Any]) -> MongoServer:
    """The adapter for a server, from its `buildInfo` answer.

    FerretDB names itself there: v1 with `ferretdbVersion` (a wrapper-module build, as the local
    stack's, reports "unknown" as its value: the key is what counts), v2 with a `ferretdb` document.
    v2 runs on PostgreSQL with DocumentDB, not SQLite, but its bulk answers have not been checked, so
    it gets the careful path too: that path is correct on any server. Everything else is MongoDB.
    """
    if "ferretdbVersion" in build_info or "ferretdb" in build_info:
        return FERRETDB_SQLITE
    return MONGODB


_detected: weakref.WeakKeyDictionary[Any, MongoServer] = weakref.WeakKeyDictionary()


def detect(client: Any) -> MongoServer:
    """The adapter for the server a pymongo client talks to: one `buildInfo` round trip per client,
    remembered for as long as the client lives, so every writer on it can ask at each write."""
    server = _detected.get(client)
    if server is None:
        server = _detected[client] = server_for(client.admin.command("buildInfo"))
    return server
