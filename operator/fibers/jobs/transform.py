"""The Spark driver program of a Transform: read the inputs, run the SQL (or entrypoint), write the result.

Run as ``python -m fibers.jobs.transform --spec '<json>'`` with the spec the operator renders.

Exit codes: 0 the batch finished, or a streaming query was stopped by SIGTERM/SIGINT; 1 the job failed
(``fibers-transform: error: <Spark's message>`` on stderr); 2 the spec cannot be run (the message says
which field to fix). A run that ends with 0 prints ``FIBERS_RESULT {...}`` as its last stdout line, and
also writes it to the result ConfigMap when the spec names one; a failed run writes its error message
there instead (key ``error``), so the operator can show Spark's words rather than an exit code.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import importlib
import itertools
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, DataFrameReader, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from fibers import lineage, logs, termination
from fibers.jobs import avro
from fibers.jobs.spec import (
    AvroRef,
    FilesSink,
    FilesSource,
    JobSpec,
    KafkaSink,
    KafkaSource,
    MongoSink,
    MongoSource,
    Sink,
    Source,
    SpecError,
    split_entrypoint,
)
from fibers.redact import redact, truncate
from fibers.spark import session

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api
    from pymongo.collection import Collection
    from pyspark.sql.streaming.listener import StreamingQueryProgress
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

log = logging.getLogger("fibers.jobs.transform")

MONGO_TIMEOUT_MS = 15_000
ERROR_LIMIT = 8192  # characters of an error kept in the result ConfigMap (Java stack traces run long)
MONGO_BATCH = 50  # FerretDB v1 (SQLite) stops answering when one bulk replaces ~100 existing documents

Entrypoint = Callable[[SparkSession, dict[str, DataFrame]], object]


# --- inputs --------------------------------------------------------------------------------------


def build_views(spark: SparkSession, spec: JobSpec) -> dict[str, DataFrame]:
    """Read every input and register it as a temp view, so the SQL can name it."""
    views: dict[str, DataFrame] = {}
    for item in spec.inputs:
        frame = _read(spark, spec, item.source)
        frame.createOrReplaceTempView(item.name)
        views[item.name] = frame
        log.info("input ready", extra={"view": item.name, "kind": type(item.source).__name__})
    return views


def _read(spark: SparkSession, spec: JobSpec, source: Source) -> DataFrame:
    if isinstance(source, KafkaSource):
        return _read_kafka(spark, spec, source)
    if isinstance(source, FilesSource):
        return _read_files(spark, spec.streaming, source)
    return read_mongodb(spark, source)


def _read_kafka(spark: SparkSession, spec: JobSpec, source: KafkaSource) -> DataFrame:
    """Batch reads what the topics hold now (start → latest); streaming follows them from the start."""
    if spec.streaming:
        raw = spark.readStream.format("kafka").options(**_kafka_options(spec, source)).load()
    else:
        raw = _kafka_reader(spark, spec, source).load()
    if source.avro is not None:
        return avro.decode(raw, source.avro, streaming=spec.streaming)
    return decode_kafka(raw, source.schema)


def _kafka_options(spec: JobSpec, source: KafkaSource) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": cast(str, spec.bootstrap_servers),
        "subscribe": ",".join(source.topics),
        "startingOffsets": source.starting_offsets,
    }


def _kafka_reader(spark: SparkSession, spec: JobSpec, source: KafkaSource) -> DataFrameReader:
    """A batch read of what the topics hold when it runs (their start, or latest, up to latest)."""
    return spark.read.format("kafka").options(**_kafka_options(spec, source), endingOffsets="latest")


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
    client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=MONGO_TIMEOUT_MS)
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


def env_value(name: str) -> str:
    """A connection URI handed to the pod through the environment (the spec only names the variable)."""
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"environment variable {name} is not set (it should hold the MongoDB URI)")
    return value


# --- the transformation --------------------------------------------------------------------------


def transform(spark: SparkSession, spec: JobSpec, views: dict[str, DataFrame]) -> DataFrame:
    """The spec's SQL over the views, or the user's entrypoint function given the same views."""
    if spec.sql is not None:
        return spark.sql(spec.sql)
    entrypoint = cast(str, spec.entrypoint)
    result = load_entrypoint(entrypoint)(spark, views)
    if not isinstance(result, DataFrame):
        raise TypeError(f"entrypoint {entrypoint} returned {type(result).__name__}, not a DataFrame")
    return result


def load_entrypoint(entrypoint: str) -> Entrypoint:
    module_name, attribute = split_entrypoint(entrypoint)
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"entrypoint {entrypoint} is not callable")
    return cast(Entrypoint, target)


# --- outputs -------------------------------------------------------------------------------------


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


def write_outputs(spec: JobSpec, result: DataFrame) -> None:
    """Batch: write the result to the output, then to the streamBack topic (both read the cached result)."""
    if spec.output is not None:
        _write_batch(spec, spec.output, result)
        log.info("output written", extra={"sink": type(spec.output).__name__})
    if spec.stream_back_topic is not None:
        _write_batch(spec, KafkaSink(spec.stream_back_topic), result)
        log.info("result streamed back", extra={"topic": spec.stream_back_topic})


def _write_batch(spec: JobSpec, sink: Sink, result: DataFrame) -> None:
    if isinstance(sink, KafkaSink):
        writer = kafka_records(result, sink.key_column, sink.avro).write.format("kafka").mode("append")
        writer.option("kafka.bootstrap.servers", cast(str, spec.bootstrap_servers)).option("topic", sink.topic).save()
    elif isinstance(sink, FilesSink):
        result.write.format(sink.format).options(**sink.options).mode(sink.mode or "overwrite").save(sink.path)
    else:
        uri = env_value(sink.uri_env)  # read here: executors of a cluster may not have the variable
        result.foreachPartition(mongo_partition_writer(uri, sink.database, sink.collection, sink.id_column))


def mongo_partition_writer(
    uri: str, database: str, collection: str, id_column: str | None
) -> Callable[[Iterator[Row]], None]:
    """What each Spark task runs: one client per partition, documents sent in batches."""

    def write(rows: Iterator[Row]) -> None:
        first = next(rows, None)
        if first is None:
            return  # no connection for an empty partition
        from pymongo import MongoClient

        try:
            client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=MONGO_TIMEOUT_MS)
            try:
                documents = (bson_ready(row.asDict(recursive=True)) for row in itertools.chain([first], rows))
                store_documents(client[database][collection], documents, id_column)
            finally:
                client.close()
        except Exception as exc:
            # Spark logs a worker's traceback itself (executor and driver logs), out of _fail's reach, and
            # pymongo names what it takes for a host: a URI that is not one would show whole.
            raise MongoWriteError(redact(f"{type(exc).__name__}: {exc}", [uri])) from None

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
    while batch := list(itertools.islice(iterator, MONGO_BATCH)):
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


# --- running -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobResult:
    records_out: int
    streamed_back: int | None
    seconds: float
    rows_in: dict[str, int] | None = None  # per input (batch runs that report lineage)
    offsets: list[dict[str, Any]] | None = None  # Kafka read: {topic, partition, first, last} each

    def to_dict(self) -> dict[str, int | float | None]:
        return {"recordsOut": self.records_out, "streamedBack": self.streamed_back, "seconds": round(self.seconds, 3)}


def run(spark: SparkSession, spec: JobSpec) -> JobResult:
    """One batch: the result is cached and counted once, so the writes do not run the SQL again."""
    started = time.monotonic()
    views = build_views(spark, spec)
    result = transform(spark, spec, views).cache()
    try:
        records = result.count()
        log.info("result computed", extra={"records": records})
        write_outputs(spec, result)
    finally:
        result.unpersist()
    streamed_back = records if spec.stream_back_topic is not None else None
    rows_in, offsets = input_statistics(spark, spec, views) if spec.lineage else (None, None)
    return JobResult(records, streamed_back, time.monotonic() - started, rows_in, offsets)


def input_statistics(
    spark: SparkSession, spec: JobSpec, views: dict[str, DataFrame]
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Rows read per input, and the Kafka offsets read per partition (one more pass over each input)."""
    rows: dict[str, int] = {}
    offsets: list[dict[str, Any]] = []
    for item in spec.inputs:
        if isinstance(item.source, KafkaSource):
            raw = _kafka_reader(spark, spec, item.source).load()
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


