"""Fibers: data pipelines (Kafka Connect, PySpark, Databus-style CDC) as Kubernetes resources."""

__version__ = "0.2.0"
