"""A user's own callback, as the README walks through it (examples/callback): its tests, its image, its consumer.

The image is built from the example's Dockerfile, FROM the stack's job image, and runs on the node as a
DatabusConsumer's pods; the callback keeps per-item totals of a Debezium-streamed table in PostgreSQL.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kubernetes import client
from kubernetes.client import ApiClient

import fibers_stack as stack
from fibers_stack import StackInfo
from tests.helpers import Resources, debezium_connect, wait_for
from tests.integration.conftest import OperatorProcess

pytestmark = pytest.mark.databus

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "callback"


def test_the_example_callbacks_own_tests_pass_against_postgresql(stack_info: StackInfo) -> None:
    env = {**os.environ, "ITEM_TOTALS_TEST_DSN": stack_info.postgres_dsn}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "."],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 passed" in run.stdout and "skipped" not in run.stdout, run.stdout


def expected_totals(pg: psycopg.Connection[tuple[Any, ...]], table: str) -> dict[str, tuple[int, int, float]]:
    rows = pg.execute(f"SELECT item, count(*), sum(qty), sum(qty * price) FROM {table} GROUP BY item").fetchall()
    return {item: (int(n), int(qty), round(float(amount), 6)) for item, n, qty, amount in rows}


def stored_totals(pg: psycopg.Connection[tuple[Any, ...]], table: str) -> dict[str, tuple[int, int, float]]:
    try:
        rows = pg.execute(f"SELECT item, orders, qty, amount FROM {table} WHERE orders > 0").fetchall()
    except psycopg.errors.UndefinedTable:
        return {}
    return {item: (int(n), int(qty), round(float(amount), 6)) for item, n, qty, amount in rows}


def test_the_example_image_runs_on_the_node_and_keeps_its_totals(
    kube: ApiClient, namespace: str, operator: OperatorProcess, stack_info: StackInfo, unique: str
) -> None:
    image = stack.user_image(stack_info, "fibers-example-callback", EXAMPLE)
    source, totals = f"orders_{unique.replace('-', '_')}", f"totals_{unique.replace('-', '_')}"
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        pg.execute(f"CREATE TABLE {source} (id int PRIMARY KEY, item text, qty int, price double precision)")
        pg.execute(f"ALTER TABLE {source} REPLICA IDENTITY FULL")
        for i in range(20):
            pg.execute(f"INSERT INTO {source} VALUES (%s, %s, %s, %s)", (i, f"item{i % 4}", 1 + i % 3, 2.5))
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name=f"{unique}-pg"), string_data={"dsn": stack_info.postgres_dsn}
    )
    client.CoreV1Api(kube).create_namespaced_secret(namespace, secret)
    prefix = f"cb{unique.replace('-', '')}"
    with (
        debezium_connect(
            kube, namespace, stack_info, name=f"{unique}-cdc", table=source, prefix=prefix, config={}
        ) as topic,
        psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg,
    ):
        consumers = Resources(kube, "databusconsumers", namespace)
        consumers.create(
            unique,
            {
                "sources": [topic],
                "startPosition": "earliest",
                "image": image,
                "sink": {
                    "type": "callback",
                    "callback": "item_totals:ItemTotals",
                    "uriSecretRef": {"name": f"{unique}-pg", "key": "dsn"},
                    "options": {"table": totals},
                },
            },
        )
        rng = random.Random(5)
        for round_ in range(30):  # updates (an order moving between items), deletes and new orders
            with pg.transaction():
                moved = (f"item{rng.randint(0, 3)}", rng.randint(0, 19))
                pg.execute(f"UPDATE {source} SET item = %s, qty = qty + 1 WHERE id = %s", moved)
                if round_ % 5 == 0:
                    pg.execute(f"DELETE FROM {source} WHERE id = %s", (round_,))
                pg.execute(f"INSERT INTO {source} VALUES (%s, %s, %s, %s)", (100 + round_, "item9", 2, 4.0))
        expected = expected_totals(pg, source)
        wait_for(
            lambda: stored_totals(pg, totals) == expected, timeout=180, what="the callback's totals equal the table's"
        )
        consumers.wait_condition(unique, "True", "Consuming", timeout=60)
        selector = f"fibers.dev/databusconsumer={unique}"
        pod = client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector=selector).items[0]
        container = pod.spec.containers[0]
        assert container.image == image
        dsn_env = [e for e in container.env if e.value_from is not None and e.value_from.secret_key_ref is not None]
        assert [e.value_from.secret_key_ref.name for e in dsn_env] == [f"{unique}-pg"]  # a reference, never the value
        assert stack_info.postgres_dsn not in str(pod.spec)
        consumers.delete(unique)
        wait_for(lambda: not consumers.exists(unique), timeout=60, what="consumer deleted")
