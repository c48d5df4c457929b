"""Avro end to end through the real registry: Debezium writes Avro with Apicurio's converter, a Transform
reads it on real Spark pods and writes Avro back, a DatabusConsumer materialises it in MongoDB."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import fastavro
import psycopg
import pytest
from confluent_kafka import Producer
from kubernetes.client import ApiClient
from pymongo import MongoClient

from fibers.wire import HEADER, AvroDecoder, Registry
from fibers_stack import StackInfo
from tests.helpers import Resources, avro_converter, debezium_connect, read_topic, wait_for
from tests.integration.conftest import OperatorProcess

pytestmark = pytest.mark.schemas


@pytest.fixture(scope="module")
def decoder(stack_info: StackInfo) -> Iterator[AvroDecoder]:
    registry = Registry(stack_info.registry_url + "/apis/ccompat/v7")
    yield AvroDecoder(registry)
    registry.close()


@pytest.fixture(scope="module")
def avro_cdc(
    kube: ApiClient, namespace: str, operator: OperatorProcess, stack_info: StackInfo
) -> Iterator[dict[str, Any]]:
    """A table streamed by Debezium into Kafka as Avro, its schema registered by the converter."""
    table = f"avro_{namespace.replace('-', '_')}"
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, item text, qty int)")
        for i in range(4):
            pg.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", (i, f"seed{i}", i + 1))
    prefix = f"avro{namespace.replace('-', '')}"
    name = f"avro-cdc-{namespace}"
    config = avro_converter(stack_info.registry_url)
    with debezium_connect(kube, namespace, stack_info, name=name, table=table, prefix=prefix, config=config) as topic:
        yield {"table": table, "topic": topic, "connect": name}


def test_debezium_writes_avro_that_decodes_through_the_registry(
    avro_cdc: dict[str, Any], stack_info: StackInfo, decoder: AvroDecoder
) -> None:
    records = read_topic(stack_info.kafka_bootstrap, avro_cdc["topic"], 4)
    assert all(r[:1] == b"\x00" for r in records), "not the registry's wire format"
    rows = sorted((e["after"]["id"], e["after"]["item"], e["op"]) for e in map(decoder, records))
    assert rows == [(i, f"seed{i}", "r") for i in range(4)]
    subjects = decoder.registry._get("/subjects")
    assert f"{avro_cdc['topic']}-value" in subjects


def test_transform_reads_and_writes_avro_through_the_registry(
    kube: ApiClient, namespace: str, avro_cdc: dict[str, Any], stack_info: StackInfo, decoder: AvroDecoder, unique: str
) -> None:
    transforms = Resources(kube, "transforms", namespace)
    transforms.create(
        unique,
        {
            "inputs": [{"name": "orders", "connectRef": {"name": avro_cdc["connect"], "avro": {}}}],
            "sql": "SELECT after.id AS id, upper(after.item) AS item, after.qty * 10 AS qty "
            "FROM orders WHERE after IS NOT NULL",
            "output": {"kafka": {"topic": f"{unique}-out", "keyColumn": "id", "avro": {}}},
        },
    )
    transforms.wait_condition(unique, "True", "Succeeded", timeout=300)
    assert transforms.status(unique)["currentRun"]["recordsOut"] == 4
    out = [decoder(r) for r in read_topic(stack_info.kafka_bootstrap, f"{unique}-out", 4)]
    assert sorted((r["id"], r["item"], r["qty"]) for r in out) == [(i, f"SEED{i}", (i + 1) * 10) for i in range(4)]
    assert decoder.registry.subject_schemas(f"{unique}-out-value")[0], "output schema registered under <topic>-value"


def test_databus_consumer_materialises_avro_change_events(
    kube: ApiClient,
    namespace: str,
    avro_cdc: dict[str, Any],
    stack_info: StackInfo,
    mongo_secret: str,
    unique: str,
) -> None:
    consumers = Resources(kube, "databusconsumers", namespace)
    sink = {
        "type": "mongodb",
        "uriSecretRef": {"name": mongo_secret, "key": "uri"},
        "database": unique,
        "collection": "rows",
    }
    consumers.create(unique, {"sources": [avro_cdc["topic"]], "relay": {"avro": {}}, "sink": sink})
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        pg.execute(f"UPDATE {avro_cdc['table']} SET qty = 100 WHERE id = 1")
        pg.execute(f"DELETE FROM {avro_cdc['table']} WHERE id = 2")
    mongo: MongoClient[dict[str, Any]] = MongoClient(stack_info.mongodb_uri)

    def rows() -> dict[int, tuple[str, int]]:
        return {d["id"]: (d["item"], d["qty"]) for d in mongo[unique]["rows"].find()}

    expected = {0: ("seed0", 1), 1: ("seed1", 100), 3: ("seed3", 4)}
    wait_for(lambda: rows() == expected, timeout=120, what="MongoDB equals the table, from Avro events")


def test_a_record_the_job_cannot_decode_fails_the_run_instead_of_vanishing(
    kube: ApiClient, namespace: str, operator: OperatorProcess, stack_info: StackInfo, decoder: AvroDecoder, unique: str
) -> None:
    schema = {"type": "record", "name": "Row", "fields": [{"name": "id", "type": "long"}]}
    schema_id = decoder.registry.register(f"{unique}-value", json.dumps(schema))
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), {"id": 1})
    producer = Producer({"bootstrap.servers": stack_info.kafka_bootstrap})
    producer.produce(unique, value=HEADER.pack(0, schema_id) + body.getvalue())
    producer.produce(unique, value=b'{"id": 2}')  # not framed: written without the registry
    assert producer.flush(30) == 0
    transforms = Resources(kube, "transforms", namespace)
    transforms.create(
        unique,
        {
            "inputs": [{"name": "rows", "kafka": {"topics": [unique], "avro": {}}}],
            "sql": "SELECT id FROM rows",
            "output": {"kafka": {"topic": f"{unique}-out"}},
        },
    )
    cond = transforms.wait_condition(unique, "False", "RunFailed", timeout=300)
    assert f"a record of {unique} at offset 1 is not in the schema registry's wire format" in cond["message"]
