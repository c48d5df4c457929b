"""The job spec a Transform's driver runs from, parsed and checked without Spark.

The operator renders it (fibers.transform.spec.render_job) and checks it here before it submits a
run, so a spec that cannot run is answered on the resource (InvalidSpec) instead of by a driver that
exits; the driver parses the same text with the same code. Nothing here imports pyspark.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fibers import lineage
from fibers.startfrom import StartFrom, StartFromError

MODES = ("batch", "streaming")
SAVE_MODES = ("overwrite", "append", "ignore", "error", "errorifexists")
DEFAULT_TRIGGER_SECONDS = 2.0
_VIEW_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
METRICS_PORT_ENV = "FIBERS_METRICS_PORT"  # the driver's metrics port, as the operator names it (`progress`)
LABEL_TRANSFORM = "fibers.dev/transform"  # on a run's SparkApplication and the result ConfigMap its driver writes


def result_config_map(run: str) -> str:
    """The name of the ConfigMap a run's driver writes its result (or its error) to: spec.resultConfigMap."""
    return f"{run}-result"


def result_labels(transform: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "fibers", LABEL_TRANSFORM: transform}


def written_for(configmap: Mapping[str, Any], transform: str) -> bool:
    """Whether a ConfigMap of a result's name is one a run of `transform` wrote: only such a one is read as a
    result, replaced by a later write, or deleted with its run; any other of that name is left alone."""
    labels = (configmap.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in result_labels(transform).items())


@dataclass(frozen=True)
class AvroRef:
    """Where a Kafka input's or output's schemas live; the reader (or writer) schema when a Schema was named."""

    registry_url: str
    subject: str
    schema: str | None = None


class SpecError(ValueError):
    """The rendered spec cannot be run; the message names the field to fix (exit code 2)."""


# The source and sink classes below repeat fields (uri_env, database, collection, schema) on purpose:
# each is what one kind of input or output needs, read where it is used, with no base class to follow.
# Each also names itself as OpenLineage datasets (`datasets`): a new kind of input is this module (what
# it is) and fibers.jobs.inputs (how it is read).


@dataclass(frozen=True)
class KafkaSource:
    topics: tuple[str, ...]
    schema: str | None = None
    starting_offsets: str = "earliest"  # earliest | latest, unless start_timestamp_ms is set
    start_timestamp_ms: int | None = None  # startFrom.timestamp: the first record at or after it (fibers.startfrom)
    avro: AvroRef | None = None  # values in the registry's wire format (schema is then None)
    producer: lineage.Producer | None = None  # the Connect or Transform a reference named (connectRef, transformRef)

    def datasets(self, bootstrap: str, rows: int | None) -> list[lineage.DatasetRef]:
        """One dataset per topic; the row count only when there is one topic (it is counted per input)."""
        single = len(self.topics) == 1
        return [lineage.kafka(bootstrap, t, rows if single else None, self.producer) for t in self.topics]


@dataclass(frozen=True)
class FilesSource:
    path: str
    format: str
    options: dict[str, str] = field(default_factory=dict)
    schema: str | None = None

    def datasets(self, bootstrap: str, rows: int | None) -> list[lineage.DatasetRef]:
        return [lineage.files(self.path, rows)]


@dataclass(frozen=True)
class MongoSource:
    uri_env: str
    database: str
    collection: str
    schema: str | None = None

    def datasets(self, bootstrap: str, rows: int | None) -> list[lineage.DatasetRef]:
        """Named by the URI's hosts, never its credentials (see fibers.lineage.mongodb)."""
        return [lineage.mongodb(os.environ.get(self.uri_env, ""), self.database, self.collection, rows)]


Source = KafkaSource | FilesSource | MongoSource


@dataclass(frozen=True)
class Input:
    name: str
    source: Source


@dataclass(frozen=True)
class KafkaSink:
    topic: str
    key_column: str | None = None
    avro: AvroRef | None = None

    def datasets(self, bootstrap: str, rows: int | None) -> list[lineage.DatasetRef]:
        return [lineage.kafka(bootstrap, self.topic, rows)]


