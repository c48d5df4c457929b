"""Tests of the callback without Kafka: fibers.consumer.api's Feeder feeds it windows as a consumer pod would.

They need a PostgreSQL: ITEM_TOTALS_TEST_DSN names one (the local stack's is FIBERS_POSTGRES_DSN in
`fibers-stack env`). Run from this folder:  ITEM_TOTALS_TEST_DSN=... pytest
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from item_totals import ItemTotals

from fibers.consumer.api import Feeder, change


@pytest.fixture
def dsn() -> str:
    value = os.environ.get("ITEM_TOTALS_TEST_DSN")
    if not value:
        pytest.skip("set ITEM_TOTALS_TEST_DSN to a PostgreSQL to run these")
    return value


@pytest.fixture
def feeder(dsn: str) -> Iterator[Feeder]:
    table = f"totals_{uuid.uuid4().hex[:8]}"
    feeder = Feeder(ItemTotals(dsn, table))
    yield feeder
    feeder.stop()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}, {table}_applied")


def totals(feeder: Feeder) -> dict[str, tuple[int, int, float]]:
    callback: ItemTotals = feeder.callback  # type: ignore[assignment]
    rows = callback.conn.execute(f"SELECT item, orders, qty, amount FROM {callback.totals} WHERE orders > 0")
    return {item: (orders, qty, round(amount, 6)) for item, orders, qty, amount in rows}


def order(item: str, qty: int, price: float = 2.5) -> dict[str, object]:
    return {"item": item, "qty": qty, "price": price}


def test_inserts_updates_and_deletes_add_up(feeder: Feeder) -> None:
    feeder.window([change("1", order("a", 2), scn=10, op="c"), change("2", order("b", 1), scn=10, op="c")])
    assert totals(feeder) == {"a": (1, 2, 5.0), "b": (1, 1, 2.5)}
    feeder.window([change("1", order("b", 3), scn=11)])  # order 1 moves from a to b
    feeder.window([change("2", None, scn=12, op="d")])
    assert totals(feeder) == {"b": (1, 3, 7.5)}


def test_a_window_delivered_again_changes_nothing(feeder: Feeder) -> None:
    window = [change("1", order("a", 2), scn=10, op="c")]
    feeder.window(window)
    feeder.window(window)  # a replay after a rollback or a restart
    feeder.window([change("1", order("a", 9), scn=9)])  # an older change arriving late
    assert totals(feeder) == {"a": (1, 2, 5.0)}


def test_a_window_that_fails_writes_none_of_its_changes(feeder: Feeder) -> None:
    feeder.window([change("1", order("a", 2), scn=10, op="c")])
    with pytest.raises(KeyError):
        feeder.window([change("2", order("a", 1), scn=11, op="c"), change("3", {"qty": 1}, scn=11, op="c")])
    assert totals(feeder) == {"a": (1, 2, 5.0)}  # order 2 was not counted either
    assert feeder.rollbacks == [10]  # rolled back to the last checkpoint's SCN
    feeder.window([change("2", order("a", 1), scn=11, op="c")])  # the replay, without the bad row
    assert totals(feeder) == {"a": (2, 3, 7.5)}


def test_a_bootstrap_page_counts_like_a_window(feeder: Feeder) -> None:
    feeder.bootstrap([change(str(i), order("a", 1), scn=5, op="r") for i in range(3)])
    feeder.window([change("0", None, scn=6, op="d")])
    assert totals(feeder) == {"a": (2, 2, 5.0)}
