"""The Transform kind: PySpark jobs run as Spark Operator SparkApplications."""
