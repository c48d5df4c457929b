"""Building a SparkSession that can read and write Kafka without any download at run time.

The spark-sql-kafka jars are fetched ahead of time (the stack's cache, or the job image) and named
by FIBERS_SPARK_KAFKA_JARS; their version must equal the installed pyspark's. In a driver pod (under
spark-submit) they come from the class path the SparkApplication configures instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def kafka_jars(jars_dir: Path) -> list[Path]:
    import pyspark

    jars = sorted(jars_dir.glob("*.jar"))
    connector = [j for j in jars if j.name.startswith("spark-sql-kafka")]
    if not connector:
        raise RuntimeError(f"no spark-sql-kafka jar in {jars_dir}")
    if not connector[0].name.endswith(f"-{pyspark.__version__}.jar"):
        raise RuntimeError(f"{connector[0].name} does not match pyspark {pyspark.__version__}")
    return jars


def under_spark_submit() -> bool:
    """Whether this Python runs inside spark-submit (a driver pod): its JVM and configuration exist already.

    pyspark itself connects to that JVM instead of starting one when PYSPARK_GATEWAY_PORT is set.
    """
    return "PYSPARK_GATEWAY_PORT" in os.environ


def session(
    app: str, *, master: str | None = None, conf: dict[str, str] | None = None, jars_dir: Path | None = None
) -> SparkSession:
    """A session; `master` only when given, so spark-submit's (k8s://… in a driver pod) is never overridden.

    Without a master and outside spark-submit, pyspark runs Spark locally (local[*]).
    """
    from pyspark.sql import SparkSession

    if jars_dir is None and os.environ.get("FIBERS_SPARK_KAFKA_JARS") and not under_spark_submit():
        # Under spark-submit the jars must already be on the JVM's class path (the SparkApplication
        # sets spark.driver/executor.extraClassPath): spark.jars set now would not reach the driver's.
        jars_dir = Path(os.environ["FIBERS_SPARK_KAFKA_JARS"])
    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    builder = builder.config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
    if jars_dir is not None:  # without them Spark works, only the kafka format is missing
        builder = builder.config("spark.jars", ",".join(str(j) for j in kafka_jars(jars_dir)))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
