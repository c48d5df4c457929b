"""The Transform job's outputs: the result written to its sink (Kafka, files, MongoDB) and the streamBack topic.

Every kind of sink is chosen here, for both modes: `write_outputs` writes a batch run's result and
counts its rows as they are written, `start_query` starts a streaming run's query on the same sinks,
`RowCounter` counts what the query writes (fed by `ProgressListener`) and `stop_query` lets a running
micro-batch finish first.
MongoDB is written from the Spark tasks through pymongo, one client per partition, in batches small
enough for FerretDB.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, cast

from pyspark.sql import DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryListener

from fibers.jobs import avro
from fibers.jobs.mongo import env_value
from fibers.jobs.spec import AvroRef, FilesSink, JobSpec, KafkaSink, MongoSink, Sink, SpecError
from fibers.mongodb import BULK_LIMIT, SELECTION_TIMEOUT_MS
from fibers.redact import redact

if TYPE_CHECKING:
    from pymongo.collection import Collection
    from pyspark.sql.streaming.listener import (
        QueryIdleEvent,
        QueryProgressEvent,
        QueryStartedEvent,
        QueryTerminatedEvent,
        StreamingQueryProgress,
    )
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

log = logging.getLogger("fibers.jobs.outputs")

# Seconds a finished write waits for its observed row count. Spark hands it over from its listener bus
# (~0.1 s after the write here); past this the rows are counted by a job of their own instead.
OBSERVED_COUNT_WAIT = 10.0
OBSERVED_COUNT_POLL = 0.02  # how often it looks for that count meanwhile (it comes within ~0.1 s)
# How often a stopping streaming query is looked at while its micro-batch finishes.
STOP_POLL = 0.1


def kafka_records(frame: DataFrame, key_column: str | None, avro_ref: AvroRef | None = None) -> DataFrame:
    """The key and value columns Kafka's sink wants: the whole row as a JSON object in the value, or as
    Avro in the registry's wire format."""
    row = F.struct(*[F.col(_quoted(column)) for column in frame.columns])
    encoded = F.to_json(row) if avro_ref is None else avro.value(frame, row, avro_ref, "Result")
    value = encoded.alias("value")
    if key_column is None:
        return frame.select(value)
    return frame.select(F.col(_quoted(key_column)).cast("string").alias("key"), value)


def _quoted(column: str) -> str:
    """A column name Spark takes literally (dots in names would otherwise mean struct fields)."""
    return "`" + column.replace("`", "``") + "`"


def write_outputs(spec: JobSpec, result: DataFrame) -> tuple[int, int | None]:
    """Batch: write the result to the output, then to the streamBack topic; returns the result's rows and
    the rows streamed back (None without streamBack).

    Each write counts its rows as it goes, in the same Spark job: a count of its own would be another job
    over the result (~1.5 s of a 20 s run). With both sinks the result is cached, so the SQL runs once;
    with neither, counting it is the whole run.
    """
    if spec.output is None and spec.stream_back_topic is None:
        return result.count(), None
    both = spec.output is not None and spec.stream_back_topic is not None
    frame = result.cache() if both else result
    records: int | None = None
    streamed_back: int | None = None
    try:
        if spec.output is not None:
            records = _write_batch(spec, spec.output, frame)
            log.info("output written", extra={"sink": type(spec.output).__name__, "records": records})
        if spec.stream_back_topic is not None:
            streamed_back = _write_batch(spec, KafkaSink(spec.stream_back_topic), frame)
            log.info("result streamed back", extra={"topic": spec.stream_back_topic, "records": streamed_back})
    finally:
        if both:
            frame.unpersist()
    return cast(int, streamed_back if records is None else records), streamed_back


