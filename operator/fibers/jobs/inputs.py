"""The Transform job's inputs: each one read into a DataFrame and registered as a view the SQL can name.

`build_views` hands each input to the reader of its kind (Kafka, files, MongoDB), so a new kind of input
is a reader here; its spec lives in `fibers.jobs.spec`, and its name as a lineage dataset in
`fibers.jobs.report`. `input_statistics` reads the inputs once more, for lineage: the rows of each, and
the Kafka offsets read per partition.

A batch run reads each Kafka input within offsets fixed once, before anything is read (`pin_kafka_reads`):
Spark reads a source again for each action over it (the output's write, the streamBack's when the cached
result was dropped, the statistics), and with `latest` resolved at each read, records written meanwhile
reached one and not another — a report and its streamBack of different inputs, `rowsIn` counting records
the result never saw.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime
from typing import Any, cast

from pyspark.sql import DataFrame, DataFrameReader, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from fibers import kafka_positions
from fibers.jobs import avro
from fibers.jobs.mongo import env_value
from fibers.jobs.spec import FilesSource, JobSpec, KafkaSource, MongoSource, Source
from fibers.mongodb import SELECTION_TIMEOUT_MS
from fibers.startfrom import StartFrom, before_retention, retention_message

log = logging.getLogger("fibers.jobs.inputs")
KAFKA_TIMEOUT_SECONDS = 30.0  # a metadata or offsets lookup of the startFrom check


# A batch Kafka input's records: Spark's `assign`, `startingOffsets` and `endingOffsets` (JSON), by input name.
KafkaReads = dict[str, dict[str, str]]
SPARK_EARLIEST = -2  # in Spark's startingOffsets JSON: the partition's first offset, resolved at the read


def pin_kafka_reads(spec: JobSpec) -> KafkaReads:
    """Batch: each Kafka input's partitions and where each ends (what it holds now), found once for the whole
    run, and where each starts: a startFrom time's offsets, found then too; `earliest` as Spark's mark for a
    partition's first offset (what retention leaves at each read: a number found once could be deleted before
    the run's last read, and fail it); any other startingOffsets as written (`latest`, which Spark refuses in
    a batch read, or Spark's own JSON). A missing topic, a time older than what Kafka keeps (StartBeforeRetention)
    or a Kafka that does not answer is a PositionsError."""
    if spec.streaming:
        return {}
    reads: KafkaReads = {}
    for item in spec.inputs:
        source = item.source
        if isinstance(source, KafkaSource):
            start = StartFrom("earliest", source.start_timestamp_ms)
            found = kafka_positions.lookup(cast(str, spec.bootstrap_servers), source.topics, start)
            if source.start_timestamp_ms is not None:
                starting = _offsets_json(found, lambda p: p.offset)
            elif source.starting_offsets == "earliest":
                starting = _offsets_json(found, lambda p: SPARK_EARLIEST)
            else:
                starting = source.starting_offsets
            reads[item.name] = _read_options(found, starting)
    return reads


def _read_options(found: list[kafka_positions.Position], starting: str) -> dict[str, str]:
    """Spark's options for reading exactly these partitions, from `starting` to the end each had when found."""
    partitions: dict[str, list[int]] = {}
    for position in found:
        partitions.setdefault(position.topic, []).append(position.partition)
    return {
        "assign": json.dumps(partitions),
        "startingOffsets": starting,
        "endingOffsets": _offsets_json(found, lambda p: p.high),
    }


def _offsets_json(found: list[kafka_positions.Position], offset: Callable[[kafka_positions.Position], int]) -> str:
    """Spark's per-partition offsets JSON: {"topic": {"0": offset, ...}, ...}."""
    by_topic: dict[str, dict[str, int]] = {}
    for position in found:
        by_topic.setdefault(position.topic, {})[str(position.partition)] = offset(position)
    return json.dumps(by_topic)