@dataclass(frozen=True)
class FilesSink:
    path: str
    format: str
    mode: str | None = None
    options: dict[str, str] = field(default_factory=dict)

    def datasets(self, bootstrap: str, rows: int | None) -> list[lineage.DatasetRef]:
        return [lineage.files(self.path, rows)]


@dataclass(frozen=True)
class MongoSink:
    uri_env: str
    database: str
    collection: str
    id_column: str | None = None

    def datasets(self, bootstrap: str, rows: int | None) -> list[lineage.DatasetRef]:
        return [lineage.mongodb(os.environ.get(self.uri_env, ""), self.database, self.collection, rows)]


Sink = KafkaSink | FilesSink | MongoSink


@dataclass(frozen=True)
class JobSpec:
    name: str
    namespace: str | None
    run: str
    mode: str
    inputs: tuple[Input, ...]
    sql: str | None = None
    entrypoint: str | None = None
    output: Sink | None = None
    bootstrap_servers: str | None = None
    stream_back_topic: str | None = None
    checkpoint_location: str | None = None
    trigger_seconds: float = DEFAULT_TRIGGER_SECONDS
    output_mode: str = "append"  # streaming: append, update (aggregations), or complete
    spark_conf: dict[str, str] = field(default_factory=dict)
    master: str | None = None  # None: spark-submit's (k8s://… in a driver pod), or local[*] when run bare
    result_config_map: str | None = None
    lineage: lineage.Settings | None = None  # where OpenLineage events go (None: nowhere)

    @property
    def streaming(self) -> bool:
        return self.mode == "streaming"

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"the spec is not valid JSON: {exc}") from None
        return cls.from_dict(_obj(raw, "spec"))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> JobSpec:
        """Parse and check everything that can be checked without Spark, so mistakes exit 2 up front."""
        name = _req_str(raw, "name", "spec")
        mode = _opt_str(raw, "mode", "spec") or "batch"
        if mode not in MODES:
            raise SpecError(f"spec.mode must be one of {', '.join(MODES)}, not {mode!r}")
        raw_inputs = raw.get("inputs") or []
        if not isinstance(raw_inputs, list):
            raise SpecError("spec.inputs must be a list")
        stream_back = raw.get("streamBack")
        spec = cls(
            name=name,
            namespace=_opt_str(raw, "namespace", "spec"),
            run=_opt_str(raw, "run", "spec") or name,
            mode=mode,
            inputs=tuple(_parse_input(item, f"spec.inputs[{i}]") for i, item in enumerate(raw_inputs)),
            sql=_opt_str(raw, "sql", "spec"),
            entrypoint=_opt_str(raw, "entrypoint", "spec"),
            output=_parse_output(raw.get("output")),
            bootstrap_servers=_opt_str(_obj(raw.get("kafka") or {}, "spec.kafka"), "bootstrapServers", "spec.kafka"),
            stream_back_topic=None if stream_back is None else _req_str(stream_back, "topic", "spec.streamBack"),
            checkpoint_location=_opt_str(
                _obj(raw.get("checkpoint") or {}, "spec.checkpoint"), "location", "spec.checkpoint"
            ),
            trigger_seconds=_trigger_seconds(raw.get("trigger")),
            output_mode=_output_mode(raw.get("outputMode")),
            spark_conf=_str_map(raw.get("sparkConf"), "spec.sparkConf"),
            master=_opt_str(raw, "master", "spec"),
            result_config_map=_opt_str(raw, "resultConfigMap", "spec"),
            lineage=_parse_lineage(raw.get("lineage")),
        )
        spec.check()
        return spec

    def check(self) -> None:
        """Rules that involve more than one field."""
        if (self.sql is None) == (self.entrypoint is None):
            raise SpecError("set exactly one of spec.sql and spec.entrypoint")
        if self.entrypoint is not None:
            split_entrypoint(self.entrypoint)
        seen: set[str] = set()
        for item in self.inputs:
            if item.name.lower() in seen:  # Spark's view names are case-insensitive
                raise SpecError(f"two inputs are named {item.name!r}")
            seen.add(item.name.lower())
        if self.uses_kafka and not self.bootstrap_servers:
            raise SpecError(
                "spec.kafka.bootstrapServers is required when an input, the output or streamBack uses Kafka"
            )
        if self.result_config_map and not self.namespace:
            raise SpecError("spec.namespace is required when spec.resultConfigMap is set")
        if self.streaming:
            self._check_streaming()

    def _check_streaming(self) -> None:
        if not self.checkpoint_location:
            raise SpecError(
                "spec.checkpoint.location is required in streaming mode (the query's progress is kept there)"
            )
        if self.output is None:
            raise SpecError("spec.output is required in streaming mode (a streaming query needs a sink)")
        if isinstance(self.output, MongoSink):
            raise SpecError("spec.output.mongodb is batch-only; use mode batch or a kafka/files output")
        if isinstance(self.output, FilesSink) and self.output.mode not in (None, "append"):
            raise SpecError("spec.output.files.mode must be append in streaming mode (file sinks only append)")
        if self.stream_back_topic is not None:
            raise SpecError("spec.streamBack is batch-only; in streaming mode write the output to Kafka instead")
        for i, item in enumerate(self.inputs):
            where = f"spec.inputs[{i}] ({item.name})"
            if isinstance(item.source, MongoSource):
                raise SpecError(f"{where}: mongodb inputs are batch-only (FerretDB has no change streams)")
            if isinstance(item.source, FilesSource) and item.source.schema is None and item.source.format != "text":
                raise SpecError(f"{where}: files.schema is required in streaming mode (Spark does not infer it)")

    @property
    def uses_kafka(self) -> bool:
        return (
            any(isinstance(item.source, KafkaSource) for item in self.inputs)
            or isinstance(self.output, KafkaSink)
            or self.stream_back_topic is not None
        )

    def uri_envs(self) -> list[str]:
        """Names of the environment variables holding MongoDB URIs (their values are never logged)."""
        names = [item.source.uri_env for item in self.inputs if isinstance(item.source, MongoSource)]
        if isinstance(self.output, MongoSink):
            names.append(self.output.uri_env)
        return names


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{where} must be an object")
    return value