def run_streaming(spark: SparkSession, spec: JobSpec, stop: threading.Event, poll_seconds: int = 1) -> JobResult:
    """Run the query until `stop` is set (main sets it on SIGTERM/SIGINT); a failed query raises.

    recordsOut counts the rows the sink reports writing in this run (for sinks that do not report it,
    such as files, the rows read instead).
    """
    started = time.monotonic()
    result = transform(spark, spec, build_views(spark, spec))
    if not result.isStreaming:
        raise TypeError("the transformation does not read any stream; use mode batch for this spec")
    query = start_query(spec, result)
    log.info("streaming query started", extra={"query": query.name, "checkpoint": spec.checkpoint_location})
    counter = RowCounter()
    try:
        while not stop.is_set():
            if query.awaitTermination(poll_seconds):  # raises StreamingQueryException if the query failed
                break
            counter.add(query.recentProgress)
    finally:
        stop_query(query)
    counter.add(query.recentProgress)
    log.info("streaming query stopped", extra={"query": query.name, "records": counter.rows})
    return JobResult(counter.rows, None, time.monotonic() - started)


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
        time.sleep(0.1)
    query.stop()


class RowCounter:
    """Sums rows over micro-batches, each once, from the progress reports Spark keeps."""

    def __init__(self) -> None:
        self.rows = 0
        self._last_report = ""  # ISO 8601 UTC timestamps of reports sort as strings

    def add(self, progress: Iterable[StreamingQueryProgress]) -> None:
        for report in progress:
            if report.timestamp <= self._last_report:
                continue
            written = report.sink.numOutputRows
            self.rows += written if written >= 0 else report.numInputRows
            self._last_report = report.timestamp