def _write_batch(spec: JobSpec, sink: Sink, result: DataFrame) -> int:
    """Write `result` to one sink; returns the rows written."""
    if isinstance(sink, MongoSink):
        uri = env_value(sink.uri_env)  # read here: executors of a cluster may not have the variable
        written = result.sparkSession.sparkContext.accumulator(0)
        write = mongo_partition_writer(uri, sink.database, sink.collection, sink.id_column, written.add)
        result.foreachPartition(write)
        return int(written.value)
    counted = ObservedCount(result)
    if isinstance(sink, KafkaSink):
        writer = kafka_records(counted.frame, sink.key_column, sink.avro).write.format("kafka").mode("append")
        writer = writer.option("kafka.bootstrap.servers", cast(str, spec.bootstrap_servers)).option("topic", sink.topic)
        with kafka_writes_through_v2(result.sparkSession):
            writer.save()
    else:
        writer = counted.frame.write.format(sink.format).options(**sink.options)
        writer.mode(sink.mode or "overwrite").save(sink.path)
    return counted.rows()


class ObservedCount:
    """The rows of a frame, counted by the action that runs it (Spark's observed metrics) rather than by a
    job of their own.

    Spark delivers the count once an action on `frame` has succeeded as a Dataset action; pyspark's
    `Observation.get` would wait for ever if it never comes (a plain RDD action, such as
    foreachPartition, delivers nothing), so `rows` waits a bounded time and then counts instead.
    """

    def __init__(self, result: DataFrame) -> None:
        self._result = result
        self._observation = Observation()
        self.frame = result.observe(self._observation, F.count(F.lit(1)).alias("rows"))

    def rows(self, wait: float = OBSERVED_COUNT_WAIT) -> int:
        future = self._observation._jo.future()  # type: ignore[union-attr]  # set by observe()
        deadline = time.monotonic() + wait
        while not future.isCompleted():
            if time.monotonic() > deadline:
                log.warning("no observed row count from Spark; counting the result again", extra={"waited": wait})
                return self._result.count()
            time.sleep(OBSERVED_COUNT_POLL)
        return int(self._observation.get["rows"])


@contextlib.contextmanager
def kafka_writes_through_v2(spark: SparkSession) -> Iterator[None]:
    """Batch writes to Kafka through Spark's DataSource V2 path while the block runs.

    By default (`spark.sql.sources.useV1SourceList` names kafka) Spark writes a Kafka batch through its
    V1 path, which runs the write as an RDD job of its own: the write succeeds but observed metrics never
    arrive. The V2 path writes the same records with the same writer (as streaming queries do) inside the
    Dataset action, so they do. Reads are not affected: a frame's source is fixed when it is loaded.
    """
    key = "spark.sql.sources.useV1SourceList"
    before = cast(str, spark.conf.get(key))
    spark.conf.set(key, ",".join(s for s in before.split(",") if s.strip().lower() != "kafka"))
    try:
        yield
    finally:
        spark.conf.set(key, before)


def mongo_partition_writer(
    uri: str,
    database: str,
    collection: str,
    id_column: str | None,
    on_written: Callable[[int], object] | None = None,
) -> Callable[[Iterator[Row]], None]:
    """What each Spark task runs: one client per partition, documents sent in batches; `on_written` gets
    the partition's count (an accumulator's `add`)."""

    def write(rows: Iterator[Row]) -> None:
        first = next(rows, None)
        if first is None:
            return  # no connection for an empty partition
        from pymongo import MongoClient

        try:
            client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=SELECTION_TIMEOUT_MS)
            try:
                documents = (bson_ready(row.asDict(recursive=True)) for row in itertools.chain([first], rows))
                stored = store_documents(client[database][collection], documents, id_column)
            finally:
                client.close()
        except Exception as exc:
            # Spark logs a worker's traceback itself (executor and driver logs), out of _fail's reach, and
            # pymongo names what it takes for a host: a URI that is not one would show whole.
            raise MongoWriteError(redact(f"{type(exc).__name__}: {exc}", [uri])) from None
        if on_written is not None:
            on_written(stored)

    return write


class MongoWriteError(Exception):
    """A Spark task could not write its partition to MongoDB (the message has the URI masked)."""