def _opt_str(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"{where}.{key} must be a non-empty string")
    return value


def _req_str(raw: Any, key: str, where: str) -> str:
    value = _opt_str(_obj(raw, where), key, where)
    if value is None:
        raise SpecError(f"{where}.{key} is required")
    return value


def _str_map(value: Any, where: str) -> dict[str, str]:
    """Spark options and conf are strings; accept JSON scalars the way a YAML author would write them."""
    result: dict[str, str] = {}
    for key, item in _obj(value or {}, where).items():
        if isinstance(item, bool):
            result[key] = "true" if item else "false"
        elif isinstance(item, str | int | float):
            result[key] = str(item)
        else:
            raise SpecError(f"{where}.{key} must be a string, number or boolean")
    return result


def _one_of(raw: Mapping[str, Any], kinds: tuple[str, ...], where: str) -> str:
    present = [kind for kind in kinds if raw.get(kind) is not None]
    if len(present) != 1:
        raise SpecError(f"{where} must have exactly one of {', '.join(kinds)}")
    return present[0]


def _output_mode(raw: Any) -> str:
    mode = raw or "append"
    if mode not in ("append", "update", "complete"):
        raise SpecError(f"spec.outputMode must be append, update or complete, not {mode!r}")
    return str(mode)


def _trigger_seconds(raw: Any) -> float:
    value = _obj(raw or {}, "spec.trigger").get("processingTimeSeconds", DEFAULT_TRIGGER_SECONDS)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise SpecError("spec.trigger.processingTimeSeconds must be a positive number")
    return float(value)