# --- reporting and main --------------------------------------------------------------------------


def publish(spec: JobSpec, result: JobResult) -> None:
    """The result for the operator: in the ConfigMap when named, and always as the last stdout line."""
    if spec.result_config_map:
        write_result_config_map(cast(str, spec.namespace), spec.result_config_map, spec.name, result)
    print(f"FIBERS_RESULT {json.dumps(result.to_dict())}", flush=True)


@functools.cache
def _core_api() -> CoreV1Api:
    from kubernetes import client

    from fibers.kube import load_client

    return client.CoreV1Api(load_client())


def _prepare_core_api() -> None:
    """Warm `_core_api` in the background; a failure here is reported when the result is written."""
    with contextlib.suppress(Exception):
        _core_api()


def write_result_config_map(namespace: str, name: str, transform_name: str, result: JobResult) -> bool:
    """Create or replace the ConfigMap; Kubernetes being out of reach is a warning, never a job failure.

    Values are strings, as ConfigMaps require; a missing value (no streamBack) is the empty string.
    """
    data = {key: "" if value is None else str(value) for key, value in result.to_dict().items()}
    return _write_config_map(namespace, name, transform_name, data)


def write_error_config_map(namespace: str, name: str, transform_name: str, message: str) -> bool:
    """The failure for the operator, in the same ConfigMap: `error` is Spark's message (already redacted).

    The Spark Operator only sees the driver's exit code; this is what puts Spark's words (an error class
    such as TABLE_OR_VIEW_NOT_FOUND) into the Transform's condition.
    """
    return _write_config_map(namespace, name, transform_name, {"error": truncate(message, ERROR_LIMIT)})