def build_views(spark: SparkSession, spec: JobSpec, reads: KafkaReads | None = None) -> dict[str, DataFrame]:
    """Read every input and register it as a temp view, so the SQL can name it (a batch run's Kafka inputs
    within `reads`, from `pin_kafka_reads`)."""
    views: dict[str, DataFrame] = {}
    for item in spec.inputs:
        frame = _read(spark, spec, item.source, (reads or {}).get(item.name))
        frame.createOrReplaceTempView(item.name)
        views[item.name] = frame
        log.info("input ready", extra={"view": item.name, "kind": type(item.source).__name__})
    return views


def _read(spark: SparkSession, spec: JobSpec, source: Source, pinned: dict[str, str] | None) -> DataFrame:
    if isinstance(source, KafkaSource):
        return _read_kafka(spark, spec, source, pinned)
    if isinstance(source, FilesSource):
        return _read_files(spark, spec.streaming, source)
    return read_mongodb(spark, source)


class StartBeforeRetention(Exception):
    """An input's startFrom.timestamp is older than what Kafka keeps: the records between may be gone."""


def _read_kafka(spark: SparkSession, spec: JobSpec, source: KafkaSource, pinned: dict[str, str] | None) -> DataFrame:
    """Batch reads what was pinned for the run; streaming follows the topics from the start."""
    if spec.streaming:
        # A streaming query with a checkpoint resumes from it: where to start no longer applies.
        if source.start_timestamp_ms is not None and not _has_checkpoint(spec):
            refuse_before_retention(cast(str, spec.bootstrap_servers), source.topics, source.start_timestamp_ms)
        raw = spark.readStream.format("kafka").options(**_kafka_options(spec, source)).load()
    else:
        raw = _kafka_reader(spark, spec, cast(dict[str, str], pinned)).load()
    if source.avro is not None:
        return avro.decode(raw, source.avro, streaming=spec.streaming)
    return decode_kafka(raw, source.schema)


def _kafka_options(spec: JobSpec, source: KafkaSource) -> dict[str, str]:
    options = {"kafka.bootstrap.servers": cast(str, spec.bootstrap_servers), "subscribe": ",".join(source.topics)}
    if source.start_timestamp_ms is None:
        return {**options, "startingOffsets": source.starting_offsets}
    # startFrom.timestamp: Spark looks up the offsets for that time; a partition with no record at or after
    # it yet starts at its end (`latest`, as fibers.startfrom says) instead of failing the query.
    return {
        **options,
        "startingTimestamp": str(source.start_timestamp_ms),
        "startingOffsetsByTimestampStrategy": "latest",
    }


def _kafka_reader(spark: SparkSession, spec: JobSpec, pinned: dict[str, str]) -> DataFrameReader:
    """A batch read of the records pinned for the run (`pin_kafka_reads`): the same at every read."""
    return spark.read.format("kafka").options(
        **{"kafka.bootstrap.servers": cast(str, spec.bootstrap_servers), **pinned}
    )


def decode_kafka(raw: DataFrame, schema: str | None) -> DataFrame:
    """Kafka rows as the SQL wants them: the JSON value's fields when a schema is given, else the record.

    Tombstones (null values, as Debezium emits after a delete) carry no fields and are dropped when
    a schema is given.
    """
    if schema is None:
        return raw.select(
            F.col("key").cast("string").alias("key"),
            F.col("value").cast("string").alias("value"),
            "topic",
            "partition",
            "offset",
            "timestamp",
        )
    parsed = F.from_json(F.col("value").cast("string"), schema).alias("parsed")
    return raw.where(F.col("value").isNotNull()).select(parsed).select("parsed.*")


def _read_files(spark: SparkSession, streaming: bool, source: FilesSource) -> DataFrame:
    if streaming:
        stream_reader = spark.readStream.format(source.format).options(**source.options)
        if source.schema is not None:
            stream_reader = stream_reader.schema(source.schema)
        return stream_reader.load(source.path)
    reader = spark.read.format(source.format).options(**source.options)
    if source.schema is not None:
        reader = reader.schema(source.schema)
    return reader.load(source.path)