def _parse_input(raw: Any, where: str) -> Input:
    name = _req_str(raw, "name", where)
    if not _VIEW_NAME.match(name):
        raise SpecError(f"{where}.name {name!r} must be a SQL identifier (letters, digits, _), it names a view")
    kind = _one_of(raw, ("kafka", "files", "mongodb"), where)
    body, at = _obj(raw[kind], f"{where}.{kind}"), f"{where}.{kind}"
    source: Source
    if kind == "kafka":
        topics = body.get("topics")
        if not isinstance(topics, list) or not topics or not all(isinstance(t, str) and t for t in topics):
            raise SpecError(f"{at}.topics must be a non-empty list of topic names")
        offsets, start_ms = _opt_str(body, "startingOffsets", at) or "earliest", None
        if "startFrom" in body:
            try:
                start = StartFrom.parse(body["startFrom"], f"{where}.startFrom", ("earliest", "latest"))
                start.check(int(time.time() * 1000), f"{where}.startFrom")
            except StartFromError as exc:
                raise SpecError(str(exc)) from None
            offsets, start_ms = start.position or "earliest", start.timestamp_ms
        avro_ref = _parse_avro(body.get("avro"), f"{at}.avro")
        if avro_ref is not None and body.get("schema") is not None:
            raise SpecError(f"{at}: avro values carry their own schema; leave schema out")
        producer = body.get("producer")
        if producer is not None and not (isinstance(producer, dict) and {"kind", "name", "namespace"} <= set(producer)):
            raise SpecError(f"{at}.producer must have kind, name and namespace")
        source = KafkaSource(
            tuple(topics),
            _opt_str(body, "schema", at),
            offsets,
            start_ms,
            avro_ref,
            lineage.Producer.from_dict(producer),
        )
    elif kind == "files":
        options = _str_map(body.get("options"), f"{at}.options")
        source = FilesSource(
            _req_str(body, "path", at), _req_str(body, "format", at), options, _opt_str(body, "schema", at)
        )
    else:
        uri_env, database = _req_str(body, "uriEnv", at), _req_str(body, "database", at)
        source = MongoSource(uri_env, database, _req_str(body, "collection", at), _opt_str(body, "schema", at))
    return Input(name, source)


def _parse_output(raw: Any) -> Sink | None:
    if raw is None:
        return None
    kind = _one_of(_obj(raw, "spec.output"), ("kafka", "files", "mongodb"), "spec.output")
    body, at = _obj(raw[kind], f"spec.output.{kind}"), f"spec.output.{kind}"
    if kind == "kafka":
        avro_ref = _parse_avro(body.get("avro"), f"{at}.avro")
        return KafkaSink(_req_str(body, "topic", at), _opt_str(body, "keyColumn", at), avro_ref)
    if kind == "files":
        mode = _opt_str(body, "mode", at)
        if mode is not None and mode not in SAVE_MODES:
            raise SpecError(f"{at}.mode must be one of {', '.join(SAVE_MODES)}, not {mode!r}")
        options = _str_map(body.get("options"), f"{at}.options")
        return FilesSink(_req_str(body, "path", at), _req_str(body, "format", at), mode, options)
    uri_env, database = _req_str(body, "uriEnv", at), _req_str(body, "database", at)
    return MongoSink(uri_env, database, _req_str(body, "collection", at), _opt_str(body, "idColumn", at))


def _parse_lineage(raw: Any) -> lineage.Settings | None:
    if raw is None:
        return None
    body = _obj(raw, "spec.lineage")
    for key in ("topic", "bootstrapServers", "namespace", "job", "runId"):
        _req_str(body, key, "spec.lineage")
    return lineage.Settings.from_dict(body)


def _parse_avro(raw: Any, where: str) -> AvroRef | None:
    if raw is None:
        return None
    body = _obj(raw, where)
    return AvroRef(
        _req_str(body, "registryUrl", where), _req_str(body, "subject", where), _opt_str(body, "readerSchema", where)
    )


def split_entrypoint(entrypoint: str) -> tuple[str, str]:
    module, sep, function = entrypoint.partition(":")
    if not sep or not module or not function:
        raise SpecError(f"spec.entrypoint must look like package.module:function, not {entrypoint!r}")
    return module, function
