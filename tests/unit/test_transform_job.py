"""The Transform job on a real local Spark with tiny files; no Kafka or MongoDB server is involved."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from bson import ObjectId
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming import StreamingQuery

from fibers import spark as fibers_spark
from fibers.jobs import inputs, outputs, report
from fibers.jobs import transform as job
from fibers.jobs.report import JobResult
from fibers.jobs.spec import FilesSource, Input, JobSpec, KafkaSource, MongoSink, MongoSource, SpecError
from fibers.mongodb import BULK_LIMIT
from fibers.startfrom import StartFrom

ORDERS = [
    {"id": 1, "customer": "ada", "amount": 10.0},
    {"id": 2, "customer": "bob", "amount": 5.5},
    {"id": 3, "customer": "ada", "amount": 2.5},
]
ORDER_SCHEMA = "id INT, customer STRING, amount DOUBLE"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("FIBERS_SPARK_KAFKA_JARS", raising=False)  # plain Spark: these tests need no Kafka
        session = fibers_spark.session("test", master="local[1]", conf={"spark.sql.shuffle.partitions": "1"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def root_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """main() configures the root logger and PYSPARK_PYTHON; put both back afterwards."""
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def write_json_lines(directory: Path, rows: list[dict[str, Any]], name: str | None = None) -> None:
    """Write a file the way a producer should for Spark's file source: complete before it appears."""
    directory.mkdir(parents=True, exist_ok=True)
    name = name or f"part-{uuid.uuid4().hex[:8]}.json"
    hidden = directory / f".{name}.tmp"  # Spark skips names starting with a dot
    hidden.write_text("".join(json.dumps(row) + "\n" for row in rows))
    hidden.rename(directory / name)


def spec_dict(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "orders-report",
        "namespace": "shop",
        "run": "orders-report-1a2b3c4d",
        "mode": "batch",
        "inputs": [
            {"name": "orders", "files": {"path": str(tmp_path / "in"), "format": "json", "schema": ORDER_SCHEMA}}
        ],
        "sql": "SELECT customer, SUM(amount) AS total, COUNT(*) AS orders FROM orders GROUP BY customer",
        "output": {"files": {"path": str(tmp_path / "out"), "format": "json"}},
        "resultConfigMap": None,
    }
    spec.update(overrides)
    return spec


def rows(frame: DataFrame, order_by: str) -> list[dict[str, Any]]:
    return [row.asDict() for row in frame.orderBy(order_by).collect()]


# --- batch ---------------------------------------------------------------------------------------


def test_sql_aggregation_from_json_files_to_json_files(spark: SparkSession, tmp_path: Path) -> None:
    write_json_lines(tmp_path / "in", ORDERS)
    result = job.run(spark, JobSpec.from_dict(spec_dict(tmp_path)))

    assert result.records_out == 2
    assert result.streamed_back is None
    assert rows(spark.read.json(str(tmp_path / "out")), "customer") == [
        {"customer": "ada", "orders": 2, "total": 12.5},
        {"customer": "bob", "orders": 1, "total": 5.5},
    ]


def test_parquet_output_overwrites_by_default_and_appends_when_asked(spark: SparkSession, tmp_path: Path) -> None:
    write_json_lines(tmp_path / "in", ORDERS)
    out = {"path": str(tmp_path / "out"), "format": "parquet"}
    sql = "SELECT id, amount FROM orders WHERE amount > 3"

    for _ in range(2):
        job.run(spark, JobSpec.from_dict(spec_dict(tmp_path, sql=sql, output={"files": out})))
    assert rows(spark.read.parquet(out["path"]), "id") == [{"id": 1, "amount": 10.0}, {"id": 2, "amount": 5.5}]

    appended = {"files": {**out, "mode": "append"}}
    result = job.run(spark, JobSpec.from_dict(spec_dict(tmp_path, sql=sql, output=appended)))
    assert result.records_out == 2
    assert sorted(r["id"] for r in rows(spark.read.parquet(out["path"]), "id")) == [1, 1, 2, 2]


def test_csv_input_with_options_and_no_output_only_counts(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "ref.csv").write_text("id,name\n1,one\n2,two\n")
    ref = {"name": "ref", "files": {"path": str(tmp_path / "ref"), "format": "csv", "options": {"header": True}}}
    spec = spec_dict(tmp_path, inputs=[ref], sql="SELECT * FROM ref WHERE name = 'two'", output=None)

    assert job.run(spark, JobSpec.from_dict(spec)).records_out == 1


