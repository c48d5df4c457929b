"""No silent dependencies: a Transform that no Spark Operator will run says so in its Ready condition.

Two ways a user meets this: a cluster without the SparkApplication CRD (no Spark Operator installed
at all: a second, bare control plane here, real etcd and kube-apiserver with Fibers' CRDs only), and a
namespace the Spark Operator does not watch (the stack's real Spark Operator watches namespaces by
label; this module's namespace lacks it).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client import ApiClient

from fibers.transform import runs
from fibers_stack import StackInfo, namespaces, process
from fibers_stack import crds as fibers_crds
from fibers_stack import kube as stack_kube
from fibers_stack.launcher import Launcher
from tests.helpers import Resources
from tests.integration.conftest import OperatorProcess

SPEC = {
    "inputs": [{"name": "orders", "kafka": {"topics": ["orders"], "schema": "id INT"}}],
    "sql": "SELECT id FROM orders",
    "output": {"kafka": {"topic": "orders-out"}},
}


@pytest.fixture(scope="module")
def namespace(kube: ApiClient, crds: None) -> Iterator[str]:
    """A namespace with the jobs RBAC but without the label the Spark Operator watches for."""
    name = f"test-{uuid.uuid4().hex[:6]}"
    namespaces.create(kube, name, spark_jobs=False)
    yield name
    client.CoreV1Api(kube).delete_namespace(name)


def test_a_namespace_the_spark_operator_does_not_watch_is_named_in_ready(transforms: Resources, namespace: str) -> None:
    transforms.create("unwatched", SPEC)
    transforms.wait_condition("unwatched", "False", "Submitted", timeout=60)  # the SparkApplication exists
    seconds = runs.UNTOUCHED_AFTER.total_seconds()
    cond = transforms.wait_condition("unwatched", "False", runs.NOT_TAKEN_UP, timeout=seconds + 30)
    assert f"namespace {namespace}" in cond["message"] and "spark.jobNamespaces" in cond["message"]
    assert transforms.condition("unwatched", "Stalled")["status"] == "True"  # Argo CD: Degraded


@pytest.fixture(scope="module")
def bare_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second control plane with Fibers' CRDs and nothing else: no Spark Operator, no SparkApplication CRD."""
    launcher = Launcher(tmp_path_factory.mktemp("bare-cluster"))
    try:
        kubeconfig = stack_kube.start(launcher)["kubeconfig"]
        api = config.new_client_from_config(config_file=kubeconfig)
        fibers_crds.apply(api)
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team")))
        api.close()
        yield kubeconfig
    finally:
        for pid in reversed(launcher.pids.values()):
            process.stop(pid)


def test_a_cluster_without_the_spark_operator_is_named_in_ready_and_logged_once(
    bare_cluster: str, stack_info: StackInfo, tmp_path: Path
) -> None:
    api = config.new_client_from_config(config_file=bare_cluster)
    transforms = Resources(api, "transforms", "team")
    log_file = tmp_path / "operator.log"
    op = OperatorProcess(stack_info, "team", log_file, {"KUBECONFIG": bare_cluster, "FIBERS_RESYNC_SECONDS": "5"})
    op.start()
    try:
        transforms.create("no-spark", SPEC)
        cond = transforms.wait_condition("no-spark", "False", runs.NO_SPARK_OPERATOR, timeout=60)
        assert "sparkapplications.sparkoperator.k8s.io" in cond["message"]
        assert transforms.condition("no-spark", "Stalled")["status"] == "True"
        time.sleep(40)  # a minute of retries (every 30 s) and resyncs (every 5 s here)
        assert transforms.condition("no-spark", "Ready")["reason"] == runs.NO_SPARK_OPERATOR
        # The watch of SparkApplications keeps failing with 404: one line when it starts, not one a retry.
        lines = [line for line in op.log().splitlines() if re.search("sparkapplications", line, re.I)]
        assert 1 <= len(lines) <= 3, lines
    finally:
        op.stop()
        api.close()
