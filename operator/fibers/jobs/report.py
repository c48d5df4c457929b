"""What a Transform run tells the operator and OpenLineage: its result or its error, and its datasets.

The Spark Operator only sees the driver's exit code, so the run writes a ConfigMap the operator reads:
the counts of a finished run, or Spark's own message for a failed one (an error class such as
TABLE_OR_VIEW_NOT_FOUND says more than exit code 1). A finished run also prints its result as the last
stdout line. With lineage on, the run names the datasets it read and wrote, with row counts.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from typing import Any, cast

from pyspark.errors import PySparkException

from fibers import kubeapi, lineage
from fibers.jobs.spec import FilesSink, FilesSource, JobSpec, result_labels, written_for
from fibers.redact import truncate

log = logging.getLogger("fibers.jobs.report")

ERROR_LIMIT = 8192  # characters of an error kept in the result ConfigMap (Java stack traces run long)


@dataclass(frozen=True)
class JobResult:
    records_out: int
    streamed_back: int | None
    seconds: float
    rows_in: dict[str, int] | None = None  # per input (batch runs that report lineage)
    offsets: list[dict[str, Any]] | None = None  # Kafka read: {topic, partition, first, last} each

    def to_dict(self) -> dict[str, int | float | None]:
        return {"recordsOut": self.records_out, "streamedBack": self.streamed_back, "seconds": round(self.seconds, 3)}


def publish(spec: JobSpec, result: JobResult) -> None:
    """The result for the operator: in the ConfigMap when named, and always as the last stdout line."""
    if spec.result_config_map:
        write_result_config_map(cast(str, spec.namespace), spec.result_config_map, spec.name, result)
    print(f"FIBERS_RESULT {json.dumps(result.to_dict())}", flush=True)


@functools.cache
def kube_api() -> kubeapi.Api:
    """The driver's API client (its service account), made once per process."""
    return kubeapi.Api()


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
    """Create the ConfigMap, or replace one a run of this Transform wrote (the one read: its resourceVersion);
    one of that name that is someone else's is never written over."""
    try:
        api = kube_api()
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": result_labels(transform_name)}
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
        try:
            api.create(kubeapi.path("v1", "configmaps", namespace), body, timeout=10)
        except kubeapi.ApiError as exc:
            if exc.status != 409:
                raise
            url = kubeapi.path("v1", "configmaps", namespace, name)
            existing = api.get(url)
            if not written_for(existing, transform_name):
                log.warning(
                    "result ConfigMap not written: one of its name is not this Transform's",
                    extra={"configmap": f"{namespace}/{name}"},
                )
                return False
            meta["resourceVersion"] = existing["metadata"]["resourceVersion"]
            api.replace(url, body, timeout=10)
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


def lineage_datasets(
    spec: JobSpec, result: JobResult | None
) -> tuple[list[lineage.DatasetRef], list[lineage.DatasetRef]]:
    """What the run reads and writes, as OpenLineage datasets; with row counts once it has run."""
    bootstrap = spec.bootstrap_servers or ""
    rows_in = (result.rows_in if result else None) or {}
    inputs = [ref for item in spec.inputs for ref in item.source.datasets(bootstrap, rows_in.get(item.name))]
    outputs = spec.output.datasets(bootstrap, result.records_out if result else None) if spec.output else []
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