def spark_stage_names(spark: SparkSession, group: str) -> list[str]:
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
    stages = [tracker.getStageInfo(s) for job_info in jobs if job_info for s in job_info.stageIds]
    return [stage.name for stage in stages if stage]


def test_a_batch_run_counts_its_rows_as_it_writes_them(spark: SparkSession, tmp_path: Path) -> None:
    """No Spark job of its own to count the result (one more pass over it, ~1.5 s of a 20 s run)."""
    write_json_lines(tmp_path / "in", ORDERS)
    group = f"run-{uuid.uuid4().hex[:8]}"
    spark.sparkContext.setJobGroup(group, "one batch run")
    try:
        result = job.run(spark, JobSpec.from_dict(spec_dict(tmp_path)))
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    stages = spark_stage_names(spark, group)

    assert result.records_out == 2
    assert stages and not [name for name in stages if name.startswith("count at")], stages


def test_an_observed_count_that_never_arrives_is_counted_instead(spark: SparkSession) -> None:
    frame = spark.range(5)
    counted = outputs.ObservedCount(frame)
    counted.frame.foreachPartition(lambda rows: None)  # a plain RDD action: Spark delivers no observed metrics

    assert counted.rows(wait=0.2) == 5


def test_kafka_writes_go_through_v2_only_inside_the_block(spark: SparkSession) -> None:
    key = "spark.sql.sources.useV1SourceList"
    before = spark.conf.get(key)
    assert "kafka" in str(before).split(",")
    with outputs.kafka_writes_through_v2(spark):
        inside = str(spark.conf.get(key)).split(",")
    assert "kafka" not in inside and "parquet" in inside
    assert spark.conf.get(key) == before


