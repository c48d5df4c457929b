"""Namespaces that run pipelines the way a user's do, for tests and benchmarks.

The Spark Operator watches a namespace by label, and the pods Fibers starts there (Spark drivers and
executors, DatabusConsumer pods) run as the chart's jobs ServiceAccount, with the chart's own RBAC,
rendered from charts/fibers so that it is exactly what a user installs.
"""

from __future__ import annotations

import subprocess
from typing import Any

import yaml
from kubernetes import client, utils

from fibers_stack import fetch, spark_operator
from fibers_stack.layout import REPO_ROOT

JOBS_SERVICE_ACCOUNT = "fibers-job"  # the chart's default jobs.serviceAccount.name (Spark drivers)
CONSUMER_SERVICE_ACCOUNT = "fibers-consumer"  # the chart's default jobs.consumerServiceAccount.name


def jobs_rbac(namespace: str) -> list[dict[str, Any]]:
    """The chart's ServiceAccount, Role and RoleBinding for the pods Fibers starts in a namespace."""
    out = subprocess.run(
        [
            str(fetch.helm()),
            "template",
            "fibers",
            str(REPO_ROOT / "charts" / "fibers"),
            "--namespace",
            namespace,
            "--set",
            f"watch.namespaces={{{namespace}}}",
            "--show-only",
            "templates/jobs-rbac.yaml",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def create(api: client.ApiClient, name: str, *, spark_jobs: bool = True) -> None:
    """A namespace with the chart's jobs RBAC; `spark_jobs` lets the Spark Operator run its applications."""
    labels = {spark_operator.JOB_NAMESPACE_LABEL: "enabled"} if spark_jobs else None
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
    for doc in jobs_rbac(name):
        utils.create_from_dict(api, doc)