def _write_config_map(namespace: str, name: str, transform_name: str, data: dict[str, str]) -> bool:
    try:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        core = _core_api()
        labels = {"app.kubernetes.io/managed-by": "fibers", "fibers.dev/transform": transform_name}
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels), data=data
        )
        try:
            core.create_namespaced_config_map(namespace, body, _request_timeout=10)
        except ApiException as exc:
            if exc.status != 409:
                raise
            core.replace_namespaced_config_map(name, namespace, body, _request_timeout=10)
    except Exception as exc:
        log.warning(
            "could not write the result ConfigMap",
            extra={"configmap": f"{namespace}/{name}", "error": truncate(_first_line(exc), 300)},
        )
        return False
    log.info("result ConfigMap written", extra={"configmap": f"{namespace}/{name}"})
    return True


def error_message(exc: BaseException) -> str:
    """Spark's own words for a Spark failure (error class first), the exception otherwise."""
    if isinstance(exc, PySparkException):
        return (exc.getMessage() or str(exc)).strip()
    java_exception = getattr(exc, "java_exception", None)  # py4j's Py4JJavaError
    if java_exception is not None:
        text = str(java_exception.toString()).strip()
        cause = python_worker_error(text)
        return f"{cause} (raised in a Python worker)\n{text}" if cause else text
    return f"{type(exc).__name__}: {exc}".strip()


def python_worker_error(text: str) -> str | None:
    """The exception line of a Python traceback Spark relays from a worker (foreachPartition, UDFs).

    Spark's own first line only says the stage failed; the cause is the traceback's last line.
    """
    _, found, rest = text.partition("Traceback (most recent call last):")
    if not found:
        return None
    last = None
    for line in rest.splitlines()[1:]:
        if line.startswith("\tat ") or line.startswith("Caused by:"):
            break  # the Java stack that follows the traceback
        if line and not line[0].isspace():
            last = line
    return last


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _secrets(spec: JobSpec) -> list[str]:
    return [value for name in spec.uri_envs() if (value := os.environ.get(name))]


def _fail(exc: BaseException, spec: JobSpec, emitter: lineage.Emitter | None = None) -> int:
    """Exit 1 with one error line, also written to the result ConfigMap when the spec names one, and sent
    in a FAIL lineage event when lineage is on.

    A traceback goes first when the failure is not Spark's (user code, pymongo).
    """
    secrets = _secrets(spec)
    if not isinstance(exc, PySparkException) and getattr(exc, "java_exception", None) is None:
        sys.stderr.write(redact("".join(traceback.format_exception(exc)), secrets))
    message = redact(error_message(exc), secrets)
    print(f"fibers-transform: error: {message}", file=sys.stderr, flush=True)
    termination.write(message)
    if spec.result_config_map:
        write_error_config_map(cast(str, spec.namespace), spec.result_config_map, spec.name, message)
    if emitter:
        emitter.fail(*lineage_datasets(spec, None), message)
    return 1


def _invalid_spec(text: str, exc: SpecError) -> int:
    """Exit 2; the message also goes to the result ConfigMap when the spec still names one."""
    message = f"invalid spec: {exc}"
    print(f"fibers-transform: error: {message}", file=sys.stderr, flush=True)
    termination.write(message)
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        raw = json.loads(text)
        target, namespace, name = raw.get("resultConfigMap"), raw.get("namespace"), raw.get("name")
        if all(isinstance(v, str) and v for v in (target, namespace, name)):
            write_error_config_map(namespace, target, name, message)
    return 2


def _stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM (pod deletion) and SIGINT only set a flag; the streaming loop stops the query cleanly."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)  # replaces the handler pyspark installs (cancel jobs, raise)


