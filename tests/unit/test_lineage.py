"""OpenLineage events as Fibers builds them (pure: nothing is sent)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from openlineage.client.serde import Serde

from fibers import lineage, lineage_events

SETTINGS = lineage.Settings(
    "lin", "kafka:9092,kafka2:9092", "fibers", "shop.transform.report", "0b9a1e6e-57a4-4b2f-9f0e-3d1c2b6b7a10"
)


def test_datasets_are_named_by_the_openlineage_conventions_and_carry_no_credentials() -> None:
    assert lineage.kafka("kafka:9092,kafka2:9092", "orders") == lineage.DatasetRef("kafka://kafka:9092", "orders")
    mongo = lineage.mongodb("mongodb://app:s3cret@mongo.db:27017/?tls=true", "shop", "orders", 5)
    assert mongo == lineage.DatasetRef("mongodb://mongo.db:27017", "shop.orders", 5)
    replica_set = lineage.mongodb("mongodb://app:p%40ss@h1:27017,h2:27018/?replicaSet=rs0", "shop", "orders")
    assert replica_set.namespace == "mongodb://h1:27017"  # no ValueError on the port list, no credentials
    assert (
        lineage.mongodb("mongodb+srv://u:p@cluster.example.net/", "d", "c").namespace == "mongodb://cluster.example.net"
    )
    assert lineage.mongodb("", "d", "c").namespace == "mongodb://localhost"
    assert "s3cret" not in json.dumps(mongo.__dict__)


def test_a_complete_event_carries_row_counts_and_the_ingestion_facet() -> None:
    facet = lineage.IngestionRunFacet(
        kind="Transform", rowsIn=7, rowsOut=2, offsets=[{"topic": "a.b", "partition": 0, "first": 0, "last": 6}]
    )
    event = lineage_events.build(
        SETTINGS,
        "COMPLETE",
        [lineage.kafka("kafka:9092", "orders", 7)],
        [lineage.files("/data/out", 2)],
        ingestion=facet,
    )
    body = json.loads(Serde.to_json(event))
    assert body["eventType"] == "COMPLETE" and body["run"]["runId"] == SETTINGS.run_id
    assert body["job"] == {"namespace": "fibers", "name": "shop.transform.report", "facets": {}}
    assert body["inputs"][0]["inputFacets"]["inputStatistics"]["rowCount"] == 7
    assert body["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 2
    ingestion = body["run"]["facets"]["fibers_ingestion"]
    assert (ingestion["rowsIn"], ingestion["rowsOut"], ingestion["offsets"][0]["topic"]) == (7, 2, "a.b")
    assert ingestion["_schemaURL"] == lineage_events.FACET_SCHEMA


def test_a_step_a_replay_moved_is_an_other_event_whose_facet_names_the_replay() -> None:
    facet = lineage.ReplayRunFacet("shop/fix-0900", "from 2026-11-27T09:00:00.000Z", 1234)
    body = json.loads(Serde.to_json(lineage_events.build(SETTINGS, "OTHER", [], [], replay=facet)))
    assert body["eventType"] == "OTHER"
    replay = body["run"]["facets"]["fibers_replay"]
    assert (replay["replay"], replay["startFrom"], replay["records"]) == ("shop/fix-0900", facet.startFrom, 1234)
    assert replay["_schemaURL"] == lineage_events.REPLAY_FACET_SCHEMA


def test_settings_round_trip_through_the_rendered_spec() -> None:
    assert lineage.Settings.from_dict(SETTINGS.to_dict()) == SETTINGS


def test_a_failed_run_carries_the_error_message_facet() -> None:
    event = lineage_events.build(SETTINGS, "FAIL", [], [], error="division by zero")
    body = json.loads(Serde.to_json(event))
    assert body["eventType"] == "FAIL"
    assert body["run"]["facets"]["errorMessage"]["message"] == "division by zero"


def test_the_operator_and_the_consumer_runtime_do_not_load_the_openlineage_client() -> None:
    """It costs a process ~25 MiB; only a run that reports lineage imports it (on its first event)."""
    code = (
        "import sys, fibers.controller, fibers.consumer.runtime, fibers.jobs.spec; "
        "print(sorted(m for m in sys.modules if m.startswith('openlineage')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_a_dataset_a_reference_resolved_names_the_resource_that_writes_it() -> None:
    """connectRef and transformRef inputs (and consumer sourceRefs) link lineage the way the pipeline does."""
    from fibers.jobs.spec import JobSpec
    from fibers.transform.spec import Defaults, render_job

    spec = {
        "inputs": [
            {"name": "changes", "connectRef": {"name": "orders-cdc"}},
            {"name": "agg", "transformRef": {"name": "by-item"}},
            {"name": "raw", "kafka": {"topics": ["raw"]}},
        ],
        "sql": "SELECT 1",
        "output": {"files": {"path": "/o", "format": "json"}},
    }
    job = render_job(
        spec,
        name="report",
        namespace="shop",
        run="r-1",
        ref_topics={"changes": ["shop.public.orders"], "agg": ["shop.by-item"]},
        defaults=Defaults(kafka_bootstrap="kafka:9092"),
    )
    parsed = JobSpec.from_dict(job)
    datasets = [d for i in parsed.inputs for d in i.source.datasets("kafka:9092", None)]
    assert [(d.name, d.producer) for d in datasets] == [
        ("shop.public.orders", lineage.Producer("Connect", "orders-cdc", "shop")),
        ("shop.by-item", lineage.Producer("Transform", "by-item", "shop")),
        ("raw", None),
    ]
    body = json.loads(Serde.to_json(lineage_events.build(SETTINGS, "START", datasets, [])))
    assert body["inputs"][0]["facets"]["fibers_producer"]["kind"] == "Connect"
    assert body["inputs"][0]["facets"]["fibers_producer"]["name"] == "orders-cdc"
    assert body["inputs"][0]["facets"]["fibers_producer"]["_schemaURL"] == lineage_events.PRODUCER_FACET_SCHEMA
    assert "fibers_producer" not in body["inputs"][2]["facets"]


def test_a_consumers_sources_carry_their_producer_into_its_configuration() -> None:
    from fibers.databus.config import ConsumerConfig
    from fibers.databus.workload import render_config

    body = {
        "metadata": {"name": "view", "namespace": "shop", "uid": "u"},
        "spec": {"sourceRefs": [{"connectRef": {"name": "orders-cdc"}}], "sink": {"type": "log"}},
    }
    producer = {"kind": "Connect", "name": "orders-cdc", "namespace": "shop"}
    config = render_config(
        body,
        topics=["shop.public.orders"],
        kafka_bootstrap="kafka:9092",
        producers={"shop.public.orders": producer, "shop.transaction": producer},
    )
    parsed = ConsumerConfig.from_dict(config).check()
    assert parsed.producers == {"shop.public.orders": producer}  # only what it consumes


@pytest.mark.parametrize(
    "uri",
    [
        "mongodb://app:abc#def@db:27017/admin",  # pymongo takes it: the password is abc#def
        "mongodb://app:s3/cr@db:27017/admin",  # refused by pymongo, but a Transform's START event goes first
        "mongodb://app:pa?ss@db:27017/admin",
        "mongodb://app:p@ss@db:27017",
        "mongodb://app:secret",  # no host at all
        "s3cr3t",  # a Secret holding the bare password, not a URI
    ],
)
def test_a_uri_with_unescaped_characters_in_its_password_names_no_part_of_it(uri: str) -> None:
    """The dataset was named from `urlsplit`'s netloc, which ends at the first `#`, `/` or `?`: a password
    holding one gave `mongodb://app:abc` — the user and the start of the password — in every event of a topic
    any team reads."""
    namespace = lineage.mongodb(uri, "d", "c").namespace
    assert namespace in ("mongodb://db:27017", "mongodb://unknown"), namespace
    assert "app" not in namespace and "s3cr3t" not in namespace
