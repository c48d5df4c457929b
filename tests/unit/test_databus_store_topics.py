"""Two topics whose names differ only in characters other than letters and digits map to one set of bootstrap
store collections (`team-a.orders` and `team_a.orders`: `*_team_a_orders`). Sharing them mixed the two topics'
snapshot rows, and a log's head (read by partition) made the second topic's changes look logged already."""

from __future__ import annotations

from typing import Any

import pytest

from fibers.consumer.events import ChangeEvent
from fibers.consumer.mongo_servers import Stored, Write
from fibers.consumer.store import BootstrapStore, StoreConflict
from tests.unit.test_databus_mongo_servers import change


class Cursor(list[dict[str, Any]]):
    def sort(self, *_: Any) -> Cursor:
        return self

    def limit(self, _: int) -> Cursor:
        return self


class Collection:
    """A collection as the store's writes use it, in memory."""

    def __init__(self) -> None:
        self.docs: dict[Any, dict[str, Any]] = {}

    def find_one(self, query: dict[str, Any]) -> dict[str, Any] | None:
        return self.docs.get(query["_id"])

    def find(self, *_: Any) -> Cursor:
        return Cursor()

    def update_one(self, query: dict[str, Any], update: dict[str, Any], upsert: bool = False) -> None:
        doc = self.docs.setdefault(query["_id"], {"_id": query["_id"], **update.get("$setOnInsert", {})})
        doc.update(update.get("$max", {}))


class Database:
    name = "store"

    def __init__(self) -> None:
        self.collections: dict[str, Collection] = {}

    def __getitem__(self, name: str) -> Collection:
        return self.collections.setdefault(name, Collection())


class Server:
    """Writes land nowhere; what was asked is kept."""

    def __init__(self) -> None:
        self.logged: list[Any] = []

    def bulk_write(self, collection: Any, operations: list[Any], *, ordered: bool = True) -> None:
        self.logged.extend(operations)

    def learn(self, collection: Any, writes: list[Write]) -> dict[str, Stored]:
        return {}

    def write(self, collection: Any, writes: list[Write], known: Any, *, reapply: bool = False) -> None:
        pass


def event_of(topic: str, key: str, scn: int) -> ChangeEvent:
    event = change(key, scn)
    event.topic = topic
    return event


def test_a_second_topic_mapping_to_the_same_collections_is_refused_before_anything_is_written() -> None:
    db, server = Database(), Server()
    first = BootstrapStore(db, server=server)  # type: ignore[arg-type]
    first.apply_window([event_of("team-a.orders", "1", 10)])
    first.apply_window([event_of("team-a.orders", "2", 11)])  # the same topic goes on
    assert db["topics"].docs["team_a_orders"]["name"] == "team-a.orders"
    written = len(server.logged)
    assert written == 2
    second = BootstrapStore(db, server=server)  # type: ignore[arg-type]  # another consumer's, same database
    for hold in (False, True):  # neither a reader nor a writer of the other topic gets in
        with pytest.raises(StoreConflict, match=r"hold topic team-a\.orders, not team_a\.orders"):
            second.check_topic("team_a.orders", hold=hold)
    with pytest.raises(StoreConflict):
        second.apply_window([event_of("team_a.orders", "1", 12)])
    assert len(server.logged) == written


def test_collections_that_name_no_topic_are_read_and_taken_by_a_writer() -> None:
    """A store written before the marker: a reader goes on; the first writer names its topic there."""
    db = Database()
    BootstrapStore(db).check_topic("team-a.orders")  # type: ignore[arg-type]
    assert "team_a_orders" not in db["topics"].docs
    BootstrapStore(db).check_topic("team-a.orders", hold=True)  # type: ignore[arg-type]
    assert db["topics"].docs["team_a_orders"]["name"] == "team-a.orders"