def test_entrypoint_function_gets_the_views(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"fibers_test_entry_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from pyspark.sql import functions as F\n\n"
        "def big_orders(spark, views):\n"
        "    return views['orders'].where(F.col('amount') > 3).select('id', (F.col('amount') * 2).alias('double'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    write_json_lines(tmp_path / "in", ORDERS)
    spec = spec_dict(tmp_path, sql=None, entrypoint=f"{module}:big_orders")

    assert job.run(spark, JobSpec.from_dict(spec)).records_out == 2
    assert rows(spark.read.json(str(tmp_path / "out")), "id") == [{"id": 1, "double": 20.0}, {"id": 2, "double": 11.0}]


def test_entrypoint_must_return_a_dataframe(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"fibers_test_entry_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text("def nothing(spark, views):\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = JobSpec.from_dict(spec_dict(tmp_path, inputs=[], sql=None, entrypoint=f"{module}:nothing"))

    with pytest.raises(TypeError, match="returned int, not a DataFrame"):
        job.transform(spark, spec, {})


# --- Kafka and MongoDB encodings (no servers) ----------------------------------------------------


def kafka_frame(spark: SparkSession, values: list[str | None]) -> DataFrame:
    records = [
        (b"k%d" % i, None if v is None else v.encode(), "shop.public.orders", 0, i, datetime(2024, 1, 1))
        for i, v in enumerate(values)
    ]
    schema = "key BINARY, value BINARY, topic STRING, partition INT, offset LONG, timestamp TIMESTAMP"
    return spark.createDataFrame(records, schema)


def test_kafka_values_parsed_with_the_schema_and_tombstones_dropped(spark: SparkSession) -> None:
    raw = kafka_frame(spark, ['{"after": {"id": 7, "amount": 1.5}, "op": "c"}', None])
    decoded = inputs.decode_kafka(raw, "after STRUCT<id INT, amount DOUBLE>, op STRING")

    assert decoded.columns == ["after", "op"]
    assert [(r.after.id, r.after.amount, r.op) for r in decoded.collect()] == [(7, 1.5, "c")]


def test_kafka_records_without_schema_are_strings(spark: SparkSession) -> None:
    decoded = inputs.decode_kafka(kafka_frame(spark, ["hello"]), None)

    assert decoded.columns == ["key", "value", "topic", "partition", "offset", "timestamp"]
    assert (decoded.first() or Row()).asDict()["value"] == "hello"


def test_kafka_output_is_the_row_as_json_keyed_by_the_key_column(spark: SparkSession) -> None:
    frame = spark.createDataFrame([(1, "ada", 2.5)], "id INT, `cust.name` STRING, amount DOUBLE")

    keyed = outputs.kafka_records(frame, "id").collect()
    assert [(r.key, json.loads(r.value)) for r in keyed] == [("1", {"id": 1, "cust.name": "ada", "amount": 2.5})]
    assert outputs.kafka_records(frame, None).columns == ["value"]


def test_mongodb_documents_become_a_dataframe(spark: SparkSession) -> None:
    oid = ObjectId()
    docs = [{"_id": oid, "name": "ada", "address": {"city": "Paris"}, "since": datetime(2024, 5, 1, 12, 0)}]
    frame = inputs.documents_frame(spark, docs, None)

    row = frame.first()
    assert row is not None
    assert (row["_id"], row["name"], row["address"]["city"], row["since"]) == (
        str(oid),
        "ada",
        "Paris",
        "2024-05-01T12:00:00",
    )
    assert inputs.documents_frame(spark, [], "id INT, name STRING").columns == ["id", "name"]


def test_mongodb_input_reads_the_uri_from_the_named_variable(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    class FakeClient:
        def __init__(self, uri: str, **kwargs: Any) -> None:
            seen["uri"] = uri

        def __getitem__(self, database: str) -> dict[str, Any]:
            return {"people": type("Coll", (), {"find": lambda self: [{"_id": ObjectId(), "name": "ada"}]})()}

        def close(self) -> None:
            seen["closed"] = True

    monkeypatch.setattr("pymongo.MongoClient", FakeClient)
    monkeypatch.setenv("FIBERS_INPUT_PEOPLE_URI", "mongodb://user:secret@db:27017/")
    source = MongoSource("FIBERS_INPUT_PEOPLE_URI", "db", "people")

    assert [r.name for r in inputs.read_mongodb(spark, source).collect()] == ["ada"]
    assert seen == {"uri": "mongodb://user:secret@db:27017/", "closed": True}

    monkeypatch.delenv("FIBERS_INPUT_PEOPLE_URI")
    with pytest.raises(RuntimeError, match="FIBERS_INPUT_PEOPLE_URI is not set"):
        inputs.read_mongodb(spark, source)


class FakeCollection:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def insert_many(self, documents: list[dict[str, Any]], ordered: bool) -> None:
        self.calls.append(("insert_many", documents))

    def bulk_write(self, requests: list[Any]) -> None:
        self.calls.append(("bulk_write", requests))


def test_mongodb_output_upserts_by_id_column_or_inserts() -> None:
    from pymongo import ReplaceOne

    upserts = FakeCollection()
    assert outputs.store_documents(upserts, [{"id": 1, "n": "a"}, {"id": 2, "n": "b"}], "id") == 2  # type: ignore[arg-type]
    [(call, requests)] = upserts.calls
    assert call == "bulk_write"
    assert requests == [
        ReplaceOne({"_id": 1}, {"id": 1, "n": "a", "_id": 1}, upsert=True),
        ReplaceOne({"_id": 2}, {"id": 2, "n": "b", "_id": 2}, upsert=True),
    ]

    inserts = FakeCollection()
    outputs.store_documents(inserts, ({"n": i} for i in range(BULK_LIMIT + 1)), None)  # type: ignore[arg-type]
    assert [(call, len(docs)) for call, docs in inserts.calls] == [
        ("insert_many", BULK_LIMIT),
        ("insert_many", 1),
    ]

    with pytest.raises(ValueError, match="no value in idColumn"):
        outputs.store_documents(FakeCollection(), [{"id": None}], "id")  # type: ignore[arg-type]


def test_rows_are_made_bson_ready() -> None:
    converted = outputs.bson_ready({"price": Decimal("1.50"), "day": date(2024, 1, 2), "tags": ({1: "x"},)})
    assert converted == {"price": 1.5, "day": datetime(2024, 1, 2), "tags": [{"1": "x"}]}


def test_a_python_worker_failure_is_reported_by_its_cause() -> None:
    relayed = (
        "org.apache.spark.SparkException: Job aborted due to stage failure: Lost task 0.0:"
        " org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "worker.py", line 9, in write\n'
        "    raise ValueError(value)\n"
        "pymongo.errors.ServerSelectionTimeoutError: db:27017: timed out\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1)\n"
    )
    assert report.python_worker_error(relayed) == "pymongo.errors.ServerSelectionTimeoutError: db:27017: timed out"
    assert report.python_worker_error("org.apache.spark.SparkException: no traceback here") is None


# --- the spec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sql": None}, "exactly one of spec.sql and spec.entrypoint"),
        ({"entrypoint": "pkg.mod:fn"}, "exactly one of spec.sql and spec.entrypoint"),
        ({"sql": None, "entrypoint": "pkg.mod"}, "package.module:function"),
        ({"mode": "streaming"}, "spec.checkpoint.location is required in streaming mode"),
        ({"mode": "sometimes"}, "spec.mode must be one of batch, streaming"),
        ({"output": {"kafka": {"topic": "t"}}}, "spec.kafka.bootstrapServers is required"),
        ({"output": {"files": {"path": "/o", "format": "json"}, "kafka": {"topic": "t"}}}, "exactly one of"),
        ({"inputs": [{"name": "bad-name", "files": {"path": "/x", "format": "json"}}]}, "must be a SQL identifier"),
        ({"inputs": [{"name": "k", "kafka": {"topics": []}}]}, "topics must be a non-empty list"),
        ({"trigger": {"processingTimeSeconds": 0}}, "must be a positive number"),
        ({"resultConfigMap": "cm", "namespace": None}, "spec.namespace is required"),
    ],
)
def test_invalid_specs_are_refused_with_the_field_named(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        JobSpec.from_dict(spec_dict(tmp_path, **change))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"inputs": [{"name": "p", "mongodb": {"uriEnv": "U", "database": "d", "collection": "c"}}]}, "batch-only"),
        ({"inputs": [{"name": "f", "files": {"path": "/in", "format": "json"}}]}, "files.schema is required"),
        ({"output": {"mongodb": {"uriEnv": "U", "database": "d", "collection": "c"}}}, "batch-only"),
        ({"output": {"files": {"path": "/o", "format": "json", "mode": "overwrite"}}}, "must be append"),
        ({"streamBack": {"topic": "t"}, "kafka": {"bootstrapServers": "k:9092"}}, "streamBack is batch-only"),
        ({"output": None}, "spec.output is required"),
    ],
)
def test_streaming_rules(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    spec = spec_dict(tmp_path, mode="streaming", checkpoint={"location": str(tmp_path / "ckpt")}, **change)
    with pytest.raises(SpecError, match=message):
        JobSpec.from_dict(spec)


def test_full_spec_parses(tmp_path: Path) -> None:
    spec = JobSpec.from_json(
        json.dumps(
            spec_dict(
                tmp_path,
                kafka={"bootstrapServers": "127.0.0.1:9092"},
                inputs=[
                    {"name": "orders", "kafka": {"topics": ["a", "b"], "schema": "id INT"}},
                    {
                        "name": "people",
                        "mongodb": {"uriEnv": "FIBERS_INPUT_PEOPLE_URI", "database": "d", "collection": "p"},
                    },
                ],
                output={
                    "mongodb": {"uriEnv": "FIBERS_OUTPUT_URI", "database": "d", "collection": "c", "idColumn": "id"}
                },
                streamBack={"topic": "report-results"},
                sparkConf={"spark.sql.shuffle.partitions": 2},
            )
        )
    )
    assert spec.inputs[0].source == KafkaSource(("a", "b"), "id INT", "earliest")
    assert spec.output == MongoSink("FIBERS_OUTPUT_URI", "d", "c", "id")
    assert (spec.stream_back_topic, spec.spark_conf, spec.master) == (
        "report-results",
        {"spark.sql.shuffle.partitions": "2"},
        None,  # spark-submit's master (k8s://… in a driver pod); never forced
    )
    assert JobSpec.from_dict(spec_dict(tmp_path, master="local[1]")).master == "local[1]"
    assert spec.uri_envs() == ["FIBERS_INPUT_PEOPLE_URI", "FIBERS_OUTPUT_URI"]


# --- main ----------------------------------------------------------------------------------------


def run_main(spec: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = job.main(["--spec", json.dumps(spec)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.usefixtures("root_logging")
@pytest.mark.parametrize(
    ("change", "message"),
    [({"sql": None}, "exactly one of spec.sql and spec.entrypoint"), ({"mode": "streaming"}, "checkpoint.location")],
)
def test_main_exits_2_on_an_invalid_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any], message: str
) -> None:
    code, out, err = run_main(spec_dict(tmp_path, **change), capsys)
    assert code == 2
    assert "fibers-transform: error: invalid spec:" in err and message in err
    assert out == ""
    assert job.main(["--spec", "{not json"]) == 2


@pytest.fixture
def shared_spark(spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """main() stops its session when done; keep the module's session alive and record the call."""
    stopped: list[bool] = []
    monkeypatch.setattr(spark, "stop", lambda: stopped.append(True))
    return stopped


@pytest.mark.usefixtures("root_logging")
@pytest.mark.parametrize(
    ("sql", "error_class"),
    [
        ("SELECT * FROM missing_table", "TABLE_OR_VIEW_NOT_FOUND"),
        ("SELECT nope FROM orders", "UNRESOLVED_COLUMN"),
        ("SELECT raise_error(CONCAT('bad order ', id)) FROM orders", "bad order 1"),
    ],
)
def test_main_exits_1_with_sparks_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shared_spark: list[bool], sql: str, error_class: str
) -> None:
    write_json_lines(tmp_path / "in", ORDERS)
    code, out, err = run_main(spec_dict(tmp_path, sql=sql), capsys)

    assert code == 1
    [line] = [line for line in err.splitlines() if line.startswith("fibers-transform: error:")]
    assert error_class in line
    assert "FIBERS_RESULT" not in out
    assert shared_spark == [True]


@pytest.mark.usefixtures("root_logging")
def test_main_prints_the_result_and_survives_an_unreachable_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shared_spark: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    report.kube_api.cache_clear()  # a client another test of this process made would reach its cluster
    write_json_lines(tmp_path / "in", ORDERS)
    code, out, err = run_main(spec_dict(tmp_path, resultConfigMap="orders-report-1a2b3c4d-result"), capsys)

    assert code == 0
    last = out.strip().splitlines()[-1]
    assert last.startswith("FIBERS_RESULT ")
    result = json.loads(last.removeprefix("FIBERS_RESULT "))
    assert (result["recordsOut"], result["streamedBack"]) == (2, None)
    assert "could not write the result ConfigMap" in err


def error_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """What the job hands to write_error_config_map, recorded instead of written."""
    written: list[tuple[str, ...]] = []

    def record(*args: str) -> bool:
        written.append(args)
        return True

    monkeypatch.setattr(job, "write_error_config_map", record)
    return written


@pytest.mark.usefixtures("root_logging")
def test_a_failed_run_writes_sparks_error_to_the_result_config_map(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shared_spark: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Spark Operator only sees the exit code; the operator reads Spark's words from this ConfigMap."""
    written = error_writes(monkeypatch)
    write_json_lines(tmp_path / "in", ORDERS)
    spec = spec_dict(tmp_path, sql="SELECT * FROM missing_table", resultConfigMap="orders-report-1a2b3c4d-result")
    code, _, err = run_main(spec, capsys)

    assert code == 1
    [(namespace, name, transform, message)] = written
    assert (namespace, name, transform) == ("shop", "orders-report-1a2b3c4d-result", "orders-report")
    assert "TABLE_OR_VIEW_NOT_FOUND" in message and message in err


@pytest.mark.usefixtures("root_logging")
def test_an_invalid_spec_writes_its_error_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    written = error_writes(monkeypatch)
    code, _, _ = run_main(spec_dict(tmp_path, sql=None, resultConfigMap="r-result"), capsys)
    assert code == 2
    [(namespace, name, transform, message)] = written
    assert (namespace, name, transform) == ("shop", "r-result", "orders-report")
    assert message.startswith("invalid spec:") and "exactly one of spec.sql" in message


def test_the_error_config_map_holds_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    bodies: list[Any] = []

    class FakeApi:
        def create(self, url: str, body: Any, **kwargs: Any) -> None:
            bodies.append(body)

    monkeypatch.setattr(report, "kube_api", FakeApi)
    assert report.write_error_config_map("shop", "cm", "orders-report", "[X] " + "y" * 20_000)
    [body] = bodies
    assert set(body["data"]) == {"error"} and body["data"]["error"].startswith("[X] ")
    assert len(body["data"]["error"]) == report.ERROR_LIMIT
    assert body["metadata"]["labels"]["fibers.dev/transform"] == "orders-report"


class FakeBuilder:
    """Records what fibers.spark.session asks of SparkSession.builder."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def appName(self, name: str) -> FakeBuilder:
        self.calls.append(("appName", name))
        return self

    def master(self, master: str) -> FakeBuilder:
        self.calls.append(("master", master))
        return self

    def config(self, key: str, value: str) -> FakeBuilder:
        self.calls.append((key, value))
        return self

    def getOrCreate(self) -> str:
        return "session"


@pytest.fixture
def fake_builder(monkeypatch: pytest.MonkeyPatch) -> FakeBuilder:
    from pyspark.sql import SparkSession

    builder = FakeBuilder()
    monkeypatch.setattr(SparkSession, "builder", builder)
    return builder


def test_session_never_forces_a_master(fake_builder: FakeBuilder, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a driver pod spark-submit has set spark.master=k8s://…; only an explicit master is passed on."""
    monkeypatch.delenv("FIBERS_SPARK_KAFKA_JARS", raising=False)
    fibers_spark.session("app")
    assert "master" not in dict(fake_builder.calls)
    fibers_spark.session("app", master="local[1]")
    assert ("master", "local[1]") in fake_builder.calls


def test_under_spark_submit_the_kafka_jars_come_from_the_class_path(
    fake_builder: FakeBuilder, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """spark.jars set in a running driver would never reach its class loader (the SparkApplication sets it)."""
    monkeypatch.setenv("FIBERS_SPARK_KAFKA_JARS", str(tmp_path / "no-such-dir"))
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "12345")
    fibers_spark.session("app")
    assert "spark.jars" not in dict(fake_builder.calls)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT")
    with pytest.raises(RuntimeError, match="no spark-sql-kafka jar"):
        fibers_spark.session("app")  # run bare: the jars are added, so a wrong directory is an error


def test_result_config_map_is_created_or_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    from fibers.jobs.spec import result_labels
    from fibers.kubeapi import ApiError

    calls: list[tuple[str, Any]] = []

    class FakeApi:
        def create(self, url: str, body: Any, **kwargs: Any) -> None:
            calls.append(("create", body["data"]))
            raise ApiError(409, "AlreadyExists")

        def get(self, url: str) -> Any:  # an earlier run's: the labels a run writes
            return {"metadata": {"labels": result_labels("orders-report"), "resourceVersion": "1"}}

        def replace(self, url: str, body: Any, **kwargs: Any) -> None:
            calls.append(("replace", url))

    monkeypatch.setattr(report, "kube_api", FakeApi)
    assert report.write_result_config_map("shop", "cm", "orders-report", JobResult(3, 3, 1.23456))
    assert calls == [
        ("create", {"recordsOut": "3", "streamedBack": "3", "seconds": "1.235"}),
        ("replace", "/api/v1/namespaces/shop/configmaps/cm"),
    ]
    calls.clear()
    report.write_result_config_map("shop", "cm", "orders-report", JobResult(3, None, 2.0))
    assert calls[0] == ("create", {"recordsOut": "3", "streamedBack": "", "seconds": "2.0"})


def test_sigterm_and_sigint_only_ask_the_streaming_loop_to_stop() -> None:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for sig in saved:
            stop = threading.Event()
            job._stop_on_signals(stop)
            signal.raise_signal(sig)
            assert stop.is_set()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


# --- streaming -----------------------------------------------------------------------------------


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


def output_ids(spark: SparkSession, path: Path) -> list[int]:
    if not (path / "_spark_metadata").exists():
        return []
    return sorted(row.id for row in spark.read.schema("id INT, amount DOUBLE").json(str(path)).collect())


def streaming_spec(tmp_path: Path, sql: str, trigger_seconds: float) -> JobSpec:
    """Files in, files out, checkpointed under tmp_path."""
    checkpoint = {"location": str(tmp_path / "ckpt")}
    trigger = {"processingTimeSeconds": trigger_seconds}
    return JobSpec.from_dict(spec_dict(tmp_path, mode="streaming", sql=sql, checkpoint=checkpoint, trigger=trigger))


def start_streaming(spark: SparkSession, spec: JobSpec) -> tuple[threading.Event, threading.Thread, list[JobResult]]:
    """The driver's streaming loop in a thread: set the event to stop it; its result lands in the list."""
    stop, results = threading.Event(), []
    thread = threading.Thread(target=lambda: results.append(job.run_streaming(spark, spec, stop)), daemon=True)
    thread.start()
    return stop, thread, results


def test_streaming_files_to_files_exactly_once_across_a_restart(spark: SparkSession, tmp_path: Path) -> None:
    spec = streaming_spec(tmp_path, "SELECT id, amount * 2 AS amount FROM orders", 0.3)
    out = tmp_path / "out"

    write_json_lines(tmp_path / "in", [{"id": 1, "amount": 1.0}, {"id": 2, "amount": 2.0}])
    stop, thread, results = start_streaming(spark, spec)
    wait_for(lambda: output_ids(spark, out) == [1, 2])
    write_json_lines(tmp_path / "in", [{"id": 3, "amount": 3.0}])
    wait_for(lambda: output_ids(spark, out) == [1, 2, 3])
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    assert results[0].records_out == 3

    write_json_lines(tmp_path / "in", [{"id": 4, "amount": 4.0}])  # arrives while the job is down
    stop, thread, results = start_streaming(spark, spec)
    wait_for(lambda: output_ids(spark, out) == [1, 2, 3, 4])
    write_json_lines(tmp_path / "in", [{"id": 5, "amount": 5.0}])
    wait_for(lambda: output_ids(spark, out) == [1, 2, 3, 4, 5])
    stop.set()
    thread.join(30)

    assert output_ids(spark, out) == [1, 2, 3, 4, 5]  # nothing processed twice
    assert results[0].records_out == 2
    assert spark.read.json(str(out)).where("id = 5").first() == Row(amount=10.0, id=5)


def test_a_streaming_driver_takes_each_progress_report_once_instead_of_rereading_them(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`recentProgress` rebuilds every report Spark keeps (up to 100) through dozens of py4j calls each.
    Read every second, it kept the demo's idle streaming driver at ~70 % of a core; the reports now come
    once each from a listener, and the history is read only once, after the query stops."""
    reads: list[float] = []
    recent = StreamingQuery.recentProgress
    monkeypatch.setattr(
        StreamingQuery, "recentProgress", property(lambda q: reads.append(time.monotonic()) or recent.fget(q))
    )
    spec = streaming_spec(tmp_path, "SELECT id, amount FROM orders", 0.2)
    write_json_lines(tmp_path / "in", [{"id": 1, "amount": 1.0}, {"id": 2, "amount": 2.0}])
    stop, thread, results = start_streaming(spark, spec)
    wait_for(lambda: output_ids(spark, tmp_path / "out") == [1, 2])
    write_json_lines(tmp_path / "in", [{"id": 3, "amount": 3.0}])
    wait_for(lambda: output_ids(spark, tmp_path / "out") == [1, 2, 3])
    time.sleep(3)  # idle: the old driver read the whole history three times here
    stop.set()
    thread.join(30)

    assert results[0].records_out == 3  # every batch counted, once
    assert len(reads) <= 1, f"recentProgress read {len(reads)} times"


def test_a_failing_streaming_query_raises_with_sparks_message(spark: SparkSession, tmp_path: Path) -> None:
    spec = streaming_spec(tmp_path, "SELECT id, raise_error('poisoned record') AS amount FROM orders", 0.2)
    write_json_lines(tmp_path / "in", ORDERS)

    with pytest.raises(StreamingQueryException) as failure:
        job.run_streaming(spark, spec, threading.Event())
    assert "poisoned record" in report.error_message(failure.value)
    assert not spark.streams.active


def test_each_input_and_output_kind_names_its_lineage_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPORT_URI", "mongodb://user:secret@mongo-0.db:27017,mongo-1.db:27017/?tls=true")
    spec = JobSpec(
        name="t",
        namespace="ns",
        run="r1",
        mode="batch",
        inputs=(
            Input("one", KafkaSource(topics=("orders",))),
            Input("two", KafkaSource(topics=("a", "b"))),
            Input("files", FilesSource(path="/data/in", format="json")),
            Input("docs", MongoSource(uri_env="REPORT_URI", database="shop", collection="customers")),
        ),
        sql="select 1",
        output=MongoSink(uri_env="REPORT_URI", database="shop", collection="report"),
        bootstrap_servers="kafka:9092",
        stream_back_topic="back",
    )
    result = JobResult(7, 7, 1.0, {"one": 10, "two": 20, "files": 30, "docs": 40}, [])
    inputs, outputs = report.lineage_datasets(spec, result)
    assert [(d.namespace, d.name, d.rows) for d in inputs] == [
        ("kafka://kafka:9092", "orders", 10),
        ("kafka://kafka:9092", "a", None),  # two topics, one count: not split between them
        ("kafka://kafka:9092", "b", None),
        ("file", "/data/in", 30),
        ("mongodb://mongo-0.db:27017", "shop.customers", 40),
    ]
    assert [(d.namespace, d.name, d.rows) for d in outputs] == [
        ("mongodb://mongo-0.db:27017", "shop.report", 7),
        ("kafka://kafka:9092", "back", 7),
    ]
    assert "secret" not in repr(inputs + outputs)


def test_a_batch_kafka_read_is_the_partitions_and_ends_found_once_whatever_arrives_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read of a batch run (the SQL's, a recomputation, the lineage statistics) gets these options:
    exactly the partitions found, up to the end each had then (not `latest`, resolved again at each read).
    Where they start: a time's offsets as found; `earliest` as Spark's mark, resolved at each read (an
    offset found once may be deleted by retention before the last read); anything else as written."""
    from fibers import kafka_positions
    from fibers.jobs.inputs import pin_kafka_reads
    from fibers.kafka_positions import Position

    asked: list[StartFrom] = []

    def lookup(bootstrap: str, topics: Any, start: StartFrom) -> list[Position]:
        asked.append(start)
        return [Position("a", 0, 5, 9), Position("a", 1, 0, 0), Position("b", 0, 2, 3)]

    monkeypatch.setattr(kafka_positions, "lookup", lookup)

    def reads(kafka: dict[str, Any]) -> dict[str, str]:
        inputs = [{"name": "orders", "kafka": {"topics": ["a", "b"], **kafka}}]
        spec = JobSpec.from_dict(spec_dict(tmp_path, kafka={"bootstrapServers": "k:9092"}, inputs=inputs))
        return pin_kafka_reads(spec)["orders"]

    at = reads({"startFrom": {"timestamp": "2026-11-27T09:00:00Z"}})
    assert asked[-1] == StartFrom("earliest", 1795770000000)
    assert json.loads(at["assign"]) == {"a": [0, 1], "b": [0]}
    assert json.loads(at["startingOffsets"]) == {"a": {"0": 5, "1": 0}, "b": {"0": 2}}
    assert json.loads(at["endingOffsets"]) == {"a": {"0": 9, "1": 0}, "b": {"0": 3}}
    earliest = reads({})
    assert json.loads(earliest["startingOffsets"]) == {"a": {"0": -2, "1": -2}, "b": {"0": -2}}
    assert earliest["endingOffsets"] == at["endingOffsets"]
    own = '{"a": {"0": 7, "1": -2}, "b": {"0": -2}}'  # Spark's own JSON, passed on as written
    assert reads({"startingOffsets": own})["startingOffsets"] == own
    assert reads({"startingOffsets": "latest"})["startingOffsets"] == "latest"  # Spark refuses it in a batch read


def test_a_kafka_input_starts_from_a_time_or_a_position(tmp_path: Path) -> None:
    """startFrom reaches the job as Kafka's own words: a timestamp as startingTimestamp (a partition with no
    record at or after it yet starting at its end), a position as startingOffsets."""
    from fibers.jobs.inputs import _kafka_options

    def source(start: dict[str, str]) -> KafkaSource:
        inputs = [{"name": "orders", "kafka": {"topics": ["a"], "startFrom": start}}]
        spec = JobSpec.from_dict(spec_dict(tmp_path, kafka={"bootstrapServers": "k:9092"}, inputs=inputs))
        assert isinstance(spec.inputs[0].source, KafkaSource)
        return spec.inputs[0].source

    at = source({"timestamp": "2026-11-27T09:00:00Z"})
    options = _kafka_options(JobSpec.from_dict(spec_dict(tmp_path, kafka={"bootstrapServers": "k:9092"})), at)
    assert options["startingTimestamp"] == "1795770000000" and "startingOffsets" not in options
    assert options["startingOffsetsByTimestampStrategy"] == "latest"
    assert source({"position": "latest"}).starting_offsets == "latest"
    with pytest.raises(SpecError, match=r"spec\.inputs\[0\]\.startFrom\.position must be one of earliest, latest"):
        source({"position": "bootstrap"})
