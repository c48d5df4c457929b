"""The Spark driver program of a Transform: read the inputs, run the SQL (or entrypoint), write the result.

Run as ``python -m fibers.jobs.transform --spec '<json>'`` with the spec the operator renders.

Exit codes: 0 the batch finished, or a streaming query was stopped by SIGTERM/SIGINT; 1 the job failed
(``fibers-transform: error: <Spark's message>`` on stderr); 2 the spec cannot be run (the message says
which field to fix). A run that ends with 0 prints ``FIBERS_RESULT {...}`` as its last stdout line, and
also writes it to the result ConfigMap when the spec names one; a failed run writes its error message
there instead (key ``error``), so the operator can show Spark's words rather than an exit code.

This module is the entry point and the run itself, batch or streaming. Reading the inputs is
`fibers.jobs.inputs`, writing the result `fibers.jobs.outputs`, and what the run reports (the result
ConfigMap, error messages, lineage) `fibers.jobs.report`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import FrameType
from typing import Any, cast

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from fibers import lineage, logs, termination
from fibers.jobs import progress
from fibers.jobs.inputs import build_views, input_statistics, pin_kafka_reads
from fibers.jobs.outputs import ProgressListener, RowCounter, start_query, stop_query, write_outputs
from fibers.jobs.report import (
    JobResult,
    error_message,
    ingestion,
    lineage_datasets,
    publish,
    write_error_config_map,
)
from fibers.jobs.spec import METRICS_PORT_ENV, JobSpec, SpecError, split_entrypoint
from fibers.redact import redact
from fibers.spark import session

log = logging.getLogger("fibers.jobs.transform")

Entrypoint = Callable[[SparkSession, dict[str, DataFrame]], object]


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


# --- running -------------------------------------------------------------------------------------


def run(spark: SparkSession, spec: JobSpec) -> JobResult:
    """One batch: the SQL over the inputs, written to the sinks, which count the rows as they write them."""
    started = time.monotonic()
    reads = pin_kafka_reads(spec)
    views = build_views(spark, spec, reads)
    records, streamed_back = write_outputs(spec, transform(spark, spec, views))
    rows_in, offsets = input_statistics(spark, spec, views, reads) if spec.lineage else (None, None)
    return JobResult(records, streamed_back, time.monotonic() - started, rows_in, offsets)


def run_streaming(spark: SparkSession, spec: JobSpec, stop: threading.Event, poll_seconds: int = 1) -> JobResult:
    """Run the query until `stop` is set (main sets it on SIGTERM/SIGINT); a failed query raises.

    recordsOut counts the rows the sink reports writing in this run (for sinks that do not report it,
    such as files, the rows read instead).
    """
    started = time.monotonic()
    result = transform(spark, spec, build_views(spark, spec))
    if not result.isStreaming:
        raise TypeError("the transformation does not read any stream; use mode batch for this spec")
    metrics = None
    if port := os.environ.get(METRICS_PORT_ENV):  # the operator names the driver's metrics port
        metrics = progress.StreamingMetrics(spec.name)
        metrics.serve(int(port))
    counter = RowCounter(metrics.observe if metrics else None)
    listener = ProgressListener(spec.run, counter)
    spark.streams.addListener(listener)
    try:
        query = start_query(spec, result)
        log.info("streaming query started", extra={"query": query.name, "checkpoint": spec.checkpoint_location})
        try:
            while not stop.is_set():
                if query.awaitTermination(poll_seconds):  # raises StreamingQueryException if the query failed
                    break
        finally:
            stop_query(query)
        counter.add(query.recentProgress)  # what the listener bus had not delivered when the query stopped
    finally:
        spark.streams.removeListener(listener)
    log.info("streaming query stopped", extra={"query": query.name, "records": counter.rows})
    return JobResult(counter.rows, None, time.monotonic() - started)


# --- main ----------------------------------------------------------------------------------------


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


if __name__ == "__main__":
    raise SystemExit(main())