def store_documents(
    collection: Collection[dict[str, Any]], documents: Iterable[dict[str, Any]], id_column: str | None
) -> int:
    """Upsert by id_column (as _id) so a rerun replaces its rows; insert when there is no id column."""
    from pymongo import ReplaceOne

    stored = 0
    iterator = iter(documents)
    while batch := list(itertools.islice(iterator, BULK_LIMIT)):
        if id_column is None:
            collection.insert_many(batch, ordered=False)
        else:
            collection.bulk_write([ReplaceOne({"_id": _doc_id(d, id_column)}, d, upsert=True) for d in batch])
        stored += len(batch)
    return stored


def _doc_id(document: dict[str, Any], id_column: str) -> Any:
    value = document.get(id_column)
    if value is None:
        raise ValueError(f"a row has no value in idColumn {id_column!r}; it cannot be upserted")
    document["_id"] = value
    return value


def bson_ready(value: Any) -> Any:
    """Spark values BSON cannot encode as they are: decimals, dates without a time, non-string map keys.

    Decimals become doubles: FerretDB has no decimal128 (it drops the connection on one).
    """
    if isinstance(value, dict):
        return {str(k): bson_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [bson_ready(v) for v in value]
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, date) and not isinstance(value, datetime):
        return datetime(value.year, value.month, value.day)
    return value


# --- streaming -----------------------------------------------------------------------------------


def start_query(spec: JobSpec, result: DataFrame) -> StreamingQuery:
    milliseconds = max(1, round(spec.trigger_seconds * 1000))
    writer = (
        _stream_writer(spec, result)
        .queryName(spec.run)
        .outputMode(spec.output_mode)
        .option("checkpointLocation", cast(str, spec.checkpoint_location))
        .trigger(processingTime=f"{milliseconds} milliseconds")
    )
    return writer.start()


def _stream_writer(spec: JobSpec, result: DataFrame) -> DataStreamWriter:
    sink = spec.output
    if isinstance(sink, KafkaSink):
        records = kafka_records(result, sink.key_column, sink.avro).writeStream.format("kafka")
        return records.option("kafka.bootstrap.servers", cast(str, spec.bootstrap_servers)).option("topic", sink.topic)
    if isinstance(sink, FilesSink):
        return result.writeStream.format(sink.format).options(**sink.options).option("path", sink.path)
    raise SpecError("streaming needs a kafka or files output")  # JobSpec.check rules this out


def stop_query(query: StreamingQuery, patience_seconds: float = 10.0) -> None:
    """Let a running micro-batch finish (up to a limit) before stopping, so less work is redone on restart."""
    if not query.isActive:
        return
    deadline = time.monotonic() + patience_seconds
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(STOP_POLL)
    query.stop()


class RowCounter:
    """Sums rows over micro-batches, each once, from Spark's progress reports; hands each new report on
    to `on_report` (the driver's metrics).

    Reports come from two threads: the listener's (each as it is made) and the driver's main thread,
    which reads the kept ones once after the query stops (Spark's listener bus may not have delivered
    the last). A report seen before is skipped, so overlap counts nothing twice.
    """

    def __init__(self, on_report: Callable[[StreamingQueryProgress], None] | None = None) -> None:
        self.rows = 0
        self._last_report = ""  # ISO 8601 UTC timestamps of reports sort as strings
        self._on_report = on_report
        self._lock = threading.Lock()

    def add(self, progress: Iterable[StreamingQueryProgress]) -> None:
        with self._lock:
            for report in progress:
                if report.timestamp <= self._last_report:
                    continue
                written = report.sink.numOutputRows
                self.rows += written if written >= 0 else report.numInputRows
                self._last_report = report.timestamp
                if self._on_report:
                    self._on_report(report)


class ProgressListener(StreamingQueryListener):
    """Hands each progress report of the query named `query_name` to a `RowCounter` as Spark makes it.

    Why not poll `StreamingQuery.recentProgress`: each read rebuilds every kept report (up to 100)
    through dozens of py4j calls apiece. Read once a second it held an idle streaming driver at ~70 %
    of a core (its py4j thread and Python together), CPU the pipeline's other pods then lacked.
    """

    def __init__(self, query_name: str, counter: RowCounter) -> None:
        super().__init__()
        self._query_name = query_name
        self._counter = counter

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        if event.progress.name == self._query_name:
            self._counter.add([event.progress])

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass
