"""Building a SparkSession that can read and write Kafka without any download at run time.

The spark-sql-kafka jars are fetched ahead of time (the stack's cache, or the job image) and named
by FIBERS_SPARK_KAFKA_JARS; their version must equal the installed pyspark's.
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


def session(
    app: str, *, master: str = "local[2]", conf: dict[str, str] | None = None, jars_dir: Path | None = None
) -> SparkSession:
    from pyspark.sql import SparkSession

    if jars_dir is None and os.environ.get("FIBERS_SPARK_KAFKA_JARS"):
        jars_dir = Path(os.environ["FIBERS_SPARK_KAFKA_JARS"])
    builder = (
        SparkSession.builder.appName(app)
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
    )
    if jars_dir is not None:  # without them Spark works, only the kafka format is missing
        builder = builder.config("spark.jars", ",".join(str(j) for j in kafka_jars(jars_dir)))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
