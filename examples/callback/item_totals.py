"""A DatabusConsumer callback of your own: per-item totals of the orders table, kept in PostgreSQL.

It follows the Databus callback contract (`fibers.consumer.api`, the consumer's stable surface): the consumer hands it
windows — one source transaction each — and moves its checkpoint only after the windows' callbacks
succeeded. It builds on WindowSink, which collects complete windows and hands
them to `flush` once per batch (a rolled-back window never reaches it); `flush` applies them in one
PostgreSQL transaction and remembers per order the SCN it last applied, so a window replayed after
a rollback or a restart changes nothing twice.

Tables (created when missing), for `table="item_totals"`:
    item_totals          item text primary key, orders bigint, qty bigint, amount double precision
    item_totals_applied  order_key text primary key, scn bigint, item text, qty bigint, amount double precision
The second holds each order's current contribution to the totals (a deleted order contributes nothing).

Used as:
    sink:
      type: callback
      callback: item_totals:ItemTotals
      uriSecretRef: {name: shop-postgres, key: dsn}   # reaches the class as its `uri` argument
      options: {table: item_totals}
"""

from __future__ import annotations

import re
from typing import Any

import psycopg

from fibers.consumer.api import ChangeEvent, WindowSink

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")


class ItemTotals(WindowSink):
    def __init__(self, uri: str, table: str = "item_totals") -> None:
        super().__init__()
        if not _NAME.match(table):
            raise ValueError(f"table must be a plain lower-case SQL name, not {table!r}")
        self.totals, self.applied = table, f"{table}_applied"
        self.conn = psycopg.connect(uri, autocommit=True)
        self.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self.totals} "
            "(item text PRIMARY KEY, orders bigint NOT NULL, qty bigint NOT NULL, amount double precision NOT NULL)"
        )
        self.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self.applied} (order_key text PRIMARY KEY, scn bigint NOT NULL, "
            "item text, qty bigint NOT NULL, amount double precision NOT NULL)"
        )

    def flush(self, events: list[ChangeEvent]) -> None:
        """The complete windows of a batch (or a bootstrap page), in order: all of them or none."""
        with self.conn.transaction():
            for event in events:
                self._apply(event)

    def close(self) -> None:
        self.conn.close()

    def _apply(self, event: ChangeEvent) -> None:
        before = self.conn.execute(
            f"SELECT scn, item, qty, amount FROM {self.applied} WHERE order_key = %s FOR UPDATE", (event.key,)
        ).fetchone()
        if before is not None and before[0] >= event.scn:
            return  # applied already (a replay), or a newer change of this order is
        if before is not None and before[1] is not None:
            self._add(before[1], -1, -before[2], -before[3])
        row: dict[str, Any] | None = event.document
        item, qty, amount = None, 0, 0.0
        if row is not None:
            item, qty = str(row["item"]), int(row["qty"])
            amount = qty * float(row.get("price") or 0)
            self._add(item, 1, qty, amount)
        self.conn.execute(
            f"INSERT INTO {self.applied} VALUES (%s, %s, %s, %s, %s) ON CONFLICT (order_key) DO UPDATE "
            "SET scn = excluded.scn, item = excluded.item, qty = excluded.qty, amount = excluded.amount",
            (event.key, event.scn, item, qty, amount),
        )

    def _add(self, item: str, orders: int, qty: int, amount: float) -> None:
        self.conn.execute(
            f"INSERT INTO {self.totals} VALUES (%s, %s, %s, %s) ON CONFLICT (item) DO UPDATE SET "
            f"orders = {self.totals}.orders + excluded.orders, qty = {self.totals}.qty + excluded.qty, "
            f"amount = {self.totals}.amount + excluded.amount",
            (item, orders, qty, amount),
        )
