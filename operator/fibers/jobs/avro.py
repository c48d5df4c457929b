"""Avro in the schema registry's wire format, for the Transform job's Kafka inputs and output (spark-avro).

Inputs: every record says which schema wrote it (magic byte 0, a 4-byte schema id, then Avro). Each
known writer schema gets its own `from_avro`, told to resolve to one reader schema (spark-avro's
`avroSchema` option), so records written before and after a compatible change land in the same
columns. The known writers are the subject's versions at start, plus, in batch mode, any other id
the records carry (fetched by id). Outputs: `to_avro` with the schema registered under the subject,
framed the same way.
"""

from __future__ import annotations

import json
import logging

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro, to_avro

from fibers.jobs.spec import AvroRef
from fibers.wire import HEADER, MAGIC, Registry

log = logging.getLogger("fibers.jobs.avro")


def schema_id(value: str = "value") -> Column:
    """The writer schema's id from the frame's bytes 2-5 (big-endian)."""
    return F.conv(F.hex(F.substring(F.col(value), 2, 4)), 16, 10).cast("long")


def _framed(value: str = "value") -> Column:
    """The record starts with the wire format's magic byte."""
    return F.substring(F.col(value), 1, 1) == F.lit(bytes([MAGIC]))


def _body(value: str = "value") -> Column:
    return F.expr(f"substring({value}, {HEADER.size + 1}, length({value}) - {HEADER.size})")


def decode(raw: DataFrame, ref: AvroRef, *, streaming: bool) -> DataFrame:
    """Kafka rows → the Avro values' fields. Tombstones (null values) carry none and are dropped."""
    registry = Registry(ref.registry_url)
    try:
        writers, latest = registry.subject_schemas(ref.subject)
        reader = ref.schema or latest
        if not streaming:  # ids the subject does not list (another subject, a deleted version): by id
            ids = raw.where(F.col("value").isNotNull() & _framed()).select(schema_id().alias("id")).distinct()
            for row in ids.collect():
                if row["id"] is not None and int(row["id"]) not in writers:
                    writers[int(row["id"])] = registry.schema_text(int(row["id"]))
    finally:
        registry.close()
    log.info("avro input", extra={"subject": ref.subject, "writer_schemas": sorted(writers)})
    options = {"avroSchema": reader, "mode": "FAILFAST"}
    framed = _framed()
    by_id: Column | None = None
    for i, text in sorted(writers.items()):
        branch = from_avro(_body(), text, options)
        by_id = F.when(schema_id() == i, branch) if by_id is None else by_id.when(schema_id() == i, branch)
    assert by_id is not None  # subject_schemas raises for a subject without versions
    # Nothing is dropped in silence: a record the job cannot decode fails the run, saying why.
    where = F.concat(F.lit("a record of "), F.col("topic"), F.lit(" at offset "), F.col("offset").cast("string"))
    unknown = F.raise_error(
        F.concat(
            where,
            F.lit(" was written with schema id "),
            schema_id().cast("string"),
            F.lit(f", which subject {ref.subject} did not list when the run started: run it again"),
        )
    )
    not_framed = F.raise_error(F.concat(where, F.lit(" is not in the schema registry's wire format (magic byte 0)")))
    decoded = F.when(~framed, not_framed).otherwise(by_id.otherwise(unknown))
    return raw.where(F.col("value").isNotNull()).select(decoded.alias("parsed")).select("parsed.*")


def value(frame: DataFrame, row: Column, ref: AvroRef, record_name: str) -> Column:
    """The framed Avro value of each row (`row`: the frame's columns as one struct); the schema registered first."""
    registry = Registry(ref.registry_url)
    try:
        text = ref.schema or avro_schema_of(frame, row, record_name)
        writer_id = registry.register(ref.subject, text)
    finally:
        registry.close()
    log.info("avro output", extra={"subject": ref.subject, "schema_id": writer_id})
    return F.concat(F.lit(HEADER.pack(MAGIC, writer_id)), to_avro(row, text))


def avro_schema_of(frame: DataFrame, row: Column, record_name: str) -> str:
    """The Avro schema spark-avro writes `row` with (its own conversion of the Spark types)."""
    jvm = frame.sparkSession._jvm
    if jvm is None:
        raise RuntimeError("spark-avro's schema conversion needs a classic (JVM) Spark session")
    struct = frame.select(row.alias("r")).schema["r"].dataType
    jtype = jvm.org.apache.spark.sql.types.DataType.fromJson(struct.json())
    schema = jvm.org.apache.spark.sql.avro.SchemaConverters.toAvroType(jtype, False, record_name, "fibers")
    return json.dumps(json.loads(str(schema.toString())))