def read_mongodb(spark: SparkSession, source: MongoSource) -> DataFrame:
    """A whole collection read through pymongo in the driver.

    Fine for reference-sized collections (thousands of documents, not millions): every document passes
    through the driver's memory. FerretDB speaks the MongoDB protocol but has no change streams, so
    there is no streaming variant.
    """
    from pymongo import MongoClient

    uri = env_value(source.uri_env)
    client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=SELECTION_TIMEOUT_MS)
    try:
        documents = list(client[source.database][source.collection].find())
    finally:
        client.close()
    log.info("read mongodb collection", extra={"collection": source.collection, "documents": len(documents)})
    return documents_frame(spark, documents, source.schema)


def documents_frame(spark: SparkSession, documents: Iterable[Mapping[str, Any]], schema: str | None) -> DataFrame:
    """Documents → DataFrame through JSON, so nested documents become structs and ObjectIds strings."""
    lines = [json.dumps(doc, default=_json_scalar) for doc in documents]
    if not lines:
        no_rows: list[Row] = []
        return spark.createDataFrame(no_rows, StructType() if schema is None else schema)
    reader = spark.read if schema is None else spark.read.schema(schema)
    return reader.json(spark.sparkContext.parallelize(lines, 1))


def _json_scalar(value: Any) -> Any:
    """BSON values JSON has no type for: ObjectId → hex string, dates → ISO 8601, binary → base64."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return str(value)  # ObjectId, Decimal128, Timestamp, …


def input_statistics(
    spark: SparkSession, spec: JobSpec, views: dict[str, DataFrame], reads: KafkaReads
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Rows read per input, and the Kafka offsets read per partition (one more pass over each input, within
    the offsets the run pinned)."""
    rows: dict[str, int] = {}
    offsets: list[dict[str, Any]] = []
    for item in spec.inputs:
        if isinstance(item.source, KafkaSource):
            raw = _kafka_reader(spark, spec, reads[item.name]).load()
            ranges = raw.groupBy("topic", "partition").agg(
                F.count(F.lit(1)).alias("n"), F.min("offset").alias("first"), F.max("offset").alias("last")
            )
            rows[item.name] = 0
            for r in ranges.collect():
                rows[item.name] += int(r["n"])
                offsets.append(
                    {
                        "topic": r["topic"],
                        "partition": int(r["partition"]),
                        "first": int(r["first"]),
                        "last": int(r["last"]),
                    }
                )
        else:
            rows[item.name] = views[item.name].count()
    return rows, offsets


def refuse_before_retention(bootstrap: str, topics: Iterable[str], timestamp_ms: int) -> None:
    """Spark would move a time Kafka no longer keeps up to the oldest record, unseen: refused here first."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "fibers-startfrom-check", "enable.auto.commit": False}
    )
    try:
        for topic in topics:
            partitions = consumer.list_topics(topic, timeout=KAFKA_TIMEOUT_SECONDS).topics[topic].partitions
            wanted = [TopicPartition(topic, p, timestamp_ms) for p in sorted(partitions)]
            for found in consumer.offsets_for_times(wanted, timeout=KAFKA_TIMEOUT_SECONDS):
                low, _ = consumer.get_watermark_offsets(found, timeout=KAFKA_TIMEOUT_SECONDS)
                if before_retention(found.offset, low):
                    message = retention_message("startFrom", timestamp_ms, topic, found.partition, low)
                    raise StartBeforeRetention(message)
    finally:
        consumer.close()


def _has_checkpoint(spec: JobSpec) -> bool:
    """Whether a streaming query has made progress at its checkpoint location (Spark's `offsets` log in it);
    a location that is not a local path counts as having one (the check is left to Spark there)."""
    location = spec.checkpoint_location or ""
    if "://" in location and not location.startswith("file://"):
        return True
    return os.path.isdir(os.path.join(location.removeprefix("file://"), "offsets"))