def _quiet_sql_error_log() -> None:
    """pyspark logs each SQL error with both stack traces, twice (~10 KB); the error line already says it."""
    from pyspark.logger import PySparkLogger

    PySparkLogger.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fibers-transform", description="Run one Fibers Transform in Spark.")
    parser.add_argument("--spec", required=True, help="the job spec as JSON, as the operator renders it")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logs.setup()
    _quiet_sql_error_log()
    try:
        args = _parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage
        return exc.code if isinstance(exc.code, int) else 2
    try:
        spec = JobSpec.from_json(args.spec)
    except SpecError as exc:
        return _invalid_spec(args.spec, exc)
    log.info("transform starting", extra={"transform": spec.name, "run": spec.run, "mode": spec.mode})
    if spec.result_config_map:  # setting up the Kubernetes client takes ~0.6 s: do it while Spark starts
        threading.Thread(target=_prepare_core_api, daemon=True).start()
    # Python workers (foreachPartition, UDFs) must run this interpreter, not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    emitter = lineage.Emitter(spec.lineage) if spec.lineage else None
    if emitter:
        emitter.start(*lineage_datasets(spec, None))
    spark: SparkSession | None = None
    try:
        spark = session(f"fibers-{spec.run}", master=spec.master, conf=spec.spark_conf)
        if spec.streaming:
            stop = threading.Event()
            _stop_on_signals(stop)
            result = run_streaming(spark, spec, stop)
        else:
            result = run(spark, spec)
    except Exception as exc:
        return _fail(exc, spec, emitter)
    finally:
        if spark is not None:
            spark.stop()
    publish(spec, result)
    if emitter:
        emitter.complete(*lineage_datasets(spec, result), ingestion(spec, result))
    return 0


def lineage_datasets(
    spec: JobSpec, result: JobResult | None
) -> tuple[list[lineage.DatasetRef], list[lineage.DatasetRef]]:
    """What the run reads and writes, as OpenLineage datasets; with row counts once it has run."""
    bootstrap = spec.bootstrap_servers or ""
    rows_in = (result.rows_in if result else None) or {}
    inputs: list[lineage.DatasetRef] = []
    for item in spec.inputs:
        rows = rows_in.get(item.name)
        source = item.source
        if isinstance(source, KafkaSource):
            single = len(source.topics) == 1
            inputs += [lineage.kafka(bootstrap, t, rows if single else None) for t in source.topics]
        elif isinstance(source, FilesSource):
            inputs.append(lineage.files(source.path, rows))
        else:
            inputs.append(lineage.mongodb(os.environ.get(source.uri_env, ""), source.database, source.collection, rows))
    out = result.records_out if result else None
    outputs: list[lineage.DatasetRef] = []
    if isinstance(spec.output, KafkaSink):
        outputs.append(lineage.kafka(bootstrap, spec.output.topic, out))
    elif isinstance(spec.output, FilesSink):
        outputs.append(lineage.files(spec.output.path, out))
    elif isinstance(spec.output, MongoSink):
        sink = spec.output
        outputs.append(lineage.mongodb(os.environ.get(sink.uri_env, ""), sink.database, sink.collection, out))
    if spec.stream_back_topic is not None:
        outputs.append(lineage.kafka(bootstrap, spec.stream_back_topic, result.streamed_back if result else None))
    return inputs, outputs


def ingestion(spec: JobSpec, result: JobResult) -> lineage.IngestionRunFacet:
    """DataFibers' df_meta for one run: rows in and out, the files and Kafka offsets it read."""
    paths = [i.source.path for i in spec.inputs if isinstance(i.source, FilesSource)]
    if isinstance(spec.output, FilesSink):
        paths.append(spec.output.path)
    return lineage.IngestionRunFacet(
        kind="Transform",
        rowsIn=sum(result.rows_in.values()) if result.rows_in is not None else None,
        rowsOut=result.records_out,
        streamedBack=result.streamed_back,
        files=paths,
        offsets=result.offsets or [],
    )


if __name__ == "__main__":
    raise SystemExit(main())
